// `mih reach` through the real binary on evidence roots written here: it names the reduction
// path no case took (with the smallest mesh that takes it), passes when every path the run's
// largest mesh can take was taken, gives no verdict on a run missing cases, and refuses
// evidence it cannot read. The main job's own root is checked by ctest `reference/reach`.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/files.h"
#include "harness/runtime/launcher.h"
#include "harness/runtime/worker.h"
#include "tests/support/mih_cli.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

using testing::CliRun;

CliRun mih(const std::string& args) { return testing::run_mih(args); }

// A case's record of the paths its runtime took, each over an axis of 2 ranks.
void write_paths(const fs::path& root, const std::string& spec_case, const std::vector<std::string>& paths) {
  json j = {{"through_step", 2}, {"paths", json::object()}};
  for (const auto& p : paths) j["paths"][p] = {{"axis_size", 2}, {"parameters", json::array()}};
  write_file_atomic(root / spec_case / "cases/runtime/reduction_paths.json", j.dump());
}

// A run root of the llama on a matrix of the Reference and DpShard2 (2 ranks at most).
fs::path two_rank_run(const std::string& name) {
  const fs::path dir = testing::temp_dir(name), root = dir / "root";
  write_file_atomic(dir / "matrix.json",
                    json({{"name", "two"}, {"dtype", "float64"}, {"cases", {{{"dp_shard", 2}}}}}).dump());
  write_file_atomic(root / "run.json", json({{"matrix", (dir / "matrix.json").string()},
                                             {"registrations", {{{"prefix", "Llama"},
                                                                 {"spec", "llama"},
                                                                 {"matrix", (dir / "matrix.json").string()},
                                                                 {"training_backend", "trainer"}}}}})
                                           .dump());
  write_paths(root, "llama/Reference", {});
  write_paths(root, "llama/DpShard2",
              {"dense.fsdp.dp_shard", "grad_norm.world", "loss.valid_tokens.dp_cp", "loss.sum.dp_cp"});
  return root;
}

TEST(CliReachTest, NamesThePathsNoCaseTookWithTheirSmallestMesh) {
  const fs::path root = two_rank_run("reach_names");
  CliRun report = mih("reach " + shell_quote(root.string()));
  EXPECT_EQ(report.status, 0) << report.output;  // without --require-all it only reports
  CliRun required = mih("reach " + shell_quote(root.string()) + " --require-all");
  EXPECT_EQ(required.status, 1) << required.output;
  EXPECT_THAT(required.output,
              AllOf(HasSubstr("the largest has 2 ranks"), HasSubstr("dense.fsdp.dp_shard"), HasSubstr("llama/DpShard2"),
                    HasSubstr("NOT REACHED by any case (smallest mesh: dp_replicate=2): a dense gradient summed over "
                              "the replicas, whole: plain data parallelism (DDP)"),
                    HasSubstr("NOT REACHED by any case (smallest mesh: dp_shard=2): a dense gradient FSDP does not "
                              "shard"),
                    HasSubstr("beyond this run: needs 4 ranks (dp_replicate=2,dp_shard=2)"),
                    HasSubstr("no case of the run took dense.unsharded.tp, dense.unsharded.dp_replicate, "
                              "dense.unsharded.cp, dense.unsharded.dp_shard, loss.micro_batches")));
  // A case that takes the missing paths (present, even if the matrix does not list it).
  write_paths(root, "llama/Extra",
              {"dense.unsharded.tp", "dense.unsharded.dp_replicate", "dense.unsharded.cp", "dense.unsharded.dp_shard",
               "loss.micro_batches"});
  CliRun all = mih("reach " + shell_quote(root.string()) + " --require-all");
  EXPECT_EQ(all.status, 0) << all.output;
  EXPECT_THAT(all.output, AllOf(HasSubstr("every reduction path a mesh of 2 ranks can take was taken"),
                                HasSubstr("dense.unsharded.dp_replicate"), HasSubstr("llama/Extra"),
                                Not(HasSubstr("NOT REACHED"))));
}

TEST(CliReachTest, GivesNoVerdictOnARunMissingCases) {
  const fs::path root = two_rank_run("reach_partial");
  fs::remove_all(root / "llama" / "DpShard2");
  CliRun partial = mih("reach " + shell_quote(root.string()) + " --require-all");
  EXPECT_EQ(partial.status, 12) << partial.output;
  EXPECT_THAT(partial.output, AllOf(HasSubstr("1 case(s) of the run's matrices have no "
                                              "cases/runtime/reduction_paths.json: llama/DpShard2"),
                                    HasSubstr("is not a complete run (1 of 2 cases have no evidence)")));
}

TEST(CliReachTest, RefusesEvidenceItCannotRead) {
  const fs::path root = two_rank_run("reach_hostile");
  write_file_atomic(root / "llama/DpShard2/cases/runtime/reduction_paths.json", "{\"paths\": ");
  CliRun broken = mih("reach " + shell_quote(root.string()));
  EXPECT_EQ(broken.status, 12) << broken.output;
  EXPECT_THAT(broken.output, AllOf(HasSubstr("llama/DpShard2/cases/runtime/reduction_paths.json is not JSON"),
                                   HasSubstr("rerun the case")));
  write_paths(root, "llama/DpShard2", {"dense.ddp.dp_replicate"});
  CliRun foreign = mih("reach " + shell_quote(root.string()));
  EXPECT_EQ(foreign.status, 12) << foreign.output;
  EXPECT_THAT(foreign.output, HasSubstr("reduction path 'dense.ddp.dp_replicate' is not one of this binary's"));
  fs::remove(root / "run.json");
  CliRun no_run = mih("reach " + shell_quote(root.string()));
  EXPECT_EQ(no_run.status, 12) << no_run.output;
  EXPECT_THAT(no_run.output, HasSubstr("run.json: no such file"));
  CliRun missing = mih("reach " + shell_quote((root / "nowhere").string()));
  EXPECT_EQ(missing.status, 12) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("is not a directory"));
}

}  // namespace
}  // namespace mih
