// The case record (harness/contract/case_record.h): what the parent writes to case_run.json is read
// back field for field, and a record that is not exactly that (a field removed, one added, an
// outcome mih does not write, digests naming a file outside the case directory) is refused
// naming what is wrong, never read with defaults.
#include "harness/contract/case_record.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

CaseRecord example() {
  CaseRecord r;
  r.spec = "llama";
  r.case_name = "DpShard2";
  r.kind = spec::CaseKind::kTrain;
  r.group = "axis";
  r.config.dp_shard = 2;
  r.world_size = 2;
  r.compare_to = "Reference";
  r.matrix = MatrixSource::parse("cpu-smoke");
  r.training_backend = "trainer";
  r.fingerprint = "6513fcd9ef8b594b";
  r.fault = "F03";
  r.fault_reached = true;
  r.seconds = 0.7;
  r.launch_seconds = {0.7};
  r.timing = {0.05, 0.07, 0.41, 0.1, 0.07};
  r.started_by = {{"train", {"fork_server", "exec"}}};
  r.state = "STRUCTURE_VALIDATED";
  r.outcome = Outcome::kRan;
  r.files = {{"cases/runtime/metrics.jsonl", std::string(64, 'a')}};
  return r;
}

// The error a record of `j` gets, read from a file as mih check reads it.
Error refusal(const json& j) {
  const auto file = testing::temp_dir("case_record") / "case_run.json";
  std::ofstream(file) << j.dump();
  try {
    (void)read_case_record(file);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "read_case_record accepted " << j.dump();
  return Error(Code::kOk, "");
}

TEST(CaseRecordTest, WhatIsWrittenIsReadBackFieldForField) {
  const CaseRecord r = example();
  const json j = r;
  EXPECT_EQ(j.at("case"), "DpShard2");
  EXPECT_EQ(j.at("outcome"), "ran");
  EXPECT_TRUE(j.at("init_from").is_null());  // the seed's initialization
  const CaseRecord back = j.get<CaseRecord>();
  EXPECT_EQ(json(back), j);
  EXPECT_EQ(back.outcome, Outcome::kRan);
  EXPECT_EQ(back.fault_reached, std::optional<bool>(true));
  EXPECT_EQ(back.timing.training_s, 0.41);
  EXPECT_EQ(back.started_by.at("train").at(1), "exec");
  CaseRecord no_fault = example();
  no_fault.fault = "";
  no_fault.fault_reached.reset();
  EXPECT_FALSE(json(no_fault).contains("fault_reached"));
  EXPECT_FALSE(json(no_fault).get<CaseRecord>().fault_reached.has_value());
}

// The record starts from the request its ranks read: the same case, matrix, fault and init source.
TEST(CaseRecordTest, StartsFromTheCaseRequest) {
  CaseRequest q;
  q.spec = "llama";
  q.c.name = "Tp2";
  q.c.kind = spec::CaseKind::kTrain;
  q.c.group = "axis";
  q.c.config.tp = 2;
  q.c.compare_to = "Reference";
  q.matrix = MatrixSource::parse("cpu-smoke@float32");
  q.training_backend = "trainer";
  q.fault = "F03";
  q.init_from = "/ckpt";
  q.init_from_sha256 = "ab";
  q.fingerprint = "fp";
  q.case_timeout = std::chrono::seconds(42);
  q.collective_timeout = std::chrono::seconds(7);
  const CaseRecord r = record_of(q);
  EXPECT_EQ(r.spec, "llama");
  EXPECT_EQ(r.case_name, "Tp2");
  EXPECT_EQ(r.world_size, 2);
  EXPECT_EQ(r.config.tp, 2);
  EXPECT_EQ(r.compare_to, "Reference");
  EXPECT_EQ(r.matrix.text(), "cpu-smoke@float32");
  EXPECT_EQ(r.fault, "F03");
  EXPECT_EQ(r.init_from, "/ckpt");
  EXPECT_EQ(r.init_from_sha256, "ab");
  EXPECT_EQ(r.fingerprint, "fp");
  EXPECT_EQ(r.case_timeout, std::chrono::seconds(42));
  EXPECT_EQ(r.collective_timeout, std::chrono::seconds(7));
}

// The one list of a case's launches (the local runner, `mih run --prepare`, `mih submit` and
// the rank's check of its --phase follow it): a resume saves under save_config's ranks, then
// loads under the case's; every other case trains once.
TEST(CaseRecordTest, PhasesOfACase) {
  spec::Case train;
  train.config.tp = 2;
  const std::vector<CasePhase> one = case_phases(train);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].name, "train");
  EXPECT_EQ(one[0].world_size, 2);
  spec::Case resume = train;
  resume.save_config = ParallelConfig::parse_mesh("dp_shard=4");
  const std::vector<CasePhase> two = case_phases(resume);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].name, "save");
  EXPECT_EQ(two[0].world_size, 4);
  EXPECT_EQ(two[1].name, "load");
  EXPECT_EQ(two[1].world_size, 2);
  for (const CasePhase& p : two) {
    EXPECT_NE(std::find(kCasePhases.begin(), kCasePhases.end(), p.name), kCasePhases.end()) << p.name;
  }
}

TEST(CaseRecordTest, AnEditedRecordIsRefusedNamingWhatIsWrong) {
  const json good = example();
  struct Edit {
    const char* what;
    std::function<void(json&)> edit;
    const char* named;
  };
  const std::vector<Edit> edits = {
      {"outcome removed", [](json& j) { j.erase("outcome"); }, "outcome"},
      {"kind removed", [](json& j) { j.erase("kind"); }, "kind"},
      {"a field added", [](json& j) { j["verdict"] = "pass"; }, "unknown field 'verdict'"},
      {"an outcome mih does not write", [](json& j) { j["outcome"] = "passed"; }, "outcome 'passed' is none mih writes"},
      {"seconds as a string", [](json& j) { j["seconds"] = "0.7"; }, "seconds"},
      {"a digest outside the case", [](json& j) { j["files"]["../../etc/passwd"] = std::string(64, 'a'); }, "../../etc/passwd"},
      {"an absolute digest path", [](json& j) { j["files"]["/etc/passwd"] = std::string(64, 'a'); }, "/etc/passwd"},
      {"a digest that is no SHA-256", [](json& j) { j["files"]["check/findings.json"] = "abc"; }, "not a SHA-256"},
      {"world_size not the config's", [](json& j) { j["world_size"] = 4; }, "world_size 4"},
      {"timing with a field added", [](json& j) { j["timing"]["gpu_s"] = 1; }, "gpu_s"},
      // Found by a hostile trial of this round: each was read as a record mih wrote.
      {"a float world_size", [](json& j) { j["world_size"] = 1.7; }, "world_size"},
      {"no digests", [](json& j) { j["files"] = json::object(); }, "lists no evidence digest"},
      {"an unreached fault without a fault",
       [](json& j) {
         j["fault"] = "";
         j.erase("fault_reached");
         j["outcome"] = "fault_not_reached";
       },
       "without a fault"},
      {"fault_reached without a fault", [](json& j) { j["fault"] = ""; }, "'fault_reached' in a record without a fault"},
      {"a verify-only outcome", [](json& j) { j["outcome"] = "verify_only"; }, "writes no record"},
      {"negative seconds", [](json& j) { j["seconds"] = -5; }, "not negative"},
      {"a matrix that is an option", [](json& j) { j["matrix"] = "--gtest_also_run_disabled_tests"; }, "matrix"},
      // The request's timeouts (issue 36): integers, a positive case timeout.
      {"case_timeout_ms removed", [](json& j) { j.erase("case_timeout_ms"); }, "case_timeout_ms"},
      {"a float case timeout", [](json& j) { j["case_timeout_ms"] = 1.5; }, "case_timeout_ms"},
      {"a zero case timeout", [](json& j) { j["case_timeout_ms"] = 0; }, "case_timeout_ms"},
      {"a negative collective timeout", [](json& j) { j["collective_timeout_ms"] = -1; }, "collective_timeout_ms"},
      {"a fingerprint that is no digest", [](json& j) { j["fingerprint"] = "zzz"; }, "not the 16 hex digits"},
      // An outcome edited over a passing case's record (the last hostile trial: exit 1 with an
      // empty reason).
      {"failed without a reason", [](json& j) { j["outcome"] = "failed"; }, "no reason"},
      {"failed in a validated state",
       [](json& j) {
         j["outcome"] = "failed";
         j["error"] = "loss diverged";
       },
       "state 'STRUCTURE_VALIDATED'"},
      {"ran with an error", [](json& j) { j["error"] = "rank 1 died"; }, "a case that ran to its end records none"},
  };
  for (const auto& e : edits) {
    json j = good;
    e.edit(j);
    const Error err = refusal(j);
    EXPECT_EQ(err.code(), Code::kFailedPrecondition) << e.what;
    EXPECT_THAT(err.message(), HasSubstr(e.named)) << e.what;
    EXPECT_THAT(err.message(), HasSubstr("case_run.json")) << e.what;
    EXPECT_THAT(err.message(), HasSubstr("rerun the case")) << e.what;
  }
  EXPECT_THAT(refusal(json::array({1, 2})).message(), HasSubstr("is not a JSON object"));
}

}  // namespace
}  // namespace mih
