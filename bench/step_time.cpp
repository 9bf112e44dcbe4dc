// Step time of the Trainer on a small transformer (tests/parallel/tiny_block.h) at world size
// 1 and on 4 ranks with dp_shard=2 x tp=2, side by side in one run, and the bytes each mesh
// axis moved in one step (from the comm ledger) next to the count the configuration implies.
// Usage: build/bin/mih_bench_step [--steps N] [--hidden H] [--layers L] [--seq S] [--batch B]
//
// Expected bytes per step (micro-batches 1, no sequence parallel, element size e, B_l = B / dp
// local rows, N = B_l * S tokens, W = dp_shard, pieces per parameter from its shape):
//   tp:       forward: embedding all-reduce N*H, per layer attention-out and mlp-down
//             all-reduces 2*L*N*H, cross entropy max/sum/target all-reduces 3*N;
//             backward: the input gradient of every column-parallel layer (q, kv, gate_up
//             per layer, the head) all-reduced (3L + 1)*N*H.             => ((5L + 2)*N*H + 3N) * e
//   dp_shard: every FSDP parameter p with chunk_p = ceil(rows_p / W) rows of c_p elements:
//             all-gather in forward (again in backward for decoder-layer units) chunk_p*c_p,
//             reduce-scatter in backward W*chunk_p*c_p.                   => sum over p, * e
//   dp_cp:    valid-token count and loss all-reduces: 8 + 8 bytes.
//   world:    global grad norm before and after clipping: 8 + 8 bytes.
// The ledger counts the bytes each rank hands to a collective (its input).
//
// Then pipeline parallelism on the reference llama (float32, 4 micro-batches of the same
// global batch): pp=2 (1F1B) against dp_shard=2 on 2 ranks, their step times side by side,
// and the bytes the pp ranks sent point to point in one step (the ledger's "send" records on
// the pp axis, summed over both ranks) next to pp::p2p_bytes_per_step:
//   2 * (stages - 1) * micro_batches * (B / micro_batches) * S * H * e.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "harness/base/files.h"
#include "harness/runtime/launcher.h"
#include "harness/runtime/worker.h"
#include "reference_models/llama.h"
#include "tests/parallel/tiny_block.h"

namespace {

struct Sizes {
  int64_t hidden, heads, ffn, layers, vocab, seq, batch;
};

Sizes sizes_of(mih::WorkerContext& ctx) {
  return {ctx.int_option("hidden"), ctx.int_option("heads"), ctx.int_option("ffn"), ctx.int_option("layers"),
          ctx.int_option("vocab"),  ctx.int_option("seq"),   ctx.int_option("batch")};
}

// The formula in the file comment, for dp_shard x tp (dp_replicate = cp = 1), float32.
nlohmann::json expected_bytes(const Sizes& s, int dp_shard, int tp) {
  const double e = 4;
  nlohmann::json out = nlohmann::json::object();
  const int64_t tokens = s.batch / dp_shard * s.seq;
  if (tp > 1) out["tp"] = ((5 * s.layers + 2) * tokens * s.hidden + 3 * tokens) * e;
  if (dp_shard > 1) {
    const int64_t w = dp_shard;
    auto fsdp = [&](int64_t rows, int64_t cols, int gathers) {
      const int64_t chunk = (rows + w - 1) / w;
      return (gathers * chunk * cols + w * chunk * cols) * e;
    };
    const int64_t h = s.hidden, f = s.ffn;
    // One decoder layer's TP pieces: attn_norm, q (w, b), kv (w, b; kv_heads = heads), out
    // (w, b), mlp_norm, gate_up, down.
    double layer = fsdp(h, 1, 2) + fsdp(h / tp, h, 2) + fsdp(h / tp, 1, 2) + fsdp(2 * h / tp, h, 2) +
                   fsdp(2 * h / tp, 1, 2) + fsdp(h, h / tp, 2) + fsdp(h, 1, 2) + fsdp(h, 1, 2) + fsdp(2 * f / tp, h, 2) +
                   fsdp(h, f / tp, 2);
    const int64_t vocab_rows = (s.vocab + tp - 1) / tp;
    double root = fsdp(vocab_rows, h, 1) + fsdp(h, 1, 1) + fsdp(vocab_rows, h, 1);  // embed, final norm, head
    out["dp_shard"] = s.layers * layer + root;
    out["dp_cp"] = 16;
  }
  if (dp_shard * tp > 1) out["world"] = 16;
  return out;
}

// One warm-up step, then the timed ones: their median step time (ms); `first` gets the comm
// ledger's records of the first timed step.
double timed_steps(mih::WorkerContext& ctx, mih::Trainer& trainer, std::vector<mih::CommRecord>* first) {
  trainer.step();  // warm-up
  std::vector<double> ms;
  for (int64_t i = 0; i < ctx.int_option("steps"); ++i) {
    const size_t before = ctx.ledger()->completed().size();
    ms.push_back(trainer.step().step_ms);
    if (i > 0) continue;
    const auto records = ctx.ledger()->completed();
    first->assign(records.begin() + static_cast<std::ptrdiff_t>(before), records.end());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

MIH_WORKER_TASK(bench_step, "trains the tiny block and reports step times and bytes per axis",
                {"dims", "dp_shard=2,tp=2", "1"}, {"steps", "timed steps", "5"}, {"hidden", "", "256"},
                {"heads", "", "8"}, {"ffn", "", "512"}, {"layers", "", "4"}, {"vocab", "", "2048"}, {"seq", "", "128"},
                {"batch", "", "8"}) {
  const Sizes s = sizes_of(ctx);
  mih::ParallelConfig dims = ctx.option("dims") == "1" ? mih::ParallelConfig{} : mih::ParallelConfig::parse_mesh(ctx.option("dims"));
  mih::DeviceMesh mesh = ctx.build_mesh(dims);
  mih::ParallelConfig config;
  config.dp_shard = dims.dp_shard;
  config.tp = dims.tp;
  mih::testing::TinyBlockOptions model;
  model.hidden = s.hidden;
  model.heads = s.heads;
  model.kv_heads = s.heads;
  model.ffn = s.ffn;
  model.layers = s.layers;
  model.vocab = s.vocab;
  mih::Trainer trainer(mesh, config, mih::testing::tiny_block_factory(model),
                       mih::testing::tiny_batches(s.batch, s.seq, s.vocab), mih::TrainerOptions().lr(1e-4));
  std::vector<mih::CommRecord> first;
  const double median_ms = timed_steps(ctx, trainer, &first);
  nlohmann::json bytes = nlohmann::json::object();
  for (const auto& r : first) bytes[r.axis] = bytes.value(r.axis, 0.0) + static_cast<double>(r.bytes);
  nlohmann::json result = {{"median_step_ms", median_ms},
                           {"bytes", bytes},
                           {"expected_bytes", expected_bytes(s, dims.dp_shard, dims.tp)}};
  mih::write_file_atomic(ctx.run_dir() / ("step_rank" + std::to_string(ctx.world().rank) + ".json"), result.dump());
  return 0;
}

MIH_WORKER_TASK(bench_pipeline, "trains the reference llama and reports step times and pp bytes",
                {"dims", "pp=2 or dp_shard=2", "pp=2"}, {"steps", "timed steps", "5"}, {"hidden", "", "256"},
                {"layers", "", "4"}, {"seq", "", "128"}, {"batch", "", "8"}) {
  mih::ParallelConfig config = mih::ParallelConfig::parse_mesh(ctx.option("dims"));
  mih::DeviceMesh mesh = ctx.build_mesh(config);
  config.micro_batches = 4;
  const int64_t hidden = ctx.int_option("hidden"), seq = ctx.int_option("seq"), batch = ctx.int_option("batch");
  const auto llama = mih::models::LlamaOptions()
                         .hidden_size(hidden)
                         .intermediate_size(2 * hidden)
                         .num_layers(ctx.int_option("layers"))
                         .num_heads(8)
                         .num_kv_heads(4)
                         .vocab_size(2048);
  mih::Trainer trainer(mesh, config, mih::models::make_llama(llama), mih::testing::tiny_batches(batch, seq, 2048),
                       mih::TrainerOptions().lr(1e-4));
  std::vector<mih::CommRecord> first;
  const double median_ms = timed_steps(ctx, trainer, &first);
  double pp_bytes = 0;
  for (const auto& r : first) {
    if (r.axis == "pp" && r.op == "send") pp_bytes += static_cast<double>(r.bytes);
  }
  const int64_t activation = batch / config.micro_batches * seq * hidden * 4;
  nlohmann::json result = {{"median_step_ms", median_ms},
                           {"pp_bytes_sent", pp_bytes},
                           {"pp_bytes_formula", config.pp > 1 ? mih::pp::p2p_bytes_per_step(config.pipeline_shape(), activation) : 0}};
  mih::write_file_atomic(ctx.run_dir() / ("step_rank" + std::to_string(ctx.world().rank) + ".json"), result.dump());
  return 0;
}

// Every rank's result, in rank order.
nlohmann::json run_all(const std::string& dims, int world, const std::vector<std::string>& args,
                       const std::string& task = "bench_step") {
  mih::WorkerOptions w;
  w.run_dir = std::filesystem::temp_directory_path() / ("mih_bench_step_" + std::to_string(::getpid()) + "_" + std::to_string(world));
  w.gloo_hostname = "127.0.0.1";
  std::vector<std::string> task_args = {"--dims", dims};
  task_args.insert(task_args.end(), args.begin(), args.end());
  mih::LaunchOptions o;
  o.world_size = world;
  o.run_dir = w.run_dir;
  o.command = mih::worker_command(task, w, task_args);
  mih::LaunchResult r = mih::launch(o);
  if (!r.ok()) {
    std::fprintf(stderr, "%s", r.report().c_str());
    std::exit(1);
  }
  std::string text;
  nlohmann::json out = nlohmann::json::array();
  for (int r = 0; r < world; ++r) {
    mih::read_file(w.run_dir / ("step_rank" + std::to_string(r) + ".json"), &text);
    out.push_back(nlohmann::json::parse(text));
  }
  std::filesystem::remove_all(w.run_dir);
  return out;
}

nlohmann::json run(const std::string& dims, int world, const std::vector<std::string>& args) {
  return run_all(dims, world, args)[0];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "worker") return mih::worker_main(argc - 1, argv + 1);
  std::string steps = "5", hidden = "256", layers = "4", seq = "128", batch = "8";
  CLI::App app{"Trainer step time and bytes per mesh axis: world size 1 vs dp_shard=2 x tp=2", "mih_bench_step"};
  app.add_option("--steps", steps, "timed steps")->capture_default_str();
  app.add_option("--hidden", hidden, "hidden size")->capture_default_str();
  app.add_option("--layers", layers, "decoder layers")->capture_default_str();
  app.add_option("--seq", seq, "sequence length")->capture_default_str();
  app.add_option("--batch", batch, "global batch (divisible by 2)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::vector<std::string> args = {"--steps", steps, "--hidden", hidden, "--layers", layers, "--seq", seq, "--batch", batch};
  nlohmann::json one = run("1", 1, args);
  nlohmann::json four = run("dp_shard=2,tp=2", 4, args);
  std::printf("tiny block: hidden %s, layers %s, seq %s, global batch %s, float32; median of %s steps\n", hidden.c_str(),
              layers.c_str(), seq.c_str(), batch.c_str(), steps.c_str());
  const double t1 = one["median_step_ms"], t4 = four["median_step_ms"];
  std::printf("  world size 1:             %8.1f ms/step\n", t1);
  std::printf("  dp_shard=2 x tp=2 (4 ranks): %8.1f ms/step  (ratio to world size 1: %.2f)\n", t4, t4 / t1);
  std::printf("  bytes per step on rank 0, from the comm ledger vs the formula:\n");
  for (auto& [axis, expected] : four["expected_bytes"].items()) {
    const double measured = four["bytes"].value(axis, 0.0);
    std::printf("    %-10s measured %12.0f  expected %12.0f  %s\n", axis.c_str(), measured, expected.get<double>(),
                std::abs(measured - expected.get<double>()) < 0.5 ? "equal" : "DIFFERENT");
  }
  // Pipeline parallelism on the reference llama, 2 ranks each, interleaved A/B.
  std::vector<std::string> pp_args = {"--steps", steps, "--hidden", hidden, "--layers", layers, "--seq", seq, "--batch", batch};
  std::vector<double> pp_ms, dp_ms;
  double sent = 0, formula = 0;
  for (int round = 0; round < 3; ++round) {
    const nlohmann::json pp = run_all("pp=2", 2, pp_args, "bench_pipeline");
    const nlohmann::json &pp0 = pp[0], &pp1 = pp[1];
    const nlohmann::json dp = run_all("dp_shard=2", 2, pp_args, "bench_pipeline");
    dp_ms.push_back(std::max(dp[0]["median_step_ms"].get<double>(), dp[1]["median_step_ms"].get<double>()));
    pp_ms.push_back(std::max(pp0["median_step_ms"].get<double>(), pp1["median_step_ms"].get<double>()));
    sent = pp0["pp_bytes_sent"].get<double>() + pp1["pp_bytes_sent"].get<double>();
    formula = pp0["pp_bytes_formula"];
  }
  std::sort(pp_ms.begin(), pp_ms.end());
  std::sort(dp_ms.begin(), dp_ms.end());
  std::printf("reference llama: hidden %s, layers %s, seq %s, global batch %s, 4 micro-batches, float32; median of 3 runs\n",
              hidden.c_str(), layers.c_str(), seq.c_str(), batch.c_str());
  std::printf("  dp_shard=2 (2 ranks):     %8.1f ms/step (the slower rank)\n", dp_ms[1]);
  std::printf("  pp=2, 1F1B (2 ranks):     %8.1f ms/step  (ratio to dp_shard=2: %.2f)\n", pp_ms[1], pp_ms[1] / dp_ms[1]);
  std::printf("  pp bytes per step, both ranks' sends from the comm ledger: %.0f; the formula: %.0f  %s\n", sent, formula,
              std::abs(sent - formula) < 0.5 ? "equal" : "DIFFERENT");
  return 0;
}
