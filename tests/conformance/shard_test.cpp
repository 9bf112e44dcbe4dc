// `mih test --shard i/N` (cases/shard.h): the form of i/N, the assignment of cases to shares
// (every case once, balanced by cost, the same in every process) and the filter a share runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "harness/base/error.h"
#include "harness/cases/shard.h"

namespace mih::cases {
namespace {

TEST(ShardTest, ParsesIndexOverCount) {
  const Shard s = parse_shard("2/4");
  EXPECT_EQ(s.index, 2);
  EXPECT_EQ(s.count, 4);
  EXPECT_EQ(parse_shard("1/1").count, 1);
  for (const char* bad : {"0/2", "3/2", "1/0", "2", "/2", "1/", "-1/2", "1/-2", " 1/2", "1/2 ", "a/b", "1/5000",
                          "01/2", "1//2", "99999999999999999999/2"}) {
    try {
      (void)parse_shard(bad);
      ADD_FAILURE() << "'" << bad << "' was taken as a shard";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Code::kInvalidSpec) << bad;
      EXPECT_NE(e.message().find("--shard"), std::string::npos) << e.message();
    }
  }
}

TEST(ShardTest, EveryItemOnceBalancedByCostAndTheSameEveryTime) {
  std::vector<ShardItem> items;
  for (int i = 0; i < 23; ++i) items.push_back({"P/Case" + std::to_string(i), static_cast<double>(1 + (i * 7) % 5)});
  for (int count = 1; count <= 30; ++count) {
    const std::vector<int> shares = assign_shards(items, count);
    ASSERT_EQ(shares.size(), items.size());
    EXPECT_EQ(shares, assign_shards(items, count));  // deterministic
    std::map<int, double> load;
    for (size_t i = 0; i < items.size(); ++i) {
      ASSERT_GE(shares[i], 1);
      ASSERT_LE(shares[i], count);
      load[shares[i]] += items[i].cost;
    }
    // Every share has an item while there are enough; no share exceeds the lightest by more
    // than the largest item (the greedy bound).
    if (count <= static_cast<int>(items.size())) {
      EXPECT_EQ(static_cast<int>(load.size()), count) << count;
    }
    double lo = 1e9, hi = 0;
    for (const auto& [share, l] : load) lo = std::min(lo, l), hi = std::max(hi, l);
    EXPECT_LE(hi - lo, 5.0) << count << " shares";
  }
  // Order of the input does not move an item to another share.
  std::vector<ShardItem> reversed(items.rbegin(), items.rend());
  const std::vector<int> a = assign_shards(items, 4), b = assign_shards(reversed, 4);
  for (size_t i = 0; i < items.size(); ++i) EXPECT_EQ(a[i], b[items.size() - 1 - i]) << items[i].key;
  EXPECT_THROW((void)assign_shards(items, 0), Error);
}

TEST(ShardTest, FilterOfAShareKeepsTheUsersFilter) {
  const std::vector<std::string> other = {"Llama/*.*/Tp2Sp", "Moe/*.*/Ep2"};
  const std::string f = filter_excluding("Llama/*:Moe/*-*/MatchesOriginal.*", other);
  EXPECT_EQ(f, "Llama/*:Moe/*-*/MatchesOriginal.*:Llama/*.*/Tp2Sp:Moe/*.*/Ep2");
  EXPECT_TRUE(filter_selects(f, "Llama/NumericParity.LossMatches/DpShard2"));
  EXPECT_FALSE(filter_selects(f, "Llama/NumericParity.LossMatches/Tp2Sp"));       // another share's
  EXPECT_TRUE(filter_selects(f, "Llama/NumericParity.LossMatches/Tp2SpAc"));      // not a prefix match
  EXPECT_FALSE(filter_selects(f, "Llama/MatchesOriginal.StepMatchesOriginal/Reference"));  // the user's negative
  EXPECT_FALSE(filter_selects(f, "Vlm/NumericParity.LossMatches/DpShard2"));      // the user's positive
  EXPECT_EQ(filter_excluding("*", {}), "*");
  EXPECT_EQ(filter_excluding("", {"A/*.*/B"}), "*-A/*.*/B");
  EXPECT_EQ(filter_excluding("-X", {"A/*.*/B"}), "*-X:A/*.*/B");
}

}  // namespace
}  // namespace mih::cases
