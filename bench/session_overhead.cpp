// What a validation session costs a training step, side by side in one run, on the largest
// reference model (by parameter count; --spec to choose):
//   plain:   a training loop with no session at all, written against the model and its
//            ParallelContext (forward, backward, gradient sync, clipping, AdamW), world size 1;
//   off:     the Trainer with make_session(off): the no-op hooks;
//   runtime: the Trainer with a runtime ValidationSession writing its evidence to a temp dir
//            (and, world size 1, keeping it in memory: the checks and probes without the I/O).
// off and runtime also run on 2 thread ranks with dp_shard=2. The Trainers of off and runtime
// (and in-memory) live side by side on one mesh and take their steps in turn, so load on the
// machine hits them within milliseconds of each other; rounds repeat that with fresh models.
// Each reports the median wall time of a step (the first step of each run is a warm-up and not
// counted). Every rank runs one intra-op thread, as a mih worker does.
// The runtime session probes activations (and the clipped gradients and optimizer state) at the
// first two steps of a run and the last: the second is in the median, the last is reported
// apart as "the step with activation probes".
// --vlm-hidden H (with --vlm-vision-hidden V) runs the vlm spec with a wider model: the
// language model's hidden size H (intermediate 2H), the vision tower's V; 224 and 112 give
// 1.42M parameters, 9.8x the shipped vlm's 145k.
// Usage: build/bin/mih_bench_session [--steps N] [--rounds R] [--spec NAME] [--json FILE]
//                                    [--vlm-hidden H --vlm-vision-hidden V]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/optim/adamw.h>

#include "harness/base/files.h"
#include "harness/runtime/determinism.h"
#include "harness/session/session.h"
#include "reference_models/vlm.h"
#include "tests/support/thread_ranks.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// The last runtime run's per-hook wall time of its second to last step (rank 0): a step
// without the activation probes, like the median one.
nlohmann::json last_session_ms;
// The wall time of the last step of each runtime run (rank 0): the step whose activations
// are probed.
std::map<std::string, std::vector<double>> probed_step_ms;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int64_t parameter_count(const mih::spec::ModelSpec& s) {
  int64_t n = 0;
  mih::testing::run_mesh(mih::ParallelConfig{}, [&](mih::DeviceMesh& mesh) {
    mih::ParallelContext ctx(mesh, {});
    auto model = s.factory(ctx);
    model->apply_fsdp(ctx);
    ctx.finalize(*model);
    for (const auto& p : ctx.parameters()) n += p->local.numel();
  });
  return n;
}

// The loop with no session: what Trainer::step does at world size 1, without its hooks.
std::vector<double> plain_steps(const mih::spec::ModelSpec& s, const mih::TrainerOptions& o, int steps) {
  std::vector<double> times;
  mih::testing::run_mesh(mih::ParallelConfig{}, [&](mih::DeviceMesh& mesh) {
    mih::ParallelContext ctx(mesh, mesh.config());
    auto model = s.factory(ctx);
    model->apply_fsdp(ctx);
    ctx.finalize(*model);
    std::vector<at::Tensor> params;
    for (const auto& p : ctx.parameters()) params.push_back(p->local);
    torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(o.lr()).weight_decay(o.weight_decay()));
    mih::BatchSource batches = s.data.make_batches();
    for (int step = 0; step < steps; ++step) {
      const auto start = Clock::now();
      mih::Batch b = batches(step);
      const int64_t seq = b.input_ids.size(1);
      if (!b.position_ids.defined()) b.position_ids = at::arange(seq, at::kLong).unsqueeze(0).expand(b.input_ids.sizes());
      const double valid = b.labels.ne(-100).sum().item<double>();
      ctx.shared_state().begin_forward();
      at::Tensor loss = model->token_losses(b).sum() / valid;
      loss.backward();
      ctx.synchronize_gradients();
      ctx.clip_grad_norm(o.max_grad_norm());
      ctx.grad_norm();
      optimizer.step();
      for (const auto& p : params) p.mutable_grad() = at::Tensor();
      (void)loss.item<double>();
      if (step > 0) times.push_back(ms_since(start));
    }
  });
  return times;
}

// One Trainer per variant on the same mesh, stepped in turn (variant 0's step k, variant 1's
// step k, ...): load on the machine hits every variant within milliseconds of each other.
struct Variant {
  std::string name;
  mih::SessionMode mode;
  fs::path evidence;  // empty: in memory
};

std::map<std::string, std::vector<double>> trainer_steps(const mih::spec::ModelSpec& s, const mih::TrainerOptions& o,
                                                         const std::vector<Variant>& variants, int dp_shard,
                                                         int steps) {
  std::map<std::string, std::vector<double>> times;
  mih::ParallelConfig c;
  c.dp_shard = dp_shard;
  const std::string world = "dp_shard" + std::to_string(dp_shard);
  auto errors = mih::testing::run_mesh(c, [&](mih::DeviceMesh& mesh) {
    std::vector<std::unique_ptr<mih::TrainingHooks>> hooks;
    std::vector<std::unique_ptr<mih::Trainer>> trainers;
    for (const Variant& v : variants) {
      mih::SessionOptions so;
      so.mode = v.mode;
      so.config = c;
      so.trainer = o;
      so.evidence_dir = v.evidence;
      so.last_step = steps - 1;
      hooks.push_back(mih::make_session(s, so, mesh));
      trainers.push_back(
          std::make_unique<mih::Trainer>(mesh, c, s.factory, s.data.make_batches(), o, hooks.back().get()));
    }
    for (int step = 0; step < steps; ++step) {
      for (size_t i = 0; i < variants.size(); ++i) {
        const auto start = Clock::now();
        trainers[i]->step();
        if (step > 0 && mesh.rank() == 0) times[variants[i].name].push_back(ms_since(start));
      }
    }
    for (size_t i = 0; i < variants.size(); ++i) {
      auto* session = dynamic_cast<mih::ValidationSession*>(hooks[i].get());
      if (session && mesh.rank() == 0 && !variants[i].evidence.empty()) {
        // A step between the fully probed ones (the second to last), as the median step is.
        const auto& perf = session->performance();
        last_session_ms = perf[perf.size() >= 2 ? perf.size() - 2 : 0]["session_ms"];
        probed_step_ms[world].push_back(times[variants[i].name].back());
        times[variants[i].name].pop_back();  // the probed step is reported apart
      }
    }
  });
  for (const auto& e : errors) std::fprintf(stderr, "%s\n", e.c_str());
  return times;
}

// Median wall time of one all-reduce of 64 doubles over the world on `world` thread ranks.
double world_all_reduce_ms(int world) {
  std::vector<double> times;
  mih::ParallelConfig c;
  c.dp_shard = world;
  mih::testing::run_mesh(c, [&](mih::DeviceMesh& mesh) {
    at::Tensor t = at::ones({64}, at::kDouble);
    for (int i = 0; i < 30; ++i) {
      const auto start = Clock::now();
      mesh.comm(mih::MeshAxis::kWorld).all_reduce(t);
      if (mesh.rank() == 0) times.push_back(ms_since(start));
    }
  });
  return median(times);
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 6, rounds = 3;
  std::string spec_name, json_out;
  CLI::App app{"Step time of the Trainer without a session, with a session off, and with a runtime session",
               "mih_bench_session"};
  app.add_option("--steps", steps, "steps per run (the first is a warm-up)")->capture_default_str();
  app.add_option("--rounds", rounds, "interleaved rounds of every variant")->capture_default_str();
  app.add_option("--spec", spec_name, "reference spec (default: the one with the most parameters)");
  app.add_option("--json", json_out, "also write the figures to this file");
  int64_t vlm_hidden = 0, vlm_vision_hidden = 0;
  app.add_option("--vlm-hidden", vlm_hidden, "run the vlm spec with this language-model hidden size (intermediate 2x)")
      ->check(CLI::PositiveNumber);
  app.add_option("--vlm-vision-hidden", vlm_vision_hidden, "and this vision hidden size (with --vlm-hidden)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if ((vlm_hidden > 0) != (vlm_vision_hidden > 0)) {
    std::fprintf(stderr, "mih_bench_session: give --vlm-hidden and --vlm-vision-hidden together\n");
    return 2;
  }

  // One intra-op thread, as a mih worker runs each rank (DeterminismOptions' default): two
  // thread ranks with a BLAS thread pool each on two cores measure contention, not the session.
  mih::apply_determinism(mih::DeterminismOptions{});
  auto& registry = mih::spec::SpecRegistry::instance();
  std::map<std::string, int64_t> counts;
  if (vlm_hidden > 0) spec_name = "vlm";
  for (const auto& name : registry.names()) counts[name] = parameter_count(registry.get(name));
  if (spec_name.empty()) {
    spec_name = std::max_element(counts.begin(), counts.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
  }
  mih::spec::ModelSpec s = registry.get(spec_name);
  if (vlm_hidden > 0) {
    // The shipped vlm spec (its data, checks and probes) with a wider model.
    const mih::models::VlmOptions shipped = mih::models::VlmOptions().image_size(16);
    s.factory = mih::models::make_vlm(mih::models::VlmOptions(shipped)
                                          .text(mih::models::LlamaOptions(shipped.text())
                                                    .hidden_size(vlm_hidden)
                                                    .intermediate_size(2 * vlm_hidden))
                                          .vision_hidden_size(vlm_vision_hidden));
    counts[spec_name] = parameter_count(s);
  }
  const mih::TrainerOptions o = s.data.apply_sharding(mih::TrainerOptions());
  const fs::path evidence = fs::temp_directory_path() / ("mih_bench_session_" + std::to_string(::getpid()));

  std::map<std::string, std::vector<double>> times;
  nlohmann::json j_hooks;
  for (int r = 0; r < rounds; ++r) {
    auto add = [&](const std::string& name, const std::vector<double>& t) {
      times[name].insert(times[name].end(), t.begin(), t.end());
    };
    add("plain_world1", plain_steps(s, o, steps));
    const std::string tag = std::to_string(r);
    for (auto& [name, t] : trainer_steps(s, o,
                                         {{"off_world1", mih::SessionMode::kOff, {}},
                                          {"runtime_world1", mih::SessionMode::kRuntime, evidence / ("rt1_" + tag)},
                                          {"runtime_in_memory_world1", mih::SessionMode::kRuntime, {}}},
                                         1, steps)) {
      add(name, t);
    }
    j_hooks["world1"] = last_session_ms;
    for (auto& [name, t] : trainer_steps(s, o,
                                         {{"off_dp_shard2", mih::SessionMode::kOff, {}},
                                          {"runtime_dp_shard2", mih::SessionMode::kRuntime, evidence / ("rt2_" + tag)}},
                                         2, steps)) {
      add(name, t);
    }
    j_hooks["dp_shard2"] = last_session_ms;
  }
  std::error_code ec;
  fs::remove_all(evidence, ec);

  nlohmann::json j = {{"spec", spec_name}, {"parameters", counts[spec_name]}, {"steps_per_run", steps}, {"rounds", rounds}};
  std::printf("spec %s (%lld parameters), float32, %d rounds x %d timed steps per variant; median ms/step\n",
              spec_name.c_str(), static_cast<long long>(counts[spec_name]), rounds, steps - 1);
  for (const auto& [name, t] : times) {
    j["median_ms"][name] = median(t);
    std::printf("  %-18s %9.2f ms\n", name.c_str(), median(t));
  }
  j["world_all_reduce_ms"] = {{"world1", world_all_reduce_ms(1)}, {"dp_shard2", world_all_reduce_ms(2)}};
  std::printf("  one world all-reduce (64 doubles): %s ms\n", j["world_all_reduce_ms"].dump().c_str());
  std::printf("  session ms per hook, second to last step of the last round: %s\n", j_hooks.dump().c_str());
  for (const auto& [world, t] : probed_step_ms) {
    j["runtime_probed_step_ms"][world] = median(t);
    std::printf("  runtime, the step with activation probes (%s): %.2f ms\n", world.c_str(), median(t));
  }
  j["session_ms_per_hook"] = j_hooks;
  auto ratio = [&](const char* a, const char* b) { return median(times[a]) / median(times[b]); };
  j["ratio_off_to_plain_world1"] = ratio("off_world1", "plain_world1");
  j["ratio_runtime_to_off_world1"] = ratio("runtime_world1", "off_world1");
  j["ratio_runtime_to_off_dp_shard2"] = ratio("runtime_dp_shard2", "off_dp_shard2");
  std::printf("  off / plain (world 1):         %.3f\n", j["ratio_off_to_plain_world1"].get<double>());
  std::printf("  runtime / off (world 1):       %.3f\n", j["ratio_runtime_to_off_world1"].get<double>());
  std::printf("  runtime / off (dp_shard=2):    %.3f\n", j["ratio_runtime_to_off_dp_shard2"].get<double>());
  if (!json_out.empty()) mih::write_file_atomic(json_out, j.dump(2));
  return 0;
}
