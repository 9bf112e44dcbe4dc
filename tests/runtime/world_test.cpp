// World::from_env for torchrun, SLURM and Open MPI variables, and the errors for partial,
// malformed, out-of-range and contradictory ones.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/runtime/world.h"

namespace mih {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(WorldTest, NoLauncherIsOneProcess) {
  World w = World::from_env({{"HOME", "/root"}});
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.world_size, 1);
  EXPECT_EQ(w.source, LaunchSource::kSingleProcess);
}

TEST(WorldTest, ReadsTorchrunVariables) {
  World w = World::from_env({{"RANK", "5"},
                             {"WORLD_SIZE", "8"},
                             {"LOCAL_RANK", "1"},
                             {"LOCAL_WORLD_SIZE", "4"},
                             {"MASTER_ADDR", "node0"},
                             {"MASTER_PORT", "29511"}});
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.world_size, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 4);
  EXPECT_EQ(w.master_addr, "node0");
  EXPECT_EQ(w.master_port, 29511);
  EXPECT_EQ(w.source, LaunchSource::kTorchrun);
  EXPECT_EQ(w.describe(), "rank 5 of 8 (local 1 of 4) from torchrun variables");
}

TEST(WorldTest, TorchrunWithoutLocalVariablesIsOneHost) {
  World w = World::from_env({{"RANK", "2"}, {"WORLD_SIZE", "4"}});
  EXPECT_EQ(w.local_rank, 2);
  EXPECT_EQ(w.local_world_size, 4);
}

TEST(WorldTest, ReadsSlurmVariables) {
  World w = World::from_env({{"SLURM_PROCID", "9"},
                             {"SLURM_NTASKS", "12"},
                             {"SLURM_LOCALID", "1"},
                             {"SLURM_NODEID", "2"},
                             {"SLURM_TASKS_PER_NODE", "4(x2),3,1"}});
  EXPECT_EQ(w.rank, 9);
  EXPECT_EQ(w.world_size, 12);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 3);  // node 2 is the "3" after two nodes of 4
  EXPECT_EQ(w.source, LaunchSource::kSlurm);
}

TEST(WorldTest, SlurmFallsBackToNtasksPerNode) {
  World w = World::from_env(
      {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "2"}});
  EXPECT_EQ(w.local_world_size, 2);
}

TEST(WorldTest, ReadsOpenMpiVariables) {
  World w = World::from_env({{"OMPI_COMM_WORLD_RANK", "3"},
                             {"OMPI_COMM_WORLD_SIZE", "4"},
                             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.world_size, 4);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 2);
  EXPECT_EQ(w.source, LaunchSource::kOpenMpi);
}

TEST(WorldTest, TorchrunInsideSrunUsesTorchrun) {
  // `srun -N2 torchrun --nproc-per-node=4`: one SLURM task per node, RANK per process.
  World w = World::from_env({{"RANK", "6"},
                             {"WORLD_SIZE", "8"},
                             {"LOCAL_RANK", "2"},
                             {"LOCAL_WORLD_SIZE", "4"},
                             {"SLURM_PROCID", "1"},
                             {"SLURM_NTASKS", "2"},
                             {"SLURM_LOCALID", "0"}});
  EXPECT_EQ(w.rank, 6);
  EXPECT_EQ(w.source, LaunchSource::kTorchrun);
}

TEST(WorldTest, RejectsRankWithoutWorldSize) {
  EXPECT_THAT([] { World::from_env({{"RANK", "1"}}); },
              ThrowsMessage<Error>(AllOf(HasSubstr("incomplete torchrun environment"), HasSubstr("RANK='1' is set"),
                                         HasSubstr("WORLD_SIZE is not"))));
}

TEST(WorldTest, RejectsLocalRankWithoutLocalWorldSize) {
  EXPECT_THAT([] { World::from_env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}}); },
              ThrowsMessage<Error>(AllOf(HasSubstr("LOCAL_RANK='1' is set"), HasSubstr("LOCAL_WORLD_SIZE is not"))));
}

TEST(WorldTest, RejectsLocalRankAlone) {
  EXPECT_THAT([] { World::from_env({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"}}); },
              ThrowsMessage<Error>(HasSubstr("LOCAL_RANK='0' is set without RANK and WORLD_SIZE")));
}

TEST(WorldTest, RejectsPartialSlurm) {
  EXPECT_THAT([] { World::from_env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}); },
              ThrowsMessage<Error>(AllOf(HasSubstr("incomplete SLURM environment"), HasSubstr("SLURM_LOCALID is not"))));
  EXPECT_THAT([] { World::from_env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}}); },
              ThrowsMessage<Error>(HasSubstr("neither SLURM_TASKS_PER_NODE with SLURM_NODEID nor SLURM_NTASKS_PER_NODE")));
}

TEST(WorldTest, RejectsPartialOpenMpi) {
  EXPECT_THAT([] { World::from_env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}); },
              ThrowsMessage<Error>(AllOf(HasSubstr("incomplete Open MPI environment"),
                                         HasSubstr("OMPI_COMM_WORLD_LOCAL_RANK is not"))));
}

TEST(WorldTest, RejectsMasterAddrWithoutPort) {
  EXPECT_THAT([] { World::from_env({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}}); },
              ThrowsMessage<Error>(AllOf(HasSubstr("MASTER_ADDR='h' is set"), HasSubstr("MASTER_PORT is not"))));
}

TEST(WorldTest, RejectsMalformedAndOutOfRangeValues) {
  EXPECT_THAT([] { World::from_env({{"RANK", "one"}, {"WORLD_SIZE", "2"}}); },
              ThrowsMessage<Error>(HasSubstr("RANK='one' is not an integer")));
  EXPECT_THAT([] { World::from_env({{"RANK", "2"}, {"WORLD_SIZE", "2"}}); },
              ThrowsMessage<Error>(HasSubstr("RANK=2: expected a rank in [0, WORLD_SIZE=2)")));
  EXPECT_THAT([] { World::from_env({{"RANK", "0"}, {"WORLD_SIZE", "0"}}); },
              ThrowsMessage<Error>(HasSubstr("WORLD_SIZE=0: expected a world size >= 1")));
  EXPECT_THAT(
      [] { World::from_env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}); },
      ThrowsMessage<Error>(HasSubstr("LOCAL_RANK=2: expected a local rank in [0, LOCAL_WORLD_SIZE=2)")));
  EXPECT_THAT([] { World::from_env({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}}); },
              ThrowsMessage<Error>(HasSubstr("MASTER_PORT=70000: expected a TCP port in [1, 65535]")));
}

TEST(WorldTest, RejectsContradictoryLaunchers) {
  // srun started one task per rank and somebody also set RANK: they must agree.
  EXPECT_THAT(
      [] {
        World::from_env({{"RANK", "1"},
                         {"WORLD_SIZE", "4"},
                         {"SLURM_PROCID", "2"},
                         {"SLURM_NTASKS", "4"},
                         {"SLURM_LOCALID", "2"},
                         {"SLURM_NTASKS_PER_NODE", "4"}});
      },
      ThrowsMessage<Error>(AllOf(HasSubstr("contradictory launcher environment"), HasSubstr("RANK=1"),
                                 HasSubstr("SLURM_PROCID=2"))));
  EXPECT_THAT(
      [] {
        World::from_env({{"RANK", "0"},
                         {"WORLD_SIZE", "2"},
                         {"OMPI_COMM_WORLD_RANK", "1"},
                         {"OMPI_COMM_WORLD_SIZE", "2"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
      },
      ThrowsMessage<Error>(AllOf(HasSubstr("RANK=0"), HasSubstr("OMPI_COMM_WORLD_RANK=1"))));
}

TEST(WorldTest, ErrorsAreInvalidSpec) {
  try {
    World::from_env({{"RANK", "1"}});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidSpec);
  }
}

}  // namespace
}  // namespace mih
