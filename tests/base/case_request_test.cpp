// The case request (harness/base/case_request.h): what the parent writes to run/case.json is
// read back field for field, and a file that is not exactly that (an unknown field, a missing
// one, a case edited by hand) is refused naming what is wrong, never read with defaults.
#include "harness/base/case_request.h"

#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

CaseRequest example() {
  CaseRequest r;
  r.spec = "llama";
  r.c.name = "ResumeDpShard2ToTp2";
  r.c.kind = spec::CaseKind::kCrossResume;
  r.c.group = "cross_resume";
  r.c.config.tp = 2;
  r.c.save_config = ParallelConfig{};
  r.c.save_config->dp_shard = 2;
  r.c.resume_at = 2;
  r.c.compare_to = "Tp2";
  r.matrix = "cpu-smoke@float32,seed=2";
  r.training_backend = "trainer";
  r.fault = "F11";
  r.init_from = "/ckpt";
  r.init_from_sha256 = "ab";
  return r;
}

Code code_of(const json& j) {
  try {
    (void)j.get<CaseRequest>();
  } catch (const Error& e) {
    return e.code();
  }
  return Code::kOk;
}

TEST(CaseRequestTest, RoundTripsEveryField) {
  const CaseRequest r = example();
  const json j = r;
  const CaseRequest back = j.get<CaseRequest>();
  EXPECT_EQ(json(back), j);
  EXPECT_EQ(back.c.kind, spec::CaseKind::kCrossResume);
  ASSERT_TRUE(back.c.save_config.has_value());
  EXPECT_EQ(back.c.save_config->dp_shard, 2);
  EXPECT_EQ(back.init_from_sha256, "ab");
}

TEST(CaseRequestTest, RefusesWhatMihDoesNotWrite) {
  json j = example();
  j["typo"] = 1;
  EXPECT_NE(code_of(j), Code::kOk) << "an unknown field was accepted";
  j = example();
  j.erase("fault");
  EXPECT_EQ(code_of(j), Code::kFailedPrecondition) << "a missing field was read with a default";
  j = example();
  j["case"].erase("kind");  // read as "train" before the case had a type
  EXPECT_NE(code_of(j), Code::kOk) << "a case without its kind was accepted";
  j = example();
  j["case"]["kind"] = "resumed";
  EXPECT_NE(code_of(j), Code::kOk);
  j = example();
  j.erase("init_from");
  j.erase("init_from_sha256");
  EXPECT_EQ(code_of(j), Code::kOk) << "init_from is optional (the seed's initialization)";
}

TEST(CaseRequestTest, ReadingAFileNamesIt) {
  const auto dir = testing::temp_dir("case_request");
  const auto file = dir / "case.json";
  try {
    (void)read_case_request(file);
    ADD_FAILURE() << "a missing case file was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition);
    EXPECT_THAT(e.what(), HasSubstr(file.string()));
  }
  std::ofstream(file) << "[1, 2]";
  EXPECT_THROW((void)read_case_request(file), Error);
  std::ofstream(file, std::ios::trunc) << json(example()).dump();
  EXPECT_EQ(read_case_request(file).c.name, "ResumeDpShard2ToTp2");
}

}  // namespace
}  // namespace mih
