// Latency of small collectives through mih's Communicator (ledger on and off) against the
// raw compat call, on N local ranks: where the time of a collective goes. Usage:
//   build/bin/mih_bench_collectives [-n RANKS] [--iterations N] [--numel N]
// Prints, per op, the median microseconds of the slowest rank. Compare with the same loop
// in PyTorch: bench/collective_latency.py.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "harness/base/files.h"
#include "harness/runtime/launcher.h"
#include "harness/runtime/worker.h"

namespace {

using Clock = std::chrono::steady_clock;

double median_us(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

MIH_WORKER_TASK(bench_latency, "times back-to-back small collectives",
                {"iterations", "timed calls per op", "200"}, {"numel", "elements per tensor", "256"}) {
  const int64_t iterations = ctx.int_option("iterations"), numel = ctx.int_option("numel");
  mih::ParallelConfig dims;
  dims.dp_shard = ctx.world().world_size;
  mih::DeviceMesh mesh = ctx.build_mesh(dims);
  mih::Communicator& world = mesh.comm(mih::MeshAxis::kWorld);
  mih::Communicator bare(world.axis(), world.group(), nullptr);  // no ledger
  at::Tensor t = at::ones({numel});
  at::Tensor out = at::empty({numel * world.size()});
  nlohmann::json result;
  auto time = [&](const std::string& name, auto&& op) {
    for (int i = 0; i < 10; ++i) op();
    world.barrier();
    std::vector<double> us;
    for (int64_t i = 0; i < iterations; ++i) {
      auto t0 = Clock::now();
      op();
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    result[name] = median_us(us);
  };
  time("all_reduce (compat)", [&] { mih::compat::all_reduce(world.group(), t, mih::ReduceOp::kSum); });
  time("all_reduce (no ledger)", [&] { bare.all_reduce(t); });
  time("all_reduce (ledger)", [&] { world.all_reduce(t); });
  time("broadcast (ledger)", [&] { world.broadcast(t, 0); });
  time("all_gather (ledger)", [&] { world.all_gather_into_tensor(out, t); });
  time("barrier (ledger)", [&] { world.barrier(); });
  mih::write_file_atomic(ctx.run_dir() / ("latency_rank" + std::to_string(ctx.world().rank) + ".json"), result.dump());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "worker") return mih::worker_main(argc - 1, argv + 1);
  int ranks = 2;
  std::string iterations = "200", numel = "256";
  CLI::App app{"Latency of small collectives through mih's Communicator", "mih_bench_collectives"};
  app.add_option("-n", ranks, "ranks");
  app.add_option("--iterations", iterations, "timed calls per op");
  app.add_option("--numel", numel, "elements per tensor");
  CLI11_PARSE(app, argc, argv);
  mih::WorkerOptions w;
  w.run_dir = std::filesystem::temp_directory_path() / ("mih_bench_collectives_" + std::to_string(::getpid()));
  w.gloo_hostname = "127.0.0.1";
  mih::LaunchOptions o;
  o.world_size = ranks;
  o.run_dir = w.run_dir;
  o.command = mih::worker_command("bench_latency", w, {"--iterations", iterations, "--numel", numel});
  mih::LaunchResult r = mih::launch(o);
  if (!r.ok()) {
    std::fprintf(stderr, "%s", r.report().c_str());
    return 1;
  }
  nlohmann::json slowest = nlohmann::json::object();
  for (int rank = 0; rank < ranks; ++rank) {
    std::string text;
    mih::read_file(w.run_dir / ("latency_rank" + std::to_string(rank) + ".json"), &text);
    const nlohmann::json latencies = nlohmann::json::parse(text);
    for (auto& [op, us] : latencies.items()) {
      slowest[op] = std::max(slowest.value(op, 0.0), us.get<double>());
    }
  }
  std::printf("%d ranks, %s elements (float32), median of %s calls, slowest rank:\n", ranks, numel.c_str(),
              iterations.c_str());
  for (auto& [op, us] : slowest.items()) std::printf("  %-24s %8.1f us\n", op.c_str(), us.get<double>());
  std::filesystem::remove_all(w.run_dir);
  return 0;
}
