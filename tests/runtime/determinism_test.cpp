// apply_determinism: seeds, thread counts and the deterministic-algorithms flag.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/runtime/determinism.h"

namespace mih {
namespace {

TEST(DeterminismTest, SameSeedSameDrawsAndOneThread) {
  DeterminismOptions o;
  o.seed = 7;
  o.intra_op_threads = 1;
  apply_determinism(o);
  at::Tensor first = at::randn({16});
  apply_determinism(o);
  at::Tensor again = at::randn({16});
  EXPECT_TRUE(at::equal(first, again));
  o.seed = 8;
  apply_determinism(o);
  EXPECT_FALSE(at::equal(first, at::randn({16})));
  EXPECT_EQ(at::get_num_threads(), 1);
  EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
  nlohmann::json state = determinism_state(o);
  EXPECT_EQ(state["seed"], 8);
  EXPECT_EQ(state["intra_op_threads"], 1);
}

TEST(DeterminismTest, ThreadCountIsConfigurable) {
  DeterminismOptions o;
  o.intra_op_threads = 2;
  apply_determinism(o);
  EXPECT_EQ(at::get_num_threads(), 2);
  o.intra_op_threads = 0;
  EXPECT_THAT([&] { apply_determinism(o); }, ::testing::ThrowsMessage<Error>(::testing::HasSubstr("must be >= 1, got 0")));
}

}  // namespace
}  // namespace mih
