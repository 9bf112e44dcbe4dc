// Context-parallel layouts and attention: the token ids of each layout, the shard/unshard
// round trip, and CP attention on thread ranks against full-sequence attention on one device
// (output and the gradients of q, k and v: a gather whose backward only sliced would leave
// the output right and dk, dv wrong; docs/spike-ac-cp.md section 2.3).
#include <array>
#include <atomic>
#include <limits>
#include <optional>
#include <utility>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/parallel/context_parallel.h"
#include "harness/training/trainer.h"
#include "tests/parallel/tiny_block.h"
#include "tests/support/thread_ranks.h"

namespace mih {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::ThrowsMessage;

std::vector<int64_t> ids(const at::Tensor& t) { return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()); }

TEST(CpLayoutTest, ContiguousAndZigzagTokenIds) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(ids(cp_token_ids(8, 2, 0, CpLayout::kContiguous)), (V{0, 1, 2, 3}));
  EXPECT_EQ(ids(cp_token_ids(8, 2, 1, CpLayout::kContiguous)), (V{4, 5, 6, 7}));
  EXPECT_EQ(ids(cp_token_ids(8, 2, 0, CpLayout::kZigzag)), (V{0, 1, 6, 7}));
  EXPECT_EQ(ids(cp_token_ids(8, 2, 1, CpLayout::kZigzag)), (V{2, 3, 4, 5}));
  EXPECT_EQ(ids(cp_token_ids(8, 4, 1, CpLayout::kZigzag)), (V{1, 6}));
  EXPECT_EQ(ids(cp_gathered_token_ids(8, 2, CpLayout::kZigzag)), (V{0, 1, 6, 7, 2, 3, 4, 5}));
  EXPECT_EQ(ids(cp_token_ids(8, 1, 0, CpLayout::kZigzag)), (V{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(CpLayoutTest, ShardThenGatherThenUnshardIsTheIdentity) {
  at::Tensor x = at::arange(3 * 12 * 2, at::kDouble).reshape({3, 12, 2});
  for (CpLayout layout : {CpLayout::kContiguous, CpLayout::kZigzag}) {
    for (int64_t cp : {2, 3}) {
      std::vector<at::Tensor> pieces;
      for (int64_t r = 0; r < cp; ++r) pieces.push_back(cp_shard_sequence(x, 1, cp, r, layout));
      EXPECT_TRUE(at::equal(cp_unshard_sequence(at::cat(pieces, 1), 1, cp, layout), x))
          << cp_layout_name(layout) << " cp=" << cp;
    }
  }
}

// Values written out by hand: sequence parallelism cuts each cp rank's tokens (in their
// layout's order) into tp contiguous chunks.
TEST(CpLayoutTest, SequenceParallelRanksHoldContiguousChunksOfTheirCpRanksTokens) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(ids(sequence_token_ids(16, 2, 0, CpLayout::kZigzag, 2, 0)), (V{0, 1, 2, 3}));
  EXPECT_EQ(ids(sequence_token_ids(16, 2, 0, CpLayout::kZigzag, 2, 1)), (V{12, 13, 14, 15}));
  EXPECT_EQ(ids(sequence_token_ids(16, 2, 1, CpLayout::kZigzag, 2, 0)), (V{4, 5, 6, 7}));
  EXPECT_EQ(ids(sequence_token_ids(16, 2, 1, CpLayout::kZigzag, 2, 1)), (V{8, 9, 10, 11}));
  EXPECT_EQ(ids(sequence_token_ids(8, 1, 0, CpLayout::kContiguous, 2, 1)), (V{4, 5, 6, 7}));
  EXPECT_EQ(ids(sequence_token_ids(12, 2, 1, CpLayout::kContiguous, 3, 2)), (V{10, 11}));
  EXPECT_EQ(ids(sequence_token_ids(8, 2, 1, CpLayout::kZigzag)), (V{2, 3, 4, 5})) << "no sequence parallelism";
  const at::Tensor x = at::arange(12, at::kLong).reshape({2, 6});
  EXPECT_EQ(ids(sp_shard_sequence(x, 1, 3, 2).contiguous()), (V{4, 5, 10, 11}));
  EXPECT_EQ(ids(sp_shard_sequence(x, -1, 1, 0).contiguous()), ids(x));
  EXPECT_THAT([] { sequence_token_ids(12, 2, 0, CpLayout::kZigzag, 4, 0); },
              ThrowsMessage<Error>(HasSubstr("6 tokens (dim 0 of [6]) do not split into tp=4 equal chunks")));
  EXPECT_THAT([&] { sp_shard_sequence(x, 1, 2, 2); }, ThrowsMessage<Error>(HasSubstr("tp rank 2 is outside [0, tp=2)")));
}

TEST(CpLayoutTest, SequenceThatDoesNotSplitIsNamed) {
  EXPECT_THAT([] { cp_token_ids(6, 2, 0, CpLayout::kZigzag); },
              ThrowsMessage<Error>(HasSubstr("a sequence of 6 tokens does not split into 4 zigzag chunks")));
  EXPECT_THAT([] { cp_token_ids(7, 2, 0, CpLayout::kContiguous); },
              ThrowsMessage<Error>(HasSubstr("use a sequence length divisible by 2")));
  EXPECT_THAT([] { parse_cp_layout("ring"); }, ThrowsMessage<Error>(HasSubstr("valid: contiguous, zigzag")));
}

// Plain causal attention on the whole sequence, GQA by repeating K/V heads.
at::Tensor full_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t s = q.size(2), group = q.size(1) / k.size(1);
  at::Tensor scores = at::matmul(q, k.repeat_interleave(group, 1).transpose(-2, -1)) / std::sqrt(double(q.size(3)));
  scores = scores.masked_fill(at::ones({s, s}, at::kBool).triu(1), -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(scores, -1), v.repeat_interleave(group, 1));
}

TEST(CpAttentionTest, MatchesFullSequenceAttentionWithGqa) {
  for (CpLayout layout : {CpLayout::kContiguous, CpLayout::kZigzag}) {
    for (int cp : {2, 4}) {
      const int64_t b = 2, hq = 4, hkv = 2, s = 16, d = 8;
      at::Tensor q = at::randn({b, hq, s, d}, at::kDouble), k = at::randn({b, hkv, s, d}, at::kDouble);
      at::Tensor v = at::randn({b, hkv, s, d}, at::kDouble), g = at::randn({b, hq, s, d}, at::kDouble);
      at::Tensor qf = q.clone().requires_grad_(true), kf = k.clone().requires_grad_(true), vf = v.clone().requires_grad_(true);
      at::Tensor out = full_attention(qf, kf, vf);
      (out * g).sum().backward();
      ParallelConfig dims;
      dims.cp = cp;
      auto errors = testing::run_mesh(dims, [&](DeviceMesh& mesh) {
        CpShard shard{&mesh.comm(MeshAxis::kCp), layout};
        auto local = [&](const at::Tensor& t) { return cp_shard_sequence(t, 2, cp, shard.rank(), layout); };
        at::Tensor ql = local(q).requires_grad_(true), kl = local(k).requires_grad_(true), vl = local(v).requires_grad_(true);
        at::Tensor o = cp_causal_attention(ql, kl, vl, shard);
        (o * local(g)).sum().backward();
        const std::string where = cp_layout_name(layout) + " cp=" + std::to_string(cp) + " rank " + std::to_string(shard.rank());
        EXPECT_TRUE(at::allclose(o, local(out.detach()), 0, 1e-12)) << where << " output";
        EXPECT_TRUE(at::allclose(ql.grad(), local(qf.grad()), 0, 1e-12)) << where << " dq";
        EXPECT_TRUE(at::allclose(kl.grad(), local(kf.grad()), 0, 1e-12)) << where << " dk";
        EXPECT_TRUE(at::allclose(vl.grad(), local(vf.grad()), 0, 1e-12)) << where << " dv";
      });
      EXPECT_THAT(errors, IsEmpty());
    }
  }
}

// Each document of each row attended as a sequence of its own (full_attention on its slice):
// what a block-causal mask over packed documents must equal. `lengths[b]`: row b's documents.
at::Tensor per_document_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const std::vector<std::vector<int64_t>>& lengths) {
  std::vector<at::Tensor> rows;
  for (size_t b = 0; b < lengths.size(); ++b) {
    std::vector<at::Tensor> docs;
    int64_t start = 0;
    for (int64_t n : lengths[b]) {
      auto part = [&](const at::Tensor& t) { return t.narrow(0, b, 1).narrow(2, start, n); };
      docs.push_back(full_attention(part(q), part(k), part(v)));
      start += n;
    }
    rows.push_back(at::cat(docs, 2));
  }
  return at::cat(rows, 0);
}

// The rows' documents as ids [B, S]: 0 for the first, one more at each start.
at::Tensor document_ids_of(const std::vector<std::vector<int64_t>>& lengths) {
  std::vector<at::Tensor> rows;
  for (const auto& row : lengths) {
    std::vector<at::Tensor> docs;
    for (size_t d = 0; d < row.size(); ++d) docs.push_back(at::full({row[d]}, static_cast<int64_t>(d), at::kLong));
    rows.push_back(at::cat(docs));
  }
  return at::stack(rows);
}

// How many of cp ranks' cp_causal_attention(q, k, v) under `mask`, with output gradient g,
// differ (1e-12) in their tokens' output, dq, dk or dv from `whole` (the same computed on the
// whole sequence). in and whole: {q, k, v, g} and {out, dq, dk, dv}, each [B, H, S, D].
int ranks_differing(const std::array<at::Tensor, 4>& in, const std::array<at::Tensor, 4>& whole,
                    const CpAttentionMask& mask, CpLayout layout, int cp) {
  ParallelConfig dims;
  dims.cp = cp;
  std::atomic<int> differing{0};
  auto errors = testing::run_mesh(dims, [&](DeviceMesh& mesh) {
    CpShard shard{&mesh.comm(MeshAxis::kCp), layout};
    auto local = [&](const at::Tensor& t) { return cp_shard_sequence(t, 2, cp, shard.rank(), layout); };
    at::Tensor q = local(in[0]).requires_grad_(true), k = local(in[1]).requires_grad_(true);
    at::Tensor v = local(in[2]).requires_grad_(true);
    at::Tensor o = cp_causal_attention(q, k, v, shard, mask);
    (o * local(in[3])).sum().backward();
    bool same = true;
    for (const auto& [got, want] : {std::pair{o, whole[0]}, {q.grad(), whole[1]}, {k.grad(), whole[2]}, {v.grad(), whole[3]}}) {
      same = same && at::allclose(got, local(want), 0, 1e-12);
    }
    if (!same) ++differing;
  });
  EXPECT_THAT(errors, IsEmpty());
  return differing.load();
}

// Documents of odd lengths that straddle every chunk boundary of cp 2 and 4, contiguous and
// zigzag (row 0: tokens 0-4, 5-10, 11-15; row 1: 0-2, 3-15): the mask looked up at global ids
// gives each document's own attention on every rank (output, dq, dk, dv); looked up at local
// ids (F37) it does not.
TEST(CpAttentionTest, DocumentMaskMatchesEachDocumentAttendedAlone) {
  const std::vector<std::vector<int64_t>> lengths = {{5, 6, 5}, {3, 13}};
  const int64_t b = 2, hq = 4, hkv = 2, s = 16, d = 8;
  at::Tensor q = at::randn({b, hq, s, d}, at::kDouble), k = at::randn({b, hkv, s, d}, at::kDouble);
  at::Tensor v = at::randn({b, hkv, s, d}, at::kDouble), g = at::randn({b, hq, s, d}, at::kDouble);
  at::Tensor qf = q.clone().requires_grad_(true), kf = k.clone().requires_grad_(true), vf = v.clone().requires_grad_(true);
  at::Tensor out = per_document_attention(qf, kf, vf, lengths);
  (out * g).sum().backward();
  CpAttentionMask mask;
  mask.document_ids = document_ids_of(lengths);
  for (const bool local_ids : {false, true}) {
    std::optional<fault::ScopedFault> f37;  // process-wide: every thread rank runs with it
    if (local_ids) f37.emplace(fault::Fault::kF37);
    for (CpLayout layout : {CpLayout::kContiguous, CpLayout::kZigzag}) {
      for (int cp : {2, 4}) {
        const int differing = ranks_differing({q, k, v, g}, {out.detach(), qf.grad(), kf.grad(), vf.grad()}, mask,
                                              layout, cp);
        const std::string where = cp_layout_name(layout) + " cp=" + std::to_string(cp);
        if (local_ids) {
          EXPECT_GT(differing, 0) << where << ": the mask at local ids matched every document's attention";
        } else {
          EXPECT_EQ(differing, 0) << where << ": output or a gradient differs from each document attended alone";
        }
      }
    }
  }
  at::Tensor x = at::zeros({1, 2, 4, 2}, at::kDouble);
  CpAttentionMask wrong;
  wrong.document_ids = at::zeros({1, 3}, at::kLong);
  EXPECT_THAT([&] { cp_causal_attention(x, x, x, CpShard{}, wrong); },
              ThrowsMessage<Error>(HasSubstr("document_ids must be [B, S] = [1, 4] int64")));
}

// Attention with an explicit [S, S] keep matrix (true: the query may attend the key), GQA by
// repeating K/V heads: the reference of the masks below.
at::Tensor kept_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& keep) {
  const int64_t group = q.size(1) / k.size(1);
  at::Tensor scores = at::matmul(q, k.repeat_interleave(group, 1).transpose(-2, -1)) / std::sqrt(double(q.size(3)));
  scores = scores.masked_fill(keep.logical_not(), -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(scores, -1), v.repeat_interleave(group, 1));
}

// A sliding window of 3 (transformers': query t sees keys t-2..t) with documents of odd length
// that straddle the chunk boundaries, on every layout of cp 2 and 4: output and dq, dk, dv
// match the window written as a keep matrix (row 0's documents 0-4, 5-10, 11-15); the window
// one key wider for the keys of another cp rank (F39) does not.
TEST(CpAttentionTest, SlidingWindowMatchesTheWindowOnOneRank) {
  const std::vector<std::vector<int64_t>> lengths = {{5, 6, 5}, {16}};
  const int64_t b = 2, hq = 4, hkv = 2, s = 16, d = 8, window = 3;
  at::Tensor q = at::randn({b, hq, s, d}, at::kDouble), k = at::randn({b, hkv, s, d}, at::kDouble);
  at::Tensor v = at::randn({b, hkv, s, d}, at::kDouble), g = at::randn({b, hq, s, d}, at::kDouble);
  const at::Tensor docs = document_ids_of(lengths), t = at::arange(s, at::kLong);
  const at::Tensor keep = (t.unsqueeze(0) <= t.unsqueeze(1)) & (t.unsqueeze(0) > t.unsqueeze(1) - window);
  const at::Tensor keep_docs = (keep.unsqueeze(0) & (docs.unsqueeze(2) == docs.unsqueeze(1))).unsqueeze(1);
  at::Tensor qf = q.clone().requires_grad_(true), kf = k.clone().requires_grad_(true), vf = v.clone().requires_grad_(true);
  at::Tensor out = kept_attention(qf, kf, vf, keep_docs);
  (out * g).sum().backward();
  CpAttentionMask mask;
  mask.document_ids = docs;
  mask.window = window;
  for (const bool wider : {false, true}) {
    std::optional<fault::ScopedFault> f39;  // process-wide: every thread rank runs with it
    if (wider) f39.emplace(fault::Fault::kF39);
    for (CpLayout layout : {CpLayout::kContiguous, CpLayout::kZigzag}) {
      for (int cp : {2, 4}) {
        const int differing = ranks_differing({q, k, v, g}, {out.detach(), qf.grad(), kf.grad(), vf.grad()}, mask,
                                              layout, cp);
        const std::string where = cp_layout_name(layout) + " cp=" + std::to_string(cp);
        if (wider) {
          EXPECT_GT(differing, 0) << where << ": a window one key wider across ranks matched";
        } else {
          EXPECT_EQ(differing, 0) << where << ": output or a gradient differs from the window on one rank";
        }
      }
    }
  }
  at::Tensor x = at::zeros({1, 2, 4, 2}, at::kDouble);
  CpAttentionMask negative;
  negative.window = -1;
  EXPECT_THAT([&] { cp_causal_attention(x, x, x, CpShard{}, negative); },
              ThrowsMessage<Error>(HasSubstr("the sliding window must be >= 0 (0: none), got -1")));
}

TEST(CpAttentionTest, HeadsThatDoNotGroupAreRejected) {
  at::Tensor q = at::zeros({1, 3, 4, 2}), k = at::zeros({1, 2, 4, 2});
  EXPECT_THAT([&] { cp_causal_attention(q, k, k, CpShard{}); },
              ThrowsMessage<Error>(HasSubstr("3 query heads do not group over 2 key/value heads")));
}

// A field the pipeline adds must declare its CP sharding; a declared one is sharded.
TEST(CpTrainerTest, FieldsNeedADeclaredCpSharding) {
  ParallelConfig c;
  c.cp = 2;
  BatchSource with_field = [base = testing::tiny_batches(4, 8, 37)](int64_t step) {
    Batch b = base(step);
    b.fields["loss_weight"] = at::ones({4, 8}, at::kDouble);
    return b;
  };
  auto errors = testing::run_mesh(c, [&](DeviceMesh& mesh) {
    Trainer undeclared(mesh, c, testing::tiny_block_factory(), with_field);
    EXPECT_THAT([&] { undeclared.step(); },
                ThrowsMessage<Error>(HasSubstr("field 'loss_weight' has no context-parallel sharding")));
    struct SeeField : TrainingHooks {
      void record_batch(int64_t, int, int64_t, const Batch& b) override { shape = b.fields.at("loss_weight").sizes().vec(); }
      std::vector<int64_t> shape;
    } hook;
    Trainer declared(mesh, c, testing::tiny_block_factory(), with_field,
                     TrainerOptions().sequence_fields({"loss_weight"}), &hook);
    declared.step();
    EXPECT_EQ(hook.shape, (std::vector<int64_t>{4, 4}));
  });
  EXPECT_THAT(errors, IsEmpty());
}

}  // namespace
}  // namespace mih
