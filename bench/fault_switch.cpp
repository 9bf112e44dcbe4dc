// What the fault catalog's fault points (harness/base/fault.h) cost when no fault is set, side
// by side in one run:
//   check:    ns per fault::active() call with MIH_FAULT unset (a relaxed atomic load and a
//             compare), against the same loop reading a plain local atomic (the floor);
//   step:     the median wall time of a Trainer step of the llama spec on one rank;
//   overhead: checks per step x ns per check, as a fraction of the step.
// A llama step evaluates about 50 fault points (counted in the source): F05, F17, F22 once in
// the Trainer; F08 per row-parallel layer (2 per decoder layer) and F21 per attention in the
// forward; F06 in the loss; F03 once and F04 per parameter (19) in each of the two grad-norm
// computations (clipping and the post-clip norm). The constructor's points (F01, F02, F09, F15,
// F16) run once per model.
// Usage: build/bin/mih_bench_fault_switch [--checks N] [--steps N] [--json FILE]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "harness/base/fault.h"
#include "harness/base/files.h"
#include "harness/spec/model_spec.h"
#include "harness/training/trainer.h"
#include "tests/support/thread_ranks.h"

namespace {

using Clock = std::chrono::steady_clock;

double ns_per_iteration(int64_t n, Clock::time_point start) {
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Cost of the fault points when no fault is set (see the file comment)."};
  int64_t checks = 200000000;
  int steps = 12;
  int checks_per_step = 50;
  std::string json_out;
  app.add_option("--checks", checks, "fault::active() calls to time")->capture_default_str();
  app.add_option("--steps", steps, "llama steps to time (the first is a warm-up)")->capture_default_str();
  app.add_option("--checks-per-step", checks_per_step, "fault points a llama step evaluates")->capture_default_str();
  app.add_option("--json", json_out, "write the figures here");
  CLI11_PARSE(app, argc, argv);
  ::unsetenv("MIH_FAULT");

  // The fault check, and the floor: the same loop over a local atomic.
  volatile int64_t sink = 0;
  std::atomic<int> local{0};
  double check_ns = 1e30, floor_ns = 1e30;
  for (int round = 0; round < 3; ++round) {
    auto t = Clock::now();
    int64_t hits = 0;
    for (int64_t i = 0; i < checks; ++i) hits += mih::fault::active(mih::fault::Fault::kF03);
    sink = sink + hits;
    check_ns = std::min(check_ns, ns_per_iteration(checks, t));
    t = Clock::now();
    hits = 0;
    for (int64_t i = 0; i < checks; ++i) hits += local.load(std::memory_order_relaxed) == 3;
    sink = sink + hits;
    floor_ns = std::min(floor_ns, ns_per_iteration(checks, t));
  }

  // A training step of the llama spec on one rank.
  std::vector<double> times;
  const mih::spec::ModelSpec s = mih::spec::SpecRegistry::instance().get("llama");
  auto errors = mih::testing::run_mesh(mih::ParallelConfig{}, [&](mih::DeviceMesh& mesh) {
    mih::ParallelConfig c;
    mih::Trainer t(mesh, c, s.factory, s.data.make_batches(), s.data.apply_sharding(mih::TrainerOptions()));
    for (int step = 0; step < steps; ++step) {
      const auto start = Clock::now();
      t.step();
      if (step > 0) times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
  });
  for (const auto& e : errors) std::fprintf(stderr, "%s\n", e.c_str());
  std::sort(times.begin(), times.end());
  const double step_ms = times.empty() ? 0 : times[times.size() / 2];
  const double overhead = step_ms > 0 ? checks_per_step * check_ns * 1e-6 / step_ms : 0;
  std::printf("fault::active() with no fault set: %.3f ns per call (a local relaxed atomic load: %.3f ns)\n", check_ns,
              floor_ns);
  std::printf("llama step on one rank: %.2f ms (median of %zu); %d fault points per step cost %.1f ns = %.2e of a step\n",
              step_ms, times.size(), checks_per_step, checks_per_step * check_ns, overhead);
  if (!json_out.empty()) {
    mih::write_file_atomic(json_out, nlohmann::json({{"check_ns", check_ns},
                                                     {"floor_ns", floor_ns},
                                                     {"step_ms", step_ms},
                                                     {"checks_per_step", checks_per_step},
                                                     {"overhead_fraction", overhead}})
                                         .dump(2));
  }
  return sink == -1 ? 1 : 0;
}
