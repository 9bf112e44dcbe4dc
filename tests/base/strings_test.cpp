// mih::join (harness/base/strings.h): separators only between elements, numbers through
// std::to_string, a formatter per element.
#include "harness/base/strings.h"

#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace mih {
namespace {

TEST(JoinTest, PutsTheSeparatorOnlyBetweenElements) {
  EXPECT_EQ(join(std::vector<std::string>{}), "");
  EXPECT_EQ(join(std::vector<std::string>{"tp"}), "tp");
  EXPECT_EQ(join(std::vector<std::string>{"dp_shard", "tp", "cp"}), "dp_shard, tp, cp");
  EXPECT_EQ(join(std::vector<std::string>{"a", "b"}, ":"), "a:b");
  // An empty element still gets its separators (the hand-written loops skipped them).
  EXPECT_EQ(join(std::vector<std::string>{"", "x"}, ","), ",x");
}

TEST(JoinTest, FormatsNumbersAndViews) {
  EXPECT_EQ(join(std::vector<int64_t>{37, 16}, ", "), "37, 16");
  EXPECT_EQ(join(std::vector<int>{-1}), "-1");
  const std::array<std::string_view, 2> views = {"float64", "bfloat16"};
  EXPECT_EQ(join(views, "|"), "float64|bfloat16");
}

TEST(JoinTest, AppliesTheFormatterToEachElement) {
  const std::vector<std::pair<std::string, int>> rows = {{"ep", 2}, {"tp", 4}};
  EXPECT_EQ(join(rows, "; ", [](const auto& r) { return r.first + "=" + std::to_string(r.second); }), "ep=2; tp=4");
}

}  // namespace
}  // namespace mih
