// run.json read typed (harness/contract/run_record.h): a record as `mih test` writes it reads
// back whole, an absent field is nullopt, and a field of another type, a registration without
// its four strings or an init source without its dir and digest is a named refusal.
#include "harness/contract/run_record.h"

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

json written() {
  return {{"matrix", "default"},
          {"registrations",
           {{{"prefix", "Llama"}, {"spec", "llama"}, {"matrix", "m.json"}, {"training_backend", "trainer"}}}},
          {"init_from", {{"llama", {{"dir", "/ckpt"}, {"sha256", "ab"}}}}}};
}

std::string refusal(const json& record) {
  try {
    (void)parse_run_record(record, "root/run.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition) << e.what();
    return e.what();
  }
  return "(accepted)";
}

TEST(RunRecordTest, ReadsWhatTheRunWrote) {
  const auto file = testing::temp_dir("run_record") / "run.json";
  write_file_atomic(file, written().dump());
  const RunRecord r = read_run_record(file);
  EXPECT_EQ(r.matrix, "default");
  ASSERT_TRUE(r.registrations.has_value());
  ASSERT_EQ(r.registrations->size(), 1u);
  EXPECT_EQ(r.registrations->at(0).prefix, "Llama");
  EXPECT_EQ(r.registrations->at(0).spec, "llama");
  EXPECT_EQ(r.registrations->at(0).matrix, "m.json");
  EXPECT_EQ(r.registrations->at(0).training_backend, "trainer");
  ASSERT_TRUE(r.init_from.has_value());
  EXPECT_EQ(r.init_from->at("llama").dir, "/ckpt");
  EXPECT_EQ(r.init_from->at("llama").sha256, "ab");
}

TEST(RunRecordTest, AnAbsentFieldIsNullopt) {
  const RunRecord r = parse_run_record(json::object(), "run.json");
  EXPECT_FALSE(r.matrix.has_value());
  EXPECT_FALSE(r.registrations.has_value());
  EXPECT_FALSE(r.init_from.has_value());
}

TEST(RunRecordTest, AFieldOfAnotherShapeIsNamed) {
  json r = written();
  r["matrix"] = 5;
  EXPECT_THAT(refusal(r), AllOf(HasSubstr("root/run.json: 'matrix' must be a string, got 5"),
                                HasSubstr("not the run.json `mih test` writes")));
  EXPECT_THAT(refusal(json::array({1})), HasSubstr("the record must be a JSON object"));
  r = written();
  r["registrations"][0].erase("spec");  // read as no spec before: a registration of nothing
  EXPECT_THAT(refusal(r), HasSubstr("each of 'registrations' must be an object with 'prefix', 'spec', 'matrix' and "
                                    "'training_backend' strings"));
  r = written();
  r["init_from"]["llama"].erase("dir");  // read as "" before: no checkpoint, silently
  EXPECT_THAT(refusal(r), HasSubstr("'init_from.llama' must be an object whose 'dir' and 'sha256' are strings"));
  r = written();
  r["init_from"] = json::array();
  EXPECT_THAT(refusal(r), HasSubstr("'init_from' must be an object"));
}

}  // namespace
}  // namespace mih::contract
