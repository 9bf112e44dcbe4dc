// A comm ledger line (harness/contract/comm_ledger_row.h): what CommLedger writes reads back,
// a begin line without duration_us and a line without error are whole, and a line without a
// field the schema requires is refused naming it (read as "" or 0 before).
#include "harness/contract/comm_ledger_row.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"

namespace mih {
namespace {

using nlohmann::json;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

CommRecord end_record() {
  CommRecord r;
  r.seq = 3;
  r.event = "end";
  r.axis = "tp";
  r.ranks = {0, 1};
  r.op = "all_reduce.sum";
  r.dtype = "float32";
  r.numel = 16;
  r.bytes = 64;
  r.start_us = 1000;
  r.duration_us = 25;
  r.site = "grad_sync @ runtime/selftest.cpp:120";
  return r;
}

TEST(CommLedgerRowTest, ReadsWhatTheLedgerWrote) {
  const CommRecord back = json(end_record()).get<CommRecord>();
  EXPECT_EQ(back.seq, 3);
  EXPECT_THAT(back.ranks, ElementsAre(0, 1));
  EXPECT_EQ(back.dtype, "float32");
  EXPECT_EQ(back.duration_us, 25);
  EXPECT_EQ(back.error, "");
  CommRecord begin = end_record();
  begin.event = "begin";
  const json line = begin;
  EXPECT_FALSE(line.contains("duration_us"));
  EXPECT_EQ(line.get<CommRecord>().duration_us, 0) << "a begin line has no duration";
  CommRecord failed = end_record();
  failed.event = "error";
  failed.error = "connection reset";
  EXPECT_EQ(json(failed).get<CommRecord>().error, "connection reset");
}

TEST(CommLedgerRowTest, AMissingOrMistypedFieldIsNamed) {
  for (const char* field : {"dtype", "numel", "bytes", "start_us", "site", "seq"}) {
    json j = end_record();
    j.erase(field);
    EXPECT_THAT([&] { (void)j.get<CommRecord>(); },
                ::testing::ThrowsMessage<Error>(AllOf(HasSubstr("'" + std::string(field) + "' must be"), HasSubstr("got none"),
                                                      HasSubstr("not a line of mih's comm ledger"))))
        << field;
  }
  json j = end_record();
  j["duration_us"] = "25";
  EXPECT_THAT([&] { (void)j.get<CommRecord>(); },
              ::testing::ThrowsMessage<Error>(HasSubstr("ledger line (seq 3): 'duration_us' must be an integer, got \"25\"")));
}

}  // namespace
}  // namespace mih
