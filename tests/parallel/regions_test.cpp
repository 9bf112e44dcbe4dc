// Each autograd region function, forward and backward, on thread ranks against the values a
// single device computes for the same global problem.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/parallel/regions.h"
#include "tests/support/thread_ranks.h"

namespace mih {
namespace {

using ::testing::IsEmpty;

// A [rows, cols] float64 tensor whose values depend on `tag`, the same on every rank.
at::Tensor values(int64_t rows, int64_t cols, double tag) {
  return (at::arange(rows * cols, at::kDouble).reshape({rows, cols}) + 1) * 0.25 + tag;
}

::testing::AssertionResult Close(const at::Tensor& actual, const at::Tensor& expected) {
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << " != expected " << expected.sizes();
  }
  double err = (actual - expected).abs().max().item<double>();
  if (err <= 1e-12) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max abs error " << err << "\nactual:\n" << actual << "\nexpected:\n" << expected;
}

std::vector<std::string> on_tp(int tp, const std::function<void(Communicator&)>& body) {
  ParallelConfig dims;
  dims.tp = tp;
  return testing::run_mesh(dims, [&](DeviceMesh& mesh) { body(mesh.comm(MeshAxis::kTp)); });
}

TEST(RegionsTest, CopyToRegionSumsGradientsOfEveryRank) {
  EXPECT_THAT(on_tp(2, [](Communicator& tp) {
                at::Tensor x = values(2, 3, 0).requires_grad_(true);
                at::Tensor y = copy_to_region(x, tp);
                EXPECT_TRUE(Close(y, x.detach()));
                (y * (tp.rank() + 1)).sum().backward();  // rank r's loss weighs by r + 1
                EXPECT_TRUE(Close(x.grad(), at::full({2, 3}, 1.0 + 2.0, at::kDouble)));
              }),
              IsEmpty());
}

TEST(RegionsTest, ReduceFromRegionSumsForwardPassesGradientThrough) {
  EXPECT_THAT(on_tp(2, [](Communicator& tp) {
                at::Tensor x = values(2, 3, tp.rank()).requires_grad_(true);
                at::Tensor y = reduce_from_region(x, tp);
                EXPECT_TRUE(Close(y, values(2, 3, 0) + values(2, 3, 1)));
                (y * 3).sum().backward();
                EXPECT_TRUE(Close(x.grad(), at::full({2, 3}, 3.0, at::kDouble)));
              }),
              IsEmpty());
}

TEST(RegionsTest, GatherAlongADim) {
  EXPECT_THAT(on_tp(2, [](Communicator& tp) {
                at::Tensor w = values(2, 6, 7);  // the same on both ranks
                at::Tensor x = values(2, 3, 10 * tp.rank()).requires_grad_(true);
                at::Tensor y = gather_from_region(x, tp, 1);
                EXPECT_TRUE(Close(y, at::cat({values(2, 3, 0), values(2, 3, 10)}, 1)));
                (y * w).sum().backward();
                EXPECT_TRUE(Close(x.grad(), w.chunk(2, 1)[tp.rank()]));
              }),
              IsEmpty());
}

TEST(RegionsTest, SequenceAllGatherAndReduceScatterAreConjugates) {
  EXPECT_THAT(on_tp(2, [](Communicator& tp) {
                // [B=1, S/TP=2, H=3] per rank -> [1, 4, 3]
                at::Tensor x = values(2, 3, 10 * tp.rank()).unsqueeze(0).requires_grad_(true);
                at::Tensor y = sequence_all_gather(x, tp, 1);
                EXPECT_TRUE(Close(y, at::cat({values(2, 3, 0), values(2, 3, 10)}, 0).unsqueeze(0)));
                at::Tensor w = values(4, 3, tp.rank()).unsqueeze(0);  // different per rank
                (y * w).sum().backward();
                // d/dx_r of sum over ranks = sum of both ranks' weights on rank r's rows
                at::Tensor total = values(4, 3, 0) + values(4, 3, 1);
                EXPECT_TRUE(Close(x.grad(), total.chunk(2, 0)[tp.rank()].unsqueeze(0)));

                at::Tensor partial = values(4, 3, tp.rank()).unsqueeze(0).requires_grad_(true);
                at::Tensor mine = sequence_reduce_scatter(partial, tp, -2);
                EXPECT_TRUE(Close(mine, total.chunk(2, 0)[tp.rank()].unsqueeze(0)));
                (mine * (tp.rank() + 1)).sum().backward();
                at::Tensor expected = at::cat({at::full({2, 3}, 1.0, at::kDouble), at::full({2, 3}, 2.0, at::kDouble)}, 0);
                EXPECT_TRUE(Close(partial.grad(), expected.unsqueeze(0)));
              }),
              IsEmpty());
}

// 7 rows over 4 ranks: chunks of 2, 2, 2 and 1 rows.
TEST(RegionsTest, FsdpAllGatherOfUnevenShardsReduceScattersTheGradient) {
  ParallelConfig dims;
  dims.dp_shard = 4;
  auto errors = testing::run_mesh(dims, [](DeviceMesh& mesh) {
    Communicator& dp = mesh.comm(MeshAxis::kDpShard);
    at::Tensor full_value = values(7, 3, 0);
    const int64_t offset = std::min<int64_t>(7, 2 * dp.rank()), rows = std::min<int64_t>(7, offset + 2) - offset;
    at::Tensor shard = full_value.narrow(0, offset, rows).clone().requires_grad_(true);
    at::Tensor full = fsdp_all_gather(shard, dp, 7);
    EXPECT_TRUE(Close(full, full_value));
    at::Tensor w = values(7, 3, dp.rank());
    (full * w).sum().backward();
    at::Tensor total = values(7, 3, 0) + values(7, 3, 1) + values(7, 3, 2) + values(7, 3, 3);
    EXPECT_TRUE(Close(shard.grad(), total.narrow(0, offset, rows)));
    EXPECT_EQ(shard.grad().storage().nbytes(), static_cast<size_t>(rows * 3 * 8)) << "the grad must not pin the buffer";
  });
  EXPECT_THAT(errors, IsEmpty());
}

TEST(RegionsTest, FsdpAllGatherCastsForComputeAndReducesInReduceDtype) {
  ParallelConfig dims;
  dims.dp_shard = 2;
  auto errors = testing::run_mesh(dims, [](DeviceMesh& mesh) {
    Communicator& dp = mesh.comm(MeshAxis::kDpShard);
    at::Tensor shard = values(2, 2, dp.rank()).to(at::kFloat).requires_grad_(true);
    at::Tensor full = fsdp_all_gather(shard, dp, 4, at::kDouble, at::kDouble);
    EXPECT_EQ(full.scalar_type(), at::kDouble);
    full.sum().backward();
    EXPECT_EQ(shard.grad().scalar_type(), at::kFloat);
    EXPECT_TRUE(Close(shard.grad().to(at::kDouble), at::full({2, 2}, 2.0, at::kDouble)));
  });
  EXPECT_THAT(errors, IsEmpty());
}

// Rows rank `from` sends rank `to` in the all-to-all test: uneven, and none for some pairs.
int64_t rows_between(int from, int to) { return (from + 2 * to) % 3; }

// Row i of the block rank `from` sends rank `to`: a value that names all three.
at::Tensor block(int from, int to, int64_t cols) {
  return values(rows_between(from, to), cols, 100.0 * from + 10.0 * to);
}

// The weight rank `at` applies to the rows it received from rank `from` in its loss.
double weight(int at, int from) { return 1.0 + at + 0.5 * from; }

TEST(RegionsTest, AllToAllRowsSendsUnevenSplitsAndSendsTheGradientBack) {
  for (int n : {2, 4}) {
    ParallelConfig dims;
    dims.dp_shard = n;
    dims.ep = n;
    EXPECT_THAT(testing::run_mesh(dims,
                                  [&](DeviceMesh& mesh) {
                                    Communicator& ep = mesh.comm(MeshAxis::kEp);
                                    ASSERT_EQ(ep.size(), n);
                                    const int me = ep.rank();
                                    std::vector<int64_t> in_splits, out_splits;
                                    std::vector<at::Tensor> sent, expected, weights, expected_grad;
                                    for (int j = 0; j < n; ++j) {
                                      in_splits.push_back(rows_between(me, j));
                                      out_splits.push_back(rows_between(j, me));
                                      sent.push_back(block(me, j, 3));
                                      expected.push_back(block(j, me, 3));
                                      weights.push_back(at::full({rows_between(j, me), 3}, weight(me, j), at::kDouble));
                                      // What I sent j comes back weighted as j weighs rows from me.
                                      expected_grad.push_back(at::full({rows_between(me, j), 3}, weight(j, me), at::kDouble));
                                    }
                                    at::Tensor x = at::cat(sent).requires_grad_(true);
                                    at::Tensor y = all_to_all_rows(x, ep, out_splits, in_splits);
                                    EXPECT_TRUE(Close(y, at::cat(expected))) << n << " ranks, rank " << me;
                                    (y * at::cat(weights)).sum().backward();
                                    EXPECT_TRUE(Close(x.grad(), at::cat(expected_grad))) << n << " ranks, rank " << me;
                                    EXPECT_THAT([&] { all_to_all_rows(x, ep, out_splits, {1}); },
                                                ::testing::ThrowsMessage<Error>(::testing::HasSubstr(
                                                    "1 input and " + std::to_string(n) + " output splits")));
                                  }),
                IsEmpty())
        << n << " ranks";
  }
}

TEST(RegionsTest, IdentityOnOneRank) {
  EXPECT_THAT(on_tp(1, [](Communicator& tp) {
                at::Tensor x = values(2, 4, 0).requires_grad_(true);
                for (const at::Tensor& y : {copy_to_region(x, tp), reduce_from_region(x, tp), gather_from_region(x, tp, 1),
                                            sequence_all_gather(x, tp, 0),
                                            sequence_reduce_scatter(x, tp, 0), fsdp_all_gather(x, tp, 2)}) {
                  EXPECT_TRUE(Close(y, x.detach()));
                }
              }),
              IsEmpty());
}

// A second backward through a region would run its collective again and silently double
// the reduction; it must fail instead.
TEST(RegionsTest, SecondBackwardThroughARegionThrows) {
  EXPECT_THAT(on_tp(2, [](Communicator& tp) {
                at::Tensor x = values(2, 3, 0).requires_grad_(true);
                at::Tensor loss = copy_to_region(x, tp).sum();
                loss.backward();
                EXPECT_THROW(loss.backward(), c10::Error);  // the graph was freed by the first
              }),
              IsEmpty());
}

}  // namespace
}  // namespace mih
