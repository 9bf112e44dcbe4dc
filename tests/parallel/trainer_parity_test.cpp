// The Trainer under every parallel configuration against world size 1, in float64: the loss,
// every parameter's gathered gradient, the grad norm, and the parameters after each of 3
// AdamW steps with clipping active agree to a relative error of 1e-10. Also: uneven FSDP
// shards (one empty), gradient accumulation, uneven valid-token counts across data-parallel
// ranks, tied embeddings.
#include <map>
#include <mutex>
#include <set>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/compat/optim.h"
#include "harness/runtime/comm_ledger.h"
#include "tests/parallel/tiny_block.h"
#include "tests/support/parity.h"
#include "tests/support/thread_ranks.h"

namespace mih {
namespace {

using ::testing::IsEmpty;


constexpr int64_t kSteps = 3;
using testing::MatchesReference;
using testing::TrainingRun;
using Tensors = testing::Tensors;

TrainerOptions options() {
  // A small max norm keeps clipping active at every step (checked below).
  return TrainerOptions().lr(1e-2).max_grad_norm(0.05);
}

TrainingRun train(ParallelConfig config, testing::TinyBlockOptions model = {},
          BatchSource batches = testing::tiny_batches(8, 8, 37)) {
  config.dtype = DType::kFloat64;
  config.seed = 11;
  return testing::train_on_threads(config, testing::tiny_block_factory(model), batches, options(), kSteps);
}

// The world-size-1 run of a model, once per binary run.
const TrainingRun& reference(const testing::TinyBlockOptions& model = {}) {
  static std::map<std::tuple<bool, int64_t, double, int64_t>, TrainingRun> cache;
  const auto key = std::make_tuple(model.tie_embeddings, model.kv_heads, model.dropout, model.layers);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, train(ParallelConfig{}, model)).first;
  return it->second;
}

testing::TinyBlockOptions gqa_model() {
  testing::TinyBlockOptions m;
  m.kv_heads = 2;  // 4 query heads share 2 K/V heads; under tp=2 one K/V head per rank
  return m;
}

struct Case {
  const char* name;
  ParallelConfig config;
};

std::ostream& operator<<(std::ostream& out, const Case& c) { return out << c.config.name(); }

ParallelConfig cfg(int dp_replicate, int dp_shard, int tp, bool sp = false, int micro_batches = 1, int cp = 1,
                   CpLayout layout = CpLayout::kContiguous, bool ac = false) {
  ParallelConfig c;
  c.cp = cp;
  c.cp_layout = layout;
  c.activation_checkpointing = ac;
  c.dp_replicate = dp_replicate;
  c.dp_shard = dp_shard;
  c.tp = tp;
  c.sequence_parallel = sp;
  c.micro_batches = micro_batches;
  return c;
}

class TrainerParityTest : public ::testing::TestWithParam<Case> {};

TEST_P(TrainerParityTest, MatchesOneRank) {
  const TrainingRun& ref = reference();
  for (const auto& m : ref.metrics) ASSERT_GT(m.grad_norm_pre_clip, 0.05) << "clipping must be active";
  TrainingRun run = train(GetParam().config);
  ::testing::AssertionResult result = MatchesReference(run, ref);
  EXPECT_TRUE(result) << GetParam().config.name();
  if (result) std::printf("%s: %s\n", GetParam().config.name().c_str(), result.message());
}

INSTANTIATE_TEST_SUITE_P(Configs, TrainerParityTest,
                         ::testing::Values(Case{"DpReplicate2", cfg(2, 1, 1)}, Case{"DpShard2", cfg(1, 2, 1)},
                                           Case{"Tp2", cfg(1, 1, 2)}, Case{"Tp2Sp", cfg(1, 1, 2, true)},
                                           Case{"DpShard2Tp2", cfg(1, 2, 2)}, Case{"DpReplicate2DpShard2", cfg(2, 2, 1)},
                                           Case{"DpShard4Uneven", cfg(1, 4, 1)},
                                           Case{"Tp2SpMicroBatches2", cfg(1, 1, 2, true, 2)},
                                           Case{"DpShard2MicroBatches2", cfg(1, 2, 1, false, 2)}),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// Pipeline parallelism: each schedule against world size 1 (4 decoder layers, so that
// pp(2) x vpp(2) = 4 stages hold one each), alone and with dp_shard, tp and sequence
// parallelism, and activation checkpointing; the loss is normalized over every micro-batch
// of every data-parallel rank (tiny_batches masks a row-dependent number of labels).
ParallelConfig pipelined(ParallelConfig c, int pp, int micro_batches,
                         pp::ScheduleKind schedule = pp::ScheduleKind::k1F1B, int vpp = 1) {
  c.pp = pp;
  c.vpp = vpp;
  c.pp_schedule = schedule;
  c.micro_batches = micro_batches;
  return c;
}

testing::TinyBlockOptions four_layers() {
  testing::TinyBlockOptions m;
  m.layers = 4;
  return m;
}

class PipelineParityTest : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineParityTest, MatchesOneRank) {
  const TrainingRun& ref = reference(four_layers());
  TrainingRun run = train(GetParam().config, four_layers());
  ::testing::AssertionResult result = MatchesReference(run, ref);
  EXPECT_TRUE(result) << GetParam().config.name();
  if (result) std::printf("%s: %s\n", GetParam().config.name().c_str(), result.message());
  ASSERT_FALSE(run.metrics.empty());
  EXPECT_FALSE(run.metrics[0].pipeline_order.empty()) << "rank 0 records the order it ran";
}

constexpr auto kGPipe = pp::ScheduleKind::kGPipe;
constexpr auto kInterleaved = pp::ScheduleKind::kInterleaved1F1B;
INSTANTIATE_TEST_SUITE_P(
    Configs, PipelineParityTest,
    ::testing::Values(Case{"Pp2", pipelined(cfg(1, 1, 1), 2, 4)}, Case{"Pp2GPipe", pipelined(cfg(1, 1, 1), 2, 2, kGPipe)},
                      Case{"Pp2Vpp2", pipelined(cfg(1, 1, 1), 2, 4, kInterleaved, 2)},
                      Case{"Pp4", pipelined(cfg(1, 1, 1), 4, 4)},
                      Case{"DpShard2Pp2", pipelined(cfg(1, 2, 1), 2, 2)},
                      Case{"Pp2Tp2Sp", pipelined(cfg(1, 1, 2, true), 2, 2)},
                      Case{"Pp2Checkpointed", pipelined(cfg(1, 1, 1, false, 1, 1, CpLayout::kContiguous, true), 2, 2)}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// The pipeline's point-to-point traffic is in the comm ledger on the pp axis: per step,
// summed over the pp ranks, exactly pp::p2p_bytes_per_step (each micro-batch's activation
// [b, s, H] crosses every stage boundary forward and its gradient backward), and it equals
// what the executor counted. 1F1B over 2 stages and interleaved over 4, 4 micro-batches.
TEST(PipelineLedgerTest, PointToPointBytesMatchTheFormula) {
  for (ParallelConfig c : {pipelined(cfg(1, 1, 1), 2, 4), pipelined(cfg(1, 1, 1), 2, 4, kInterleaved, 2)}) {
    c.dtype = DType::kFloat64;
    std::mutex mutex;
    int64_t ledger_bytes = 0, counted = 0;
    std::set<std::string> sites;
    compat::Store store = compat::make_hash_store(std::chrono::seconds(20));
    auto errors = testing::run_ranks(2, [&](int rank) {
      MeshOptions o;
      o.group = testing::thread_group_options();
      o.ledger = std::make_shared<CommLedger>();
      DeviceMesh mesh(c, store, rank, 2, o);
      Trainer t(mesh, c, testing::tiny_block_factory(four_layers()), testing::tiny_batches(8, 8, 37), options());
      const StepMetrics m = t.step();
      std::lock_guard<std::mutex> lock(mutex);
      counted += m.pipeline_bytes_sent;
      for (const auto& r : o.ledger->completed()) {
        if (r.axis != "pp" || r.op != "send") continue;
        ledger_bytes += r.bytes;
        sites.insert(r.site.substr(0, r.site.find(' ')));
      }
    });
    ASSERT_THAT(errors, IsEmpty());
    // 8 rows / 4 micro-batches = 2 rows of 8 tokens, hidden 16, float64.
    const int64_t expected = pp::p2p_bytes_per_step(c.pipeline_shape(), 2 * 8 * 16 * 8);
    EXPECT_EQ(ledger_bytes, expected) << c.name();
    EXPECT_EQ(counted, expected) << c.name();
    EXPECT_THAT(sites, ::testing::ElementsAre("pipeline.activation", "pipeline.gradient")) << c.name();
  }
}

// Context parallelism with grouped-query attention (4 query heads, 2 K/V heads), alone and
// combined with tp and dp_shard, in both layouts; activation checkpointing under tp and
// dp_shard. Sequences of 8 tokens: zigzag cp=2 cuts them into 4 chunks of 2.
class ContextParallelParityTest : public ::testing::TestWithParam<Case> {};

TEST_P(ContextParallelParityTest, MatchesOneRank) {
  const TrainingRun& ref = reference(gqa_model());
  TrainingRun run = train(GetParam().config, gqa_model());
  ::testing::AssertionResult result = MatchesReference(run, ref);
  EXPECT_TRUE(result) << GetParam().config.name();
  if (result) std::printf("%s: %s\n", GetParam().config.name().c_str(), result.message());
}

constexpr CpLayout kZigzag = CpLayout::kZigzag;
INSTANTIATE_TEST_SUITE_P(
    Configs, ContextParallelParityTest,
    ::testing::Values(Case{"Cp2", cfg(1, 1, 1, false, 1, 2)}, Case{"Cp2Zigzag", cfg(1, 1, 1, false, 1, 2, kZigzag)},
                      Case{"Cp2ZigzagTp2", cfg(1, 1, 2, false, 1, 2, kZigzag)},
                      Case{"Cp2Tp2Sp", cfg(1, 1, 2, true, 1, 2)}, Case{"DpShard2Cp2", cfg(1, 2, 1, false, 1, 2)},
                      Case{"DpShard2Cp2Zigzag", cfg(1, 2, 1, false, 1, 2, kZigzag)},
                      Case{"Tp2Checkpointed", cfg(1, 1, 2, false, 1, 1, CpLayout::kContiguous, true)},
                      Case{"DpShard2Tp2Checkpointed", cfg(1, 2, 2, false, 1, 1, CpLayout::kContiguous, true)},
                      Case{"Cp2ZigzagCheckpointed", cfg(1, 1, 1, false, 1, 2, kZigzag, true)}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// Activation checkpointing with dropout 0.1 replays the dropout masks: the gradients and
// parameters equal the run without checkpointing bit for bit at every step (a recompute
// that drew fresh masks, or left the stream advanced for the next step, would differ).
TEST(ActivationCheckpointTrainingTest, BitExactWithDropoutUnderTpAndDpShard) {
  testing::TinyBlockOptions m = gqa_model();
  m.dropout = 0.1;
  for (ParallelConfig c : {cfg(1, 1, 2), cfg(1, 2, 1), cfg(1, 2, 2, true)}) {
    TrainingRun plain = train(c, m);
    c.activation_checkpointing = true;
    TrainingRun checkpointed = train(c, m);
    ASSERT_EQ(plain.grads.size(), checkpointed.grads.size());
    for (size_t s = 0; s < plain.grads.size(); ++s) {
      EXPECT_EQ(plain.metrics[s].loss, checkpointed.metrics[s].loss) << c.name() << " step " << s;
      for (const auto& [fqn, g] : plain.grads[s]) {
        EXPECT_TRUE(at::equal(g, checkpointed.grads[s].at(fqn))) << c.name() << " step " << s << " gradient of " << fqn;
        EXPECT_TRUE(at::equal(plain.params[s].at(fqn), checkpointed.params[s].at(fqn))) << c.name() << " step " << s << " " << fqn;
      }
    }
    // Dropout is really on: the loss differs from the model without it.
    c.activation_checkpointing = false;
    EXPECT_NE(plain.metrics[0].loss, train(c, gqa_model()).metrics[0].loss) << c.name();
  }
}

// What activation checkpointing did, as the runtime counts it (the session writes it to
// check/activation_checkpoint.json): every layer's forward under checkpointing once per
// micro-batch, every recompute in backward once; a forward whose output needs no gradient owes
// no recompute; with checkpointing off nothing is counted.
TEST(ActivationCheckpointTrainingTest, RuntimeCountsEachCheckpointedForwardAndItsRecompute) {
  for (const bool ac : {true, false}) {
    ParallelConfig c = cfg(1, 1, 1, false, /*micro_batches=*/2, 1, CpLayout::kContiguous, ac);
    c.dtype = DType::kFloat64;
    std::map<std::string, ParallelContext::RegionCounts> after_forward, after_steps, after_no_grad;
    const BatchSource batches = testing::tiny_batches(8, 8, 37);
    auto errors = testing::run_mesh(c, [&](DeviceMesh& mesh) {
      Trainer t(mesh, c, testing::tiny_block_factory({}), batches, options());
      t.step();
      t.step();
      after_steps = t.context().checkpoint_counts();
      Batch b = batches(0);  // as the trainer gives it to the model (world size 1: whole)
      b.position_ids = at::arange(b.input_ids.size(1), at::kLong).unsqueeze(0).expand_as(b.input_ids);
      {
        at::NoGradGuard no_grad;
        (void)t.model().token_losses(b);
      }
      after_no_grad = t.context().checkpoint_counts();
      // A forward whose backward never runs: counted as owed, not as recomputed.
      (void)t.model().token_losses(b);
      after_forward = t.context().checkpoint_counts();
    });
    ASSERT_THAT(errors, IsEmpty());
    if (!ac) {
      EXPECT_THAT(after_forward, IsEmpty());
      continue;
    }
    ASSERT_EQ(after_steps.size(), 2u);  // layers.0, layers.1
    for (const auto& [region, n] : after_steps) {
      EXPECT_EQ(n.checkpointed, 4) << region << ": 2 steps x 2 micro-batches";
      EXPECT_EQ(n.recomputed, 4) << region;
      EXPECT_EQ(after_no_grad.at(region).checkpointed, 4) << region << ": no gradient, no recompute owed";
      EXPECT_EQ(after_forward.at(region).checkpointed, 5) << region;
      EXPECT_EQ(after_forward.at(region).recomputed, 4) << region;
    }
  }
}

// Dropout 0.1 whose masks depend only on each element's global position: every split of the
// batch over dp, tp (heads and sequence), cp (zigzag) and micro-batches, with and without
// activation checkpointing, matches the one-rank run to 1e-10 at every step. With F26 (the
// same mask on every tp shard) tp=2 does not.
TEST(DropoutParityTest, EverySplitMatchesOneRank) {
  testing::TinyBlockOptions m = gqa_model();
  m.dropout = 0.1;
  const TrainingRun& ref = reference(m);
  EXPECT_NE(ref.metrics[0].loss, reference(gqa_model()).metrics[0].loss) << "dropout must be on";
  for (const ParallelConfig& c :
       {cfg(1, 2, 1), cfg(1, 1, 2), cfg(1, 1, 2, true), cfg(1, 1, 1, false, 1, 2, kZigzag), cfg(1, 2, 1, false, 2),
        cfg(1, 1, 2, true, 2), cfg(1, 1, 2, false, 1, 1, CpLayout::kContiguous, true), cfg(2, 1, 1)}) {
    ::testing::AssertionResult result = MatchesReference(train(c, m), ref);
    EXPECT_TRUE(result) << c.name();
  }
  fault::ScopedFault same_mask(fault::Fault::kF26);
  EXPECT_FALSE(MatchesReference(train(cfg(1, 1, 2), m), ref)) << "the same mask on every tp shard must not match";
}

// FSDP over 4 ranks: the 37-row embedding shards as 10, 10, 10, 7 and the parameters agree.
TEST(TrainerLayoutTest, UnevenFsdpShardsAreRecorded) {
  TrainingRun run = train(cfg(1, 4, 1));
  bool seen = false;
  for (const auto& p : run.layout["parameters"]) {
    if (p["fqn"] != "embed.weight") continue;
    seen = true;
    EXPECT_EQ(p["local_shape"], nlohmann::json({10, 16}));  // rank 0
    EXPECT_EQ(p["fsdp_rows"]["chunk"], 10);
    EXPECT_EQ(p["placements"]["dp_shard"], "Shard(0)");
    EXPECT_EQ(p["fsdp_unit"], "root");
  }
  EXPECT_TRUE(seen);
}

// Decoder-layer units reshard after forward: their parameters are gathered in forward and
// again in backward; the root's only in forward (TorchTitan's choice: backward needs them
// at once). 2 layers x 10 parameters + 3 root parameters per rank and step.
TEST(TrainerLayoutTest, FsdpUnitsGatherAgainForBackward) {
  // With activation checkpointing the layers' first forward runs without a graph, so nothing
  // is regathered by the hook: the recompute gathers its own (2 x 10 more all-gathers).
  for (bool ac : {false, true}) {
    ParallelConfig c = cfg(1, 2, 1, false, 1, 1, CpLayout::kContiguous, ac);
    c.dtype = DType::kFloat64;
    MeshOptions mesh_options;
    mesh_options.group = testing::thread_group_options();
    std::mutex mutex;
    std::vector<std::vector<CommRecord>> ledgers;
    compat::Store store = compat::make_hash_store(std::chrono::seconds(20));
    auto errors = testing::run_ranks(2, [&](int rank) {
      MeshOptions o = mesh_options;
      o.ledger = std::make_shared<CommLedger>();
      DeviceMesh mesh(c, store, rank, 2, o);
      Trainer t(mesh, c, testing::tiny_block_factory(), testing::tiny_batches(8, 8, 37), options());
      t.step();
      std::lock_guard<std::mutex> lock(mutex);
      ledgers.push_back(o.ledger->completed());
    });
    ASSERT_THAT(errors, IsEmpty());
    for (const auto& records : ledgers) {
      std::map<std::string, int> by_site;
      for (const auto& r : records) {
        if (r.axis == "dp_shard") by_site[r.site.substr(0, r.site.find(' '))]++;
      }
      EXPECT_EQ(by_site["fsdp.all_gather"], 2 * 10 + 3 + (ac ? 2 * 10 : 0)) << c.name();
      EXPECT_EQ(by_site["fsdp.regather_for_backward"], ac ? 0 : 2 * 10) << c.name();
      EXPECT_EQ(by_site["grad_sync.dense.fsdp.dp_shard"], 2 * 10 + 3) << c.name();
    }
  }
}

// Every gradient collective is labelled with its reduction path (reduction_paths.h), and the
// runtime records exactly the paths whose collectives ran, with their parameters: plain DDP's
// whole gradients over dp_replicate, HSDP's shards, FSDP's reduce-scatter, the tp-partial sums
// of sequence parallelism, cp; grad_norm and the loss normalizers over every mesh.
TEST(TrainerLayoutTest, EveryGradientCollectiveIsLabelledWithTheReductionPathItRecords) {
  struct Want {
    ParallelConfig config;
    std::set<std::string> paths;
  };
  const std::vector<Want> cases = {
      {cfg(2, 1, 1), {"dense.unsharded.dp_replicate", "grad_norm.world", "loss.valid_tokens.dp_cp", "loss.sum.dp_cp"}},
      {cfg(2, 2, 1, false, 2),
       {"dense.fsdp.dp_replicate", "dense.fsdp.dp_shard", "grad_norm.world", "loss.valid_tokens.dp_cp",
        "loss.sum.dp_cp", "loss.micro_batches"}},
      {cfg(1, 2, 2, true), {"dense.fsdp.tp", "dense.fsdp.dp_shard", "grad_norm.world", "loss.valid_tokens.dp_cp",
                            "loss.sum.dp_cp"}},
      {cfg(1, 1, 1, false, 1, 2), {"dense.unsharded.cp", "grad_norm.world", "loss.valid_tokens.dp_cp", "loss.sum.dp_cp"}},
  };
  for (const Want& want : cases) {
    ParallelConfig c = want.config;
    c.dtype = DType::kFloat64;
    const int world = c.world_size();
    MeshOptions mesh_options;
    mesh_options.group = testing::thread_group_options();
    std::mutex mutex;
    std::vector<std::set<std::string>> labelled, recorded;
    std::map<std::string, std::set<std::string>> parameters;
    compat::Store store = compat::make_hash_store(std::chrono::seconds(20));
    auto errors = testing::run_ranks(world, [&](int rank) {
      MeshOptions o = mesh_options;
      o.ledger = std::make_shared<CommLedger>();
      DeviceMesh mesh(c, store, rank, world, o);
      Trainer t(mesh, c, testing::tiny_block_factory(), testing::tiny_batches(8, 8, 37), options());
      t.step();
      std::set<std::string> sites, paths;
      for (const auto& r : o.ledger->completed()) sites.insert(r.site.substr(0, r.site.find(' ')));
      std::lock_guard<std::mutex> lock(mutex);
      for (const auto& [name, reached] : t.context().reached_reduction_paths()) {
        paths.insert(name);
        if (rank == 0) parameters[name] = reached.parameters;
        const char* site = reduction_path(name).site;
        // A path that moves data left a collective with its site in the ledger.
        if (*site != '\0') {
          EXPECT_TRUE(sites.count(site)) << c.name() << ": " << name << " recorded, no '" << site << "'";
        }
      }
      std::set<std::string> from_sites;
      for (const ReductionPath& path : reduction_paths()) {
        if (*path.site != '\0' && sites.count(path.site)) from_sites.insert(std::string(path.name));
      }
      labelled.push_back(from_sites);
      recorded.push_back(paths);
    });
    ASSERT_THAT(errors, IsEmpty()) << c.name();
    // The accumulation over micro-batches moves nothing: no site, recorded all the same.
    std::set<std::string> with_site;
    for (const auto& name : want.paths) {
      if (*reduction_path(name).site != '\0') with_site.insert(name);
    }
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(recorded[r], want.paths) << c.name() << " rank " << r;
      EXPECT_EQ(labelled[r], with_site) << c.name() << " rank " << r << ": the ledger's sites";
    }
    for (const auto& name : want.paths) {
      EXPECT_EQ(parameters[name].empty(), !reduction_path(name).per_parameter) << c.name() << " " << name;
    }
  }
}

// A 3-row parameter over dp_shard=4: rows 1, 1, 1 and an empty shard; AdamW, the
// collectives and the norm all handle the empty one.
class ThreeRows : public ParallelModel {
 public:
  explicit ThreeRows(ParallelContext& ctx) : ctx_(&ctx) {
    ParamSpec s;
    s.shape = {3, 5};
    s.init = init::normal(0.5);
    w = register_parameter("w", ctx.make_parameter(s));
    embed = register_module("embed", VocabParallelEmbedding(ctx, 11, 5));
  }
  at::Tensor token_losses(const Batch& b) override {
    at::Tensor logits = at::matmul(embed(b.input_ids), ctx_->use(w).t());  // [B, S, 3]
    at::Tensor targets = at::where(b.labels.eq(-100), b.labels, b.labels.remainder(3));
    return vocab_parallel_cross_entropy(logits.reshape({-1, 3}), targets.reshape(-1), ctx_->tp_group(), 3)
        .view_as(b.labels);
  }
  at::Tensor w;
  VocabParallelEmbedding embed{nullptr};

 private:
  ParallelContext* ctx_;
};

TEST(TrainerEquivalenceTest, EmptyFsdpShardTrainsLikeOneRank) {
  auto run_three_rows = [](int dp_shard) {
    ParallelConfig c = cfg(1, dp_shard, 1);
    c.dtype = DType::kFloat64;
    TrainingRun run;
    std::mutex merge;
    auto errors = testing::run_mesh(c, [&](DeviceMesh& mesh) {
      testing::Capture capture(&run, mesh.rank() == 0, mesh.rank() == 0, kSteps, &merge);
      Trainer t(mesh, c, [](ParallelContext& ctx) { return std::make_shared<ThreeRows>(ctx); },
                testing::tiny_batches(4, 4, 11), options(), &capture);
      if (dp_shard == 4) {
        EXPECT_EQ(t.context().parameter(dynamic_cast<ThreeRows&>(t.model()).w).local_shape[0], mesh.rank() < 3 ? 1 : 0);
      }
      t.run(kSteps);
    });
    EXPECT_THAT(errors, IsEmpty());
    return run;
  };
  EXPECT_TRUE(MatchesReference(run_three_rows(4), run_three_rows(1)));
}

// Micro-batches only change how the batch is cut: 2 micro-batches give one batch's numbers.
TEST(TrainerEquivalenceTest, GradientAccumulationEqualsOneLargerBatch) {
  EXPECT_TRUE(MatchesReference(train(cfg(1, 1, 1, false, 2)), reference()));
  EXPECT_TRUE(MatchesReference(train(cfg(1, 1, 1, false, 4)), reference()));
}

// Rows 0-3 keep one target each, rows 4-7 all of theirs: the two dp ranks hold 4 and 32
// valid targets, and the gradients still equal one rank's (global normalization).
TEST(TrainerEquivalenceTest, UnevenValidTokensAcrossDpRanks) {
  BatchSource lopsided = [base = testing::tiny_batches(8, 8, 37)](int64_t step) {
    Batch b = base(step);
    b.labels = b.labels.clone();
    b.labels = at::where(at::arange(8).unsqueeze(1).lt(4).logical_and(at::arange(8).unsqueeze(0).gt(0)),
                         at::full_like(b.labels, -100), at::where(b.labels.eq(-100), at::full_like(b.labels, 3), b.labels));
    return b;
  };
  TrainingRun ref = train(ParallelConfig{}, {}, lopsided);
  EXPECT_EQ(ref.metrics[0].valid_tokens, 4 + 32);
  EXPECT_TRUE(MatchesReference(train(cfg(2, 1, 1), {}, lopsided), ref));
  EXPECT_TRUE(MatchesReference(train(cfg(1, 2, 2), {}, lopsided), ref));
}

// Tied embedding and head: one logical parameter (two FQNs) under every config, gradients
// from both uses summed.
TEST(TrainerEquivalenceTest, TiedWeightsStayTied) {
  testing::TinyBlockOptions tied;
  tied.tie_embeddings = true;
  const TrainingRun& ref = reference(tied);
  ASSERT_EQ(ref.grads[0].count("head.weight"), 0u) << "the head weight is the embedding's";
  for (ParallelConfig c : {cfg(1, 2, 1), cfg(1, 1, 2, true), cfg(1, 2, 2), pipelined(cfg(1, 1, 1), 2, 2),
                           pipelined(cfg(1, 2, 1), 2, 2)}) {
    TrainingRun run = train(c, tied);
    EXPECT_TRUE(MatchesReference(run, ref)) << c.name();
    for (const auto& p : run.layout["parameters"]) {
      if (p["fqn"] != "embed.weight") continue;
      // Under pp rank 0's first stage holds the embedding and the last stage a tied copy: one
      // logical parameter with both names on every copy, its gradient summed over pp.
      EXPECT_EQ(p["aliases"], nlohmann::json({"head.weight"})) << c.name();
      if (c.pp > 1) {
        EXPECT_EQ(p["pp_ranks"], nlohmann::json({0, 1})) << c.name();
        EXPECT_THAT(p["grad_domain"], ::testing::Contains("pp")) << c.name();
      }
    }
  }
}

TEST(TrainerConfigTest, RejectsConfigsThatCannotRun) {
  EXPECT_THAT([] { cfg(1, 1, 1, true).validate(1); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr("sequence_parallel needs tp > 1")));
  EXPECT_THAT([] { cfg(1, 2, 2).validate(2); }, ::testing::ThrowsMessage<Error>(::testing::HasSubstr("= 4 != world_size(2)")));
  EXPECT_EQ(cfg(2, 2, 1, false, 2).name(), "dp_replicate2_dp_shard2_mb2");
  EXPECT_EQ(cfg(1, 1, 2, true, 1, 2, CpLayout::kZigzag, true).name(), "cp2zz_tp2_sp_ac");
  nlohmann::json cp = cfg(1, 2, 1, false, 1, 2, CpLayout::kZigzag);
  EXPECT_EQ(cp["cp_layout"], "zigzag");
  EXPECT_EQ(cp.get<ParallelConfig>().name(), "dp_shard2_cp2zz");
  nlohmann::json j = cfg(1, 2, 2, true);
  EXPECT_EQ(j.get<ParallelConfig>().name(), "dp_shard2_tp2_sp");
  nlohmann::json typo = {{"tp", 2}, {"seqence_parallel", true}};
  EXPECT_THAT([&] { typo.get<ParallelConfig>(); }, ::testing::ThrowsMessage<Error>(::testing::HasSubstr("unknown field 'seqence_parallel'")));
}

TEST(TrainerConfigTest, BatchThatDoesNotSplitIsNamed) {
  auto errors = testing::run_mesh(cfg(1, 2, 1), [](DeviceMesh& mesh) {
    ParallelConfig c = cfg(1, 2, 1);
    Trainer t(mesh, c, testing::tiny_block_factory(), testing::tiny_batches(3, 8, 37), options());
    EXPECT_THAT([&] { t.step(); }, ::testing::ThrowsMessage<Error>(::testing::HasSubstr(
                                       "the global batch of 3 sequences does not split over dp_replicate(1) * dp_shard(2)")));
  });
  EXPECT_THAT(errors, IsEmpty());
}

// What a pipelined run cannot do yet is refused by name before anything trains: dropout (its
// keys follow one forward through the whole model), a model that does not split into stages.
TEST(PipelineConfigTest, DropoutAndAModelWithoutStagesAreRefused) {
  testing::TinyBlockOptions dropout = four_layers();
  dropout.dropout = 0.1;
  const ParallelConfig c = pipelined(cfg(1, 1, 1), 2, 2);
  auto errors = testing::run_mesh(c, [&](DeviceMesh& mesh) {
    EXPECT_THAT([&] { Trainer(mesh, c, testing::tiny_block_factory(dropout), testing::tiny_batches(8, 8, 37), options()); },
                ::testing::ThrowsMessage<Error>(::testing::HasSubstr("dropout 0.1 under pipeline parallelism")));
  });
  EXPECT_THAT(errors, IsEmpty());
  auto whole = testing::run_mesh(c, [&](DeviceMesh& mesh) {
    EXPECT_THAT([&] {
      Trainer t(mesh, c, [](ParallelContext& ctx) { return std::make_shared<ThreeRows>(ctx); },
                testing::tiny_batches(8, 8, 37), options());
    }, ::testing::ThrowsMessage<Error>(::testing::HasSubstr("did not split itself into stages")));
  });
  EXPECT_THAT(whole, IsEmpty());
}

}  // namespace
}  // namespace mih
