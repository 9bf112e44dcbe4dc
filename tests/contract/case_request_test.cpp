// The case request (harness/contract/case_request.h): what the parent writes to run/case.json is
// read back field for field, and a file that is not exactly that (an unknown field, a missing
// one, a case edited by hand) is refused naming what is wrong, never read with defaults.
#include "harness/contract/case_request.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <utility>
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
  r.matrix = MatrixSource::parse("cpu-smoke@float32,seed=2");
  r.training_backend = "trainer";
  r.fault = "F11";
  r.init_from = "/ckpt";
  r.init_from_sha256 = "ab";
  r.case_timeout = std::chrono::seconds(90);
  r.collective_timeout = std::chrono::seconds(5);
  r.fingerprint = "0123456789abcdef";
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
  EXPECT_EQ(back.case_timeout, std::chrono::seconds(90));
  EXPECT_EQ(back.collective_timeout, std::chrono::seconds(5));
  EXPECT_EQ(back.fingerprint, "0123456789abcdef");
  EXPECT_EQ(j["case_timeout_ms"], 90000) << "milliseconds, an integer";
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
  // The timeouts and the fingerprint are the request's: never a default, never a conversion.
  for (const char* missing : {"case_timeout_ms", "collective_timeout_ms", "fingerprint"}) {
    j = example();
    j.erase(missing);
    EXPECT_EQ(code_of(j), Code::kFailedPrecondition) << "a request without " << missing << " was accepted";
  }
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{{"fingerprint", "zzzzzzzzzzzzzzzz"},
                                                                             {"fingerprint", ""},
                                                                             {"fingerprint", std::string(1000, 'a')},
                                                                             {"case_timeout_ms", 1.5},
                                                                             {"case_timeout_ms", 0},
                                                                             {"case_timeout_ms", true},
                                                                             {"case_timeout_ms", "90s"},
                                                                             {"collective_timeout_ms", -1},
                                                                             {"collective_timeout_ms", 2.0},
                                                                             {"fingerprint", 3}}) {
    j = example();
    j[field] = value;
    try {
      (void)j.get<CaseRequest>();
      ADD_FAILURE() << field << " = " << value.dump() << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Code::kFailedPrecondition) << e.what();
      EXPECT_THAT(e.what(), HasSubstr(field)) << "the error does not name the field";
    }
  }
  j = example();
  j["collective_timeout_ms"] = 0;
  EXPECT_EQ(code_of(j), Code::kOk) << "a collective timeout of 0 is the case's";
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
  // A directory in its place is no case file, and not a missing one (found by a hostile trial).
  const auto dir_file = dir / "as_dir.json";
  std::filesystem::create_directories(dir_file);
  EXPECT_THAT([&] { (void)read_case_request(dir_file); },
              ::testing::ThrowsMessage<Error>(HasSubstr("is not a regular file")));
}

// The lane is typed from the flag or suffix to the matrix: parsed once, its text canonical,
// a flag's settings over the suffix's, and a request whose matrix has a bad lane refused.
TEST(CaseRequestTest, TheMatrixSourceCarriesATypedLane) {
  const MatrixSource m = MatrixSource::parse("cpu-smoke@bfloat16,seed=2");
  EXPECT_EQ(m.base, "cpu-smoke");
  EXPECT_EQ(m.lane.dtype, std::optional<DType>(DType::kBFloat16));
  EXPECT_EQ(m.lane.seed, std::optional<uint64_t>(2));
  EXPECT_EQ(m.text(), "cpu-smoke@bfloat16,seed=2");
  EXPECT_EQ(m.lane.overrides(), json({{"dtype", "bfloat16"}, {"seed", 2}}));
  EXPECT_EQ(MatrixSource::parse("cpu-smoke@seed=3,float32").text(), "cpu-smoke@float32,seed=3");  // canonical
  EXPECT_TRUE(MatrixSource::parse("cpu-smoke").lane.empty());
  // A path with an '@' whose tail is no lane is a base.
  EXPECT_EQ(MatrixSource::parse("/data/a@b/m.json").base, "/data/a@b/m.json");
  Lane flags;
  flags.seed = 7;
  EXPECT_EQ(MatrixSource({"cpu-smoke", m.lane.merged_with(flags)}).text(), "cpu-smoke@bfloat16,seed=7");
  for (const char* bad : {"cpu-smoke@", "cpu-smoke@float8", "cpu-smoke@seed=x", "cpu-smoke@dtype=float32,dtype=float64",
                          "cpu-smoke@speed=2", "cpu-smoke@seed=9007199254740992"}) {
    EXPECT_THROW((void)MatrixSource::parse(bad), Error) << bad;
  }
  json j = example();
  j["matrix"] = "cpu-smoke@float8";
  EXPECT_NE(code_of(j), Code::kOk) << "a request whose matrix has an unknown dtype was accepted";
}

}  // namespace
}  // namespace mih
