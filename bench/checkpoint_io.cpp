// Save and load time and size of a resharding checkpoint (harness/checkpoint) against plain
// torch::save / torch::load of the same tensors gathered to full size on rank 0, side by
// side in one run. The block is the step bench's tiny transformer (hidden 256, 4 layers,
// vocab 2048, float32) after one AdamW step, on 2 ranks with dp_shard=2 (real processes):
// the checkpoint holds every parameter and both AdamW moments.
// Usage: build/bin/mih_bench_checkpoint [--repeats N] [--hidden H] [--layers L] [--dir D]
//
// Timed: mih save (every rank writes its file, rank 0 the index), mih load into a fresh
// trainer of the same config (read, check, copy), and for the baseline, on rank 0 only,
// torch::save of the gathered tensors and torch::load of that file (the gather itself is
// not timed), also with an fsync as mih's writes have. Medians of N repeats; sizes in bytes.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/serialize.h>

#include "harness/base/files.h"
#include "harness/runtime/launcher.h"
#include "harness/runtime/worker.h"
#include "tests/parallel/tiny_block.h"

namespace {

namespace fs = std::filesystem;

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

uintmax_t dir_bytes(const fs::path& dir) {
  uintmax_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.is_regular_file() ? e.file_size() : 0;
  return n;
}

MIH_WORKER_TASK(bench_checkpoint, "saves and loads checkpoints of the tiny block", {"repeats", "", "3"},
                {"hidden", "", "256"}, {"layers", "", "4"}, {"dir", "checkpoint folder", ""}) {
  mih::ParallelConfig dims;
  dims.dp_shard = 2;
  mih::DeviceMesh mesh = ctx.build_mesh(dims);
  mih::ParallelConfig config;
  config.dp_shard = 2;
  mih::testing::TinyBlockOptions model;
  model.hidden = ctx.int_option("hidden");
  model.heads = 8;
  model.kv_heads = 8;
  model.ffn = 2 * model.hidden;
  model.layers = ctx.int_option("layers");
  model.vocab = 2048;
  auto make = [&] {
    return std::make_unique<mih::Trainer>(mesh, config, mih::testing::tiny_block_factory(model),
                                          mih::testing::tiny_batches(8, 32, model.vocab), mih::TrainerOptions());
  };
  auto trainer = make();
  trainer->step();
  const fs::path dir = ctx.option("dir");
  mih::Communicator& world = mesh.comm(mih::MeshAxis::kWorld);
  std::vector<double> save_ms, load_ms, torch_save_ms, torch_fsync_ms, torch_load_ms;
  uintmax_t mih_bytes = 0, torch_bytes = 0;
  for (int64_t i = 0; i < ctx.int_option("repeats"); ++i) {
    world.barrier();
    double t0 = now_ms();
    trainer->save(dir / "mih");
    world.barrier();
    save_ms.push_back(now_ms() - t0);
    auto fresh = make();
    world.barrier();
    t0 = now_ms();
    fresh->load(dir / "mih");
    world.barrier();
    load_ms.push_back(now_ms() - t0);

    // Baseline: the same tensors, gathered to full size, in one torch::save archive.
    std::vector<at::Tensor> full;
    for (const auto& p : trainer->context().parameters()) {
      full.push_back(trainer->gather_full(*p));
      full.push_back(trainer->gather_full(*p, "exp_avg"));
      full.push_back(trainer->gather_full(*p, "exp_avg_sq"));
    }
    if (mesh.rank() == 0) {
      t0 = now_ms();
      torch::save(full, (dir / "torch.pt").string());
      torch_save_ms.push_back(now_ms() - t0);
      // mih's files are fsynced before the rename (durable on return); so is this, timed apart.
      t0 = now_ms();
      const int fd = ::open((dir / "torch.pt").c_str(), O_RDONLY);
      ::fsync(fd);
      ::close(fd);
      torch_fsync_ms.push_back(now_ms() - t0 + torch_save_ms.back());
      std::vector<at::Tensor> back;
      t0 = now_ms();
      torch::load(back, (dir / "torch.pt").string());
      torch_load_ms.push_back(now_ms() - t0);
      torch_bytes = fs::file_size(dir / "torch.pt");
      mih_bytes = dir_bytes(dir / "mih");
    }
    world.barrier();
  }
  if (mesh.rank() == 0) {
    nlohmann::json out = {{"save_ms", median(save_ms)},        {"load_ms", median(load_ms)},
                          {"torch_save_ms", median(torch_save_ms)}, {"torch_load_ms", median(torch_load_ms)},
                          {"torch_save_fsync_ms", median(torch_fsync_ms)},
                          {"mih_bytes", mih_bytes},              {"torch_bytes", torch_bytes}};
    mih::write_file_atomic(ctx.run_dir() / "checkpoint_io.json", out.dump());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "worker") return mih::worker_main(argc - 1, argv + 1);
  std::string repeats = "3", hidden = "256", layers = "4";
  fs::path dir = fs::temp_directory_path() / ("mih_bench_checkpoint_" + std::to_string(::getpid()));
  CLI::App app{"Checkpoint save/load time and size: mih's resharding checkpoint vs torch::save of gathered tensors",
               "mih_bench_checkpoint"};
  app.add_option("--repeats", repeats, "timed repeats")->capture_default_str();
  app.add_option("--hidden", hidden, "hidden size")->capture_default_str();
  app.add_option("--layers", layers, "decoder layers")->capture_default_str();
  app.add_option("--dir", dir, "scratch folder (removed afterwards)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  mih::WorkerOptions w;
  w.run_dir = dir / "run";
  w.gloo_hostname = "127.0.0.1";
  mih::LaunchOptions o;
  o.world_size = 2;
  o.run_dir = w.run_dir;
  o.command = mih::worker_command("bench_checkpoint", w,
                                  {"--repeats", repeats, "--hidden", hidden, "--layers", layers, "--dir", dir.string()});
  mih::LaunchResult r = mih::launch(o);
  if (!r.ok()) {
    std::fprintf(stderr, "%s", r.report().c_str());
    return 1;
  }
  std::string text;
  mih::read_file(w.run_dir / "checkpoint_io.json", &text);
  fs::remove_all(dir);
  nlohmann::json j = nlohmann::json::parse(text);
  std::printf("tiny block: hidden %s, layers %s, vocab 2048, float32, params + AdamW moments, dp_shard=2 (2 processes); "
              "median of %s\n", hidden.c_str(), layers.c_str(), repeats.c_str());
  std::printf("  mih checkpoint:  save %8.1f ms  load %8.1f ms  %12llu bytes (2 safetensors files + index)\n",
              j["save_ms"].get<double>(), j["load_ms"].get<double>(), j["mih_bytes"].get<unsigned long long>());
  std::printf("  torch::save:     save %8.1f ms  load %8.1f ms  %12llu bytes (one archive of the gathered tensors)\n",
              j["torch_save_ms"].get<double>(), j["torch_load_ms"].get<double>(), j["torch_bytes"].get<unsigned long long>());
  std::printf("  torch::save + fsync: save %8.1f ms\n", j["torch_save_fsync_ms"].get<double>());
  std::printf("  ratios mih / torch: save %.2f (vs save + fsync %.2f), load %.2f, size %.3f\n",
              j["save_ms"].get<double>() / j["torch_save_ms"].get<double>(),
              j["save_ms"].get<double>() / j["torch_save_fsync_ms"].get<double>(),
              j["load_ms"].get<double>() / j["torch_load_ms"].get<double>(),
              double(j["mih_bytes"].get<unsigned long long>()) / double(j["torch_bytes"].get<unsigned long long>()));
  return 0;
}
