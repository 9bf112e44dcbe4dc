// errors/rank<r>.json read typed (harness/contract/rank_error.h): the worker's record reads
// back, and one without its code, message or context, or with a code none of mih's, is refused
// naming the file and the field (read as "" or no context before).
#include "harness/contract/rank_error.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"

namespace mih::contract {
namespace {

using nlohmann::json;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

json written() {
  return {{"rank", 1},           {"world_size", 2},
          {"code", "failed_precondition"}, {"exit_status", 12},
          {"message", "no such file"},     {"context", {"while running case 'llama/Tp2' on rank 1/2"}}};
}

std::string refusal(const json& record) {
  try {
    (void)parse_rank_error(record, "run/errors/rank1.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition) << e.what();
    return e.what();
  }
  return "(accepted)";
}

TEST(RankErrorRecordTest, ReadsWhatTheWorkerWrote) {
  const RankErrorRecord r = parse_rank_error(written(), "f");
  EXPECT_EQ(r.code, "failed_precondition");
  EXPECT_EQ(r.message, "no such file");
  EXPECT_THAT(r.context, ElementsAre("while running case 'llama/Tp2' on rank 1/2"));
}

TEST(RankErrorRecordTest, AMissingOrMistypedFieldIsNamed) {
  for (const char* field : {"code", "message", "context"}) {
    json r = written();
    r.erase(field);
    EXPECT_THAT(refusal(r), AllOf(HasSubstr("run/errors/rank1.json: '" + std::string(field) + "' must be"),
                                  HasSubstr("got none"), HasSubstr("not the error record a mih rank writes")));
  }
  json r = written();
  r["context"] = {"a line", 3};  // a JSON type error out of the launcher's report before
  EXPECT_THAT(refusal(r), HasSubstr("'context' must be a list of strings"));
  r = written();
  r["code"] = "exploded";
  EXPECT_THAT(refusal(r), HasSubstr("'code' is 'exploded', none of mih's error codes"));
  EXPECT_THAT(refusal(json::array()), HasSubstr("expected a JSON object"));
}

}  // namespace
}  // namespace mih::contract
