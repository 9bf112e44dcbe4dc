// CommLedger records, its JSONL file (whole lines, readable after a kill), and the "last
// activity" line the launcher prints for a stuck or dead rank.
#include <unistd.h>

#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/runtime/comm_ledger.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::filesystem::path temp_file(const std::string& name) { return testing::temp_dir("ledger/" + name) / "comm" / name; }

TEST(CallSiteTest, NamesLabelFileAndLine) {
  CallSite site("grad_sync");
  EXPECT_THAT(site.str(), StartsWith("grad_sync @ runtime/comm_ledger_test.cpp:"));
  EXPECT_THAT(CallSite().str(), StartsWith("runtime/comm_ledger_test.cpp:"));
}

TEST(CommLedgerTest, WritesBeginAndEndLinesToTheFile) {
  auto path = temp_file("ledger_rank0.jsonl");
  {
    CommLedger ledger(path);
    int64_t a = ledger.begin("tp", {0, 1}, "all_reduce.sum", "float32", 10, 40, CallSite("x"));
    ledger.end(a);
    int64_t b = ledger.begin("dp_shard", {0, 2}, "all_gather", "float64", 3, 24, CallSite("y"));
    ledger.fail(b, "timed out");
    EXPECT_EQ(ledger.completed().size(), 2u);
    EXPECT_FALSE(ledger.in_flight().has_value());
  }
  auto records = read_ledger(path);
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[0].event, "begin");
  EXPECT_EQ(records[1].event, "end");
  EXPECT_EQ(records[1].op, "all_reduce.sum");
  EXPECT_EQ(records[1].bytes, 40);
  EXPECT_EQ(records[1].ranks, (std::vector<int>{0, 1}));
  EXPECT_GE(records[1].duration_us, 0);
  EXPECT_EQ(records[3].event, "error");
  EXPECT_EQ(records[3].error, "timed out");
}

TEST(CommLedgerTest, ReadSkipsALineCutShortByAKill) {
  auto path = temp_file("ledger_rank1.jsonl");
  {
    CommLedger ledger(path);
    ledger.end(ledger.begin("tp", {0, 1}, "barrier", "", 0, 0, CallSite()));
  }
  std::ofstream(path, std::ios::app) << "{\"seq\":2,\"event\":\"beg";
  EXPECT_EQ(read_ledger(path).size(), 2u);
}

TEST(CommLedgerTest, DescribesWhatARankIsDoing) {
  CommRecord begin;
  begin.seq = 4;
  begin.event = "begin";
  begin.axis = "tp";
  begin.ranks = {0, 1};
  begin.op = "recv";
  begin.dtype = "float32";
  begin.numel = 8;
  begin.start_us = 1'000'000;
  begin.site = "never_sent @ a.cpp:1";
  EXPECT_EQ(describe_last_activity({begin}, 3'500'000),
            "inside recv on axis 'tp' (ranks [0, 1], float32 x 8) called from never_sent @ a.cpp:1 for 2.50 s");
  CommRecord end = begin;
  end.event = "end";
  EXPECT_THAT(describe_last_activity({begin, end}, 3'500'000), StartsWith("last completed recv on axis 'tp'"));
  CommRecord error = begin;
  error.event = "error";
  error.error = "peer died";
  EXPECT_THAT(describe_last_activity({begin, error}, 0), HasSubstr("failed in recv on axis 'tp'"));
  EXPECT_EQ(describe_last_activity({}, 0), "no collective yet");
}

TEST(CommLedgerTest, UnwritableDirectoryIsAClearError) {
  EXPECT_THAT([] { CommLedger ledger("/proc/mih-cannot-write/ledger.jsonl"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("cannot open the comm ledger '/proc/mih-cannot-write/ledger.jsonl'")));
}

}  // namespace
}  // namespace mih
