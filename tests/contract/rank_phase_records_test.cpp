// A rank's records of its phase read typed (harness/contract/rank_phase_records.h): what the
// case task writes reads back whole, and a missing, mistyped or unknown field, or a file that is
// not JSON, is a refusal naming the file and the field (it was read with defaults before: a
// damaged timing counted 0 seconds, a torn fault record counted as not reached).
#include "harness/contract/rank_phase_records.h"

#include <functional>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "tests/support/temp_dir.h"

namespace mih::contract {
namespace {

using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

const json kTiming = {{"process_start_s", 0.5}, {"rendezvous_s", 0.25}, {"build_s", 1.0}, {"steps_s", 2},
                      {"end_s", 0.125}, {"session_s", 0.375}};

std::filesystem::path written(const std::string& name, const json& j) {
  const std::filesystem::path file = testing::temp_dir("rank_phase_records") / name;
  write_file_atomic(file, j.dump());
  return file;
}

// The refusal of reading `j` as written to a file, with its code.
std::string refusal(const std::function<void(const std::filesystem::path&)>& read, const json& j) {
  const std::filesystem::path file = written("record.json", j);
  try {
    read(file);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition) << e.message();
    EXPECT_THAT(e.message(), AllOf(HasSubstr(file.string()), HasSubstr("rerun the case")));
    return e.message();
  }
  ADD_FAILURE() << "read " << j.dump();
  return "";
}

TEST(RankPhaseRecordsTest, WhatARankWritesReadsBack) {
  const RankTiming t = read_rank_timing(written("timing_rank0.json", kTiming));
  EXPECT_EQ(t.process_start_s, 0.5);
  EXPECT_EQ(t.rendezvous_s, 0.25);
  EXPECT_EQ(t.build_s, 1.0);
  EXPECT_EQ(t.steps_s, 2.0);
  EXPECT_EQ(t.end_s, 0.125);
  EXPECT_EQ(t.session_s, 0.375);
  EXPECT_FALSE(t.init_from_s.has_value());
  json with_init = kTiming;
  with_init["init_from_s"] = 0.75;
  with_init["init_from_parameters"] = 12;
  const RankTiming i = read_rank_timing(written("timing_rank1.json", with_init));
  EXPECT_EQ(i.init_from_s, 0.75);
  EXPECT_EQ(i.init_from_parameters, 12);
  const RankFaultReach f = read_rank_fault_reach(written("fault_rank0.json", {{"fault", "F03"}, {"reached", true}}));
  EXPECT_EQ(f.fault, "F03");
  EXPECT_TRUE(f.reached);
  const RankInitFromFailure e = read_rank_init_from_failure(
      written("init_from_failed_rank0.json", {{"checkpoint", "/ckpt"}, {"code", "INVALID_SPEC"}, {"error", "gone"}}));
  EXPECT_EQ(e.checkpoint, "/ckpt");
  EXPECT_EQ(e.code, "INVALID_SPEC");
  EXPECT_EQ(e.error, "gone");
}

TEST(RankPhaseRecordsTest, ADamagedRecordIsRefusedNamingTheField) {
  const auto timing = [](const std::filesystem::path& f) { (void)read_rank_timing(f); };
  json missing = kTiming;
  missing.erase("steps_s");
  EXPECT_THAT(refusal(timing, missing), HasSubstr("field 'steps_s' is missing"));
  json mistyped = kTiming;
  mistyped["build_s"] = true;  // nlohmann would read a boolean as 1 second
  EXPECT_THAT(refusal(timing, mistyped), HasSubstr("'build_s'"));
  json unknown = kTiming;
  unknown["build_ms"] = 1;
  EXPECT_THAT(refusal(timing, unknown), HasSubstr("unknown field 'build_ms'"));
  const auto fault = [](const std::filesystem::path& f) { (void)read_rank_fault_reach(f); };
  EXPECT_THAT(refusal(fault, {{"fault", "F03"}, {"reached", 1}}), HasSubstr("field 'reached' is 1"));
  EXPECT_THAT(refusal(fault, {{"fault", "F03"}}), HasSubstr("field 'reached' is missing"));
  const auto init = [](const std::filesystem::path& f) { (void)read_rank_init_from_failure(f); };
  EXPECT_THAT(refusal(init, {{"checkpoint", "/ckpt"}, {"error", "gone"}}), HasSubstr("field 'code' is missing"));
  EXPECT_THAT(refusal(init, json::array()), HasSubstr("expected a JSON object"));
  const std::filesystem::path torn = written("torn.json", json());
  write_file_atomic(torn, "{\"fault\": \"F03\", \"rea");
  EXPECT_THROW(read_rank_fault_reach(torn), Error);
}

}  // namespace
}  // namespace mih::contract
