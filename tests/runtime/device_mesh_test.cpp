// ParallelConfig parsing and validation (errors show the arithmetic), mesh layout arithmetic,
// and the groups a real DeviceMesh builds on thread ranks.
#include <map>
#include <mutex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/runtime/device_mesh.h"
#include "tests/support/thread_ranks.h"

namespace mih {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(ParallelConfigTest, ParsesNamedDegrees) {
  ParallelConfig d = ParallelConfig::parse_mesh(" dp_shard=2, tp=3 ");
  EXPECT_EQ(d.dp_replicate, 1);
  EXPECT_EQ(d.dp_shard, 2);
  EXPECT_EQ(d.cp, 1);
  EXPECT_EQ(d.tp, 3);
  EXPECT_EQ(d.mesh_str(), "dp_shard=2,tp=3");
  EXPECT_EQ(ParallelConfig::parse_mesh("").mesh_str(), "1");
}

TEST(ParallelConfigTest, RejectsUnknownRepeatedAndBadDegrees) {
  EXPECT_THAT([] { ParallelConfig::parse_mesh("vpp=2"); },
              ThrowsMessage<Error>(HasSubstr("unknown mesh axis 'vpp'; valid: [pp, dp_replicate, dp_shard, cp, tp, ep]")));
  EXPECT_THAT([] { ParallelConfig::parse_mesh("edp=2"); },
              ThrowsMessage<Error>(HasSubstr("'edp' follows from the others: dp_shard * cp / ep")));
  EXPECT_THAT([] { ParallelConfig::parse_mesh("tp=2,tp=2"); }, ThrowsMessage<Error>(HasSubstr("'tp' is given twice")));
  EXPECT_THAT([] { ParallelConfig::parse_mesh("tp=0"); }, ThrowsMessage<Error>(HasSubstr("degree '0' is not an integer >= 1")));
  EXPECT_THAT([] { ParallelConfig::parse_mesh("tp=two"); }, ThrowsMessage<Error>(HasSubstr("degree 'two'")));
  EXPECT_THAT([] { ParallelConfig::parse_mesh("tp"); }, ThrowsMessage<Error>(HasSubstr("expected <axis>=<degree>")));
}

TEST(ParallelConfigTest, RejectsWorldSizeMismatchShowingTheArithmetic) {
  ParallelConfig d = ParallelConfig::parse_mesh("dp_shard=2,tp=3");
  EXPECT_THAT([&] { d.validate(4); },
              ThrowsMessage<Error>(HasSubstr("dp_replicate(1) * dp_shard(2) * cp(1) * tp(3) = 6 != world_size(4)")));
  EXPECT_NO_THROW(d.validate(6));
  EXPECT_THAT([] { DeviceMesh(ParallelConfig::parse_mesh("tp=2"), compat::make_hash_store(std::chrono::seconds(1)), 0, 4); },
              ThrowsMessage<Error>(HasSubstr("= 2 != world_size(4)")));
}

// ep is carved out of dp_shard x cp: it never changes the world size, it must divide
// dp_shard * cp, and a rejection shows the arithmetic and the choices.
TEST(ParallelConfigTest, ExpertParallelDividesDpShardTimesCp) {
  ParallelConfig d = ParallelConfig::parse_mesh("dp_shard=2,ep=2");
  EXPECT_EQ(d.ep, 2);
  EXPECT_EQ(d.world_size(), 2);
  EXPECT_EQ(d.mesh_str(), "dp_shard=2,ep=2");
  EXPECT_EQ(d.name(), "dp_shard2_ep2");
  EXPECT_FALSE(d.same_mesh(ParallelConfig::parse_mesh("dp_shard=2")));
  EXPECT_NO_THROW(d.validate(2));
  EXPECT_NO_THROW(ParallelConfig::parse_mesh("dp_shard=2,cp=2,ep=4").validate(4));
  EXPECT_THAT([] { ParallelConfig::parse_mesh("dp_shard=2,ep=4").validate(2); },
              ThrowsMessage<Error>(HasSubstr("ep(4) does not divide dp_shard(2) * cp(1) = 2: expert-parallel ranks are "
                                             "carved out of dp_shard x cp; choose ep among [1, 2]")));
  EXPECT_THAT([] { ParallelConfig::parse_mesh("tp=2,ep=2").validate(2); },
              ThrowsMessage<Error>(HasSubstr("ep(2) does not divide dp_shard(1) * cp(1) = 1")));
  EXPECT_THAT([] { ParallelConfig::parse_mesh("dp_shard=3,cp=2,ep=4").validate(6); },
              ThrowsMessage<Error>(HasSubstr("= 6: expert-parallel ranks are carved out of dp_shard x cp; choose ep "
                                             "among [1, 2, 3, 6]")));
  EXPECT_THAT([] { ParallelConfig::parse_mesh("ep=0"); }, ThrowsMessage<Error>(HasSubstr("degree '0' is not an integer >= 1")));
}

// ep takes consecutive ranks of dp_shard_cp (TorchTitan's dp_shard_in_ep x cp when ep is a
// multiple of cp), edp the rest: expert FSDP and the expert gradients' reduction.
TEST(MeshLayoutTest, EpGroupsAreConsecutiveRanksOfDpShardCpAndEdpTheStridedRest) {
  MeshLayout layout(ParallelConfig::parse_mesh("dp_replicate=2,dp_shard=4,ep=2"), 8);
  // Rank 5 = (1, 1, 0, 0): dp_shard_cp index 1 of {4, 5, 6, 7}.
  EXPECT_THAT(layout.group_ranks(MeshAxis::kDpShardCp, 5), ElementsAre(4, 5, 6, 7));
  EXPECT_THAT(layout.group_ranks(MeshAxis::kEp, 5), ElementsAre(4, 5));
  EXPECT_THAT(layout.group_ranks(MeshAxis::kEdp, 5), ElementsAre(5, 7));
  EXPECT_THAT(layout.group_ranks(MeshAxis::kEp, 6), ElementsAre(6, 7));
  EXPECT_THAT(layout.group_ranks(MeshAxis::kEdp, 6), ElementsAre(4, 6));
  EXPECT_EQ(layout.all_groups(MeshAxis::kEp).size(), 4u);
  EXPECT_EQ(layout.all_groups(MeshAxis::kEdp).size(), 4u);
  // ep over dp_shard x cp with tp inside: the ep group of a rank keeps its tp index.
  MeshLayout with_tp(ParallelConfig::parse_mesh("dp_shard=2,cp=2,tp=2,ep=4"), 8);
  EXPECT_THAT(with_tp.group_ranks(MeshAxis::kEp, 3), ElementsAre(1, 3, 5, 7));
  EXPECT_THAT(with_tp.group_ranks(MeshAxis::kEdp, 3), ElementsAre(3));
  // Without ep (ep = 1): ep is every rank alone, edp all of dp_shard_cp.
  MeshLayout plain(ParallelConfig::parse_mesh("dp_shard=2,cp=2"), 4);
  EXPECT_THAT(plain.group_ranks(MeshAxis::kEp, 2), ElementsAre(2));
  EXPECT_THAT(plain.group_ranks(MeshAxis::kEdp, 2), ElementsAre(0, 1, 2, 3));
}

TEST(ParallelConfigTest, SpreadGivesInnerAxesFirst) {
  EXPECT_EQ(ParallelConfig::spread(1).mesh_str(), "1");
  EXPECT_EQ(ParallelConfig::spread(2).mesh_str(), "tp=2");
  EXPECT_EQ(ParallelConfig::spread(4).mesh_str(), "cp=2,tp=2");
  EXPECT_EQ(ParallelConfig::spread(8).mesh_str(), "dp_shard=2,cp=2,tp=2");
  EXPECT_EQ(ParallelConfig::spread(16).mesh_str(), "dp_replicate=2,dp_shard=2,cp=2,tp=2");
  EXPECT_EQ(ParallelConfig::spread(6).mesh_str(), "cp=3,tp=2");
}

TEST(ParallelConfigTest, JsonRoundTripAndUnknownKeys) {
  ParallelConfig d = ParallelConfig::parse_mesh("dp_replicate=2,cp=2");
  nlohmann::json j = d;
  EXPECT_EQ(j.get<ParallelConfig>(), d);
  nlohmann::json typo = {{"tp", 2}, {"ppp", 2}};
  EXPECT_THAT([&] { typo.get<ParallelConfig>(); },
              ThrowsMessage<Error>(HasSubstr("parallel config: unknown field 'ppp'; valid: pp, dp_replicate, dp_shard, cp, tp, ep")));
  // Pipeline: pp is a mesh dim, vpp and the schedule knobs; interleaved 1F1B is the default
  // schedule of vpp > 1, and what does not fit is named with its arithmetic.
  nlohmann::json pipelined = {{"pp", 2}, {"vpp", 2}, {"micro_batches", 4}};
  ParallelConfig p = pipelined.get<ParallelConfig>();
  EXPECT_EQ(p.pp_schedule, pp::ScheduleKind::kInterleaved1F1B);
  EXPECT_EQ(p.name(), "pp2_vpp2_mb4");
  EXPECT_EQ(nlohmann::json(p)["pp_schedule"], "interleaved_1f1b");
  EXPECT_EQ(nlohmann::json(p).get<ParallelConfig>(), p);
  EXPECT_NO_THROW(p.validate(2));
  p.micro_batches = 3;
  EXPECT_THAT([&] { p.validate(2); }, ThrowsMessage<Error>(HasSubstr("micro_batches(3) is not a multiple of pp(2)")));
  nlohmann::json gpipe = {{"pp", 2}, {"pp_schedule", "gpipe"}, {"micro_batches", 2}};
  EXPECT_EQ(gpipe.get<ParallelConfig>().name(), "pp2_gpipe_mb2");
  nlohmann::json bad_schedule = {{"pp", 2}, {"pp_schedule", "zb"}};
  EXPECT_THAT([&] { bad_schedule.get<ParallelConfig>(); },
              ThrowsMessage<Error>(HasSubstr("unknown pipeline schedule 'zb': expected gpipe, 1f1b or interleaved_1f1b")));
  ParallelConfig with_ep = ParallelConfig::parse_mesh("pp=2,dp_shard=2,ep=2");
  EXPECT_THAT([&] { with_ep.validate(4); },
              ThrowsMessage<Error>(HasSubstr("pp(2) x vpp(1) with ep(2): expert parallelism inside pipeline stages is not supported yet")));
  // A vpp whose product with pp overflows an int is refused before anything multiplies them;
  // a schedule without pipeline stages is a knob with no effect.
  nlohmann::json overflow = {{"pp", 2}, {"vpp", 1073741824}, {"micro_batches", 2}};
  EXPECT_THAT([&] { overflow.get<ParallelConfig>().validate(2); },
              ThrowsMessage<Error>(HasSubstr("pp(2) x vpp(1073741824) = 2147483648 pipeline stages; at most 4096")));
  nlohmann::json idle = {{"dp_shard", 2}, {"pp_schedule", "gpipe"}};
  EXPECT_THAT([&] { idle.get<ParallelConfig>().validate(2); },
              ThrowsMessage<Error>(HasSubstr("pp_schedule 'gpipe' without pipeline stages (pp(1) x vpp(1)) has no effect")));
  ParallelConfig one_f_one_b = ParallelConfig::parse_mesh("pp=2");
  one_f_one_b.vpp = 2;
  one_f_one_b.micro_batches = 2;
  EXPECT_THAT([&] { one_f_one_b.validate(2); },
              ThrowsMessage<Error>(HasSubstr("1f1b runs one stage per rank, got vpp(2): use interleaved_1f1b")));
  ParallelConfig e = ParallelConfig::parse_mesh("dp_shard=2,ep=2");
  EXPECT_EQ(nlohmann::json(e).get<ParallelConfig>(), e);
  EXPECT_EQ(nlohmann::json(e)["ep"], 2);
}

// Strict types: a degree is a JSON integer in range, a knob a boolean, a dtype a known name.
TEST(ParallelConfigTest, JsonRejectsWrongTypesAndOverflowNamingTheField) {
  for (const auto& [j, says] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"dp_shard", 2.5}}, "'dp_shard' must be an integer, got 2.5"},
           {{{"dp_shard", true}}, "'dp_shard' must be an integer, got true"},
           {{{"tp", 2147483648LL}}, "'tp' must be an integer >= 1 that fits in 32 bits, got 2147483648"},
           {{{"tp", 0}}, "'tp' must be an integer >= 1"},
           {{{"micro_batches", "2"}}, "'micro_batches' must be an integer, got \"2\""},
           {{{"sequence_parallel", 1}}, "'sequence_parallel' must be true or false, got 1"},
           {{{"dtype", "fp8"}}, "unknown dtype 'fp8'; valid: [float32, float64, bfloat16, float16]"},
           {{{"seed", -1}}, "'seed' must be a non-negative integer, got -1"}}) {
    EXPECT_THAT([&] { j.get<ParallelConfig>(); }, ThrowsMessage<Error>(HasSubstr(says))) << j.dump();
  }
  ParallelConfig all = ParallelConfig::parse_mesh("dp_replicate=2,dp_shard=2,cp=2,tp=2");
  all.sequence_parallel = true;
  all.cp_layout = CpLayout::kZigzag;
  all.activation_checkpointing = true;
  all.micro_batches = 2;
  all.dtype = DType::kBFloat16;
  all.seed = 7;
  EXPECT_EQ(nlohmann::json(all).get<ParallelConfig>(), all);
  EXPECT_EQ(all.name(), "dp_replicate2_dp_shard2_cp2zz_tp2_sp_ac_mb2");
  EXPECT_EQ(::testing::PrintToString(all), "dp_replicate2_dp_shard2_cp2zz_tp2_sp_ac_mb2 bfloat16");
}

// The mesh dims are data: every part of the config that names an axis follows kMeshDims.
TEST(ParallelConfigTest, EveryMeshDimIsParsedNamedAndSerializedFromTheTable) {
  for (size_t i = 0; i < kMeshDims.size(); ++i) {
    const std::string name(kMeshDims[i].name);
    ParallelConfig c = ParallelConfig::parse_mesh(name + "=3");
    EXPECT_EQ(c.*kMeshDims[i].degree, 3) << name;
    EXPECT_EQ(c.world_size(), 3) << name;
    EXPECT_EQ(c.mesh_str(), name + "=3");
    EXPECT_EQ(nlohmann::json(c)[name], 3);
    EXPECT_THAT(c.name(), HasSubstr(std::string(kMeshDims[i].case_part) + "3"));
    EXPECT_EQ(MeshLayout(c, 3).all_groups(parse_mesh_axis(name)).size(), 1u) << name;
  }
}

TEST(MeshLayoutTest, RankIsRowMajorOverDpReplicateDpShardCpTp) {
  MeshLayout layout(ParallelConfig::parse_mesh("dp_replicate=2,dp_shard=2,cp=2,tp=2"), 16);
  EXPECT_EQ(layout.coordinates(0), (MeshCoordinates{0, 0, 0, 0, 0}));
  EXPECT_EQ(layout.coordinates(1), (MeshCoordinates{0, 0, 0, 0, 1}));
  EXPECT_EQ(layout.coordinates(6), (MeshCoordinates{0, 0, 1, 1, 0}));
  EXPECT_EQ(layout.coordinates(13), (MeshCoordinates{0, 1, 1, 0, 1}));
  // Rank 13 = (1, 1, 0, 1).
  EXPECT_THAT(layout.group_ranks(MeshAxis::kTp, 13), ElementsAre(12, 13));
  EXPECT_THAT(layout.group_ranks(MeshAxis::kCp, 13), ElementsAre(13, 15));
  EXPECT_THAT(layout.group_ranks(MeshAxis::kDpShard, 13), ElementsAre(9, 13));
  EXPECT_THAT(layout.group_ranks(MeshAxis::kDpReplicate, 13), ElementsAre(5, 13));
  EXPECT_THAT(layout.group_ranks(MeshAxis::kDpShardCp, 13), ElementsAre(9, 11, 13, 15));
  EXPECT_THAT(layout.group_ranks(MeshAxis::kDp, 13), ElementsAre(1, 5, 9, 13));
  EXPECT_THAT(layout.group_ranks(MeshAxis::kDpCp, 13), ElementsAre(1, 3, 5, 7, 9, 11, 13, 15));
  EXPECT_EQ(layout.group_ranks(MeshAxis::kWorld, 13).size(), 16u);
  EXPECT_EQ(layout.all_groups(MeshAxis::kTp).size(), 8u);
  EXPECT_EQ(layout.all_groups(MeshAxis::kDpCp).size(), 2u);
  EXPECT_THAT(layout.all_groups(MeshAxis::kDpCp)[1], ElementsAre(1, 3, 5, 7, 9, 11, 13, 15));
}

// pp is the outermost dim: a pp group takes one rank of every stage, the stage axis every
// other dim (the ranks holding one stage's parameters).
TEST(MeshLayoutTest, PipelineIsTheOutermostDim) {
  MeshLayout layout(ParallelConfig::parse_mesh("pp=2,dp_shard=2,tp=2"), 8);
  EXPECT_EQ(layout.coordinates(5), (MeshCoordinates{1, 0, 0, 0, 1}));
  EXPECT_THAT(layout.group_ranks(MeshAxis::kPp, 5), ElementsAre(1, 5));
  EXPECT_THAT(layout.group_ranks(MeshAxis::kStage, 5), ElementsAre(4, 5, 6, 7));
  EXPECT_THAT(layout.group_ranks(MeshAxis::kDpShard, 5), ElementsAre(5, 7));
  EXPECT_THAT(layout.group_ranks(MeshAxis::kDpCp, 5), ElementsAre(5, 7));
  EXPECT_EQ(layout.all_groups(MeshAxis::kPp).size(), 4u);
  EXPECT_EQ(ParallelConfig::parse_mesh("pp=2,tp=2").name(), "pp2_tp2");
}

TEST(MeshLayoutTest, EveryRankIsInExactlyOneGroupPerAxis) {
  ParallelConfig c = ParallelConfig::parse_mesh("dp_replicate=3,dp_shard=2,cp=2,ep=2");
  MeshLayout layout(c, 12);
  for (MeshAxis axis : kAllMeshAxes) {
    std::map<int, int> seen;
    for (const auto& g : layout.all_groups(axis)) {
      for (int r : g) ++seen[r];
    }
    ASSERT_EQ(seen.size(), 12u) << mesh_axis_name(axis);
    for (const auto& [r, n] : seen) EXPECT_EQ(n, 1) << mesh_axis_name(axis) << " rank " << r;
  }
}

TEST(MeshAxisTest, NamesRoundTrip) {
  for (MeshAxis axis : kAllMeshAxes) EXPECT_EQ(parse_mesh_axis(mesh_axis_name(axis)), axis);
  EXPECT_THAT([] { parse_mesh_axis("vpp"); }, ThrowsMessage<Error>(HasSubstr("unknown mesh axis 'vpp'; valid: [world, dp_replicate, dp_shard, cp, tp, dp, dp_shard_cp, dp_cp, ep, edp, pp, stage]")));
}

// A real 2x2 (dp_shard x tp) mesh on thread ranks: each axis's communicator has the
// layout's ranks, sums over exactly them, and axes with equal members share a backend.
TEST(DeviceMeshTest, BuildsOneGroupPerAxisWithTheLayoutsRanks) {
  const ParallelConfig dims = ParallelConfig::parse_mesh("dp_shard=2,tp=2");
  MeshLayout layout(dims, 4);
  std::mutex mutex;
  std::map<int, nlohmann::json> described;
  auto errors = testing::run_mesh(dims, [&](DeviceMesh& mesh) {
    for (MeshAxis axis : kAllMeshAxes) {
      Communicator& comm = mesh.comm(axis);
      std::vector<int> expected = layout.group_ranks(axis, mesh.rank());
      EXPECT_EQ(comm.ranks(), expected) << mesh_axis_name(axis);
      EXPECT_EQ(comm.axis(), mesh_axis_name(axis));
      // Sum of (global rank + 1) over the axis proves the group really has these members.
      at::Tensor t = at::full({1}, mesh.rank() + 1.0, at::kDouble);
      comm.all_reduce(t);
      double want = 0;
      for (int r : expected) want += r + 1;
      EXPECT_EQ(t.item<double>(), want) << mesh_axis_name(axis) << " on rank " << mesh.rank();
    }
    EXPECT_EQ(mesh.comm(MeshAxis::kCp).group().backend(), compat::BackendKind::kSelf);
    EXPECT_EQ(mesh.comm(MeshAxis::kTp).group().backend(), compat::BackendKind::kGloo);
    std::lock_guard<std::mutex> lock(mutex);
    described[mesh.rank()] = mesh.to_json();
  });
  ASSERT_THAT(errors, ::testing::IsEmpty());
  EXPECT_EQ(described[3]["coordinates"]["dp_shard"], 1);
  EXPECT_EQ(described[3]["coordinates"]["tp"], 1);
  EXPECT_EQ(described[3]["axes"]["dp_shard_cp"]["ranks"], nlohmann::json({1, 3}));
  EXPECT_EQ(described[3]["axes"]["cp"]["pg_backend"], "self");
}

TEST(DeviceMeshTest, TwoMeshesOnOneStoreDoNotShareKeys) {
  const ParallelConfig dims = ParallelConfig::parse_mesh("tp=2");
  compat::Store store = compat::make_hash_store(std::chrono::seconds(20));
  MeshOptions options;
  options.group = testing::thread_group_options();
  auto errors = testing::run_ranks(2, [&](int rank) {
    DeviceMesh first(dims, store, rank, 2, options);
    DeviceMesh second(dims, store, rank, 2, options);
    at::Tensor t = at::ones({1});
    second.comm(MeshAxis::kTp).all_reduce(t);
    first.comm(MeshAxis::kTp).all_reduce(t);
    EXPECT_EQ(t.item<float>(), 4.0f);
  });
  EXPECT_THAT(errors, ::testing::IsEmpty());
}

}  // namespace
}  // namespace mih
