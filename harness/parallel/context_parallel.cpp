// Context-parallel layouts and attention (see context_parallel.h).
#include "harness/parallel/context_parallel.h"

#include <cmath>
#include <limits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/parallel/regions.h"

namespace mih {
namespace {

void check_divides(int64_t seq, int64_t cp, CpLayout layout) {
  MIH_CHECK(cp >= 1, "context parallelism: cp must be >= 1, got ", cp);
  const int64_t pieces = layout == CpLayout::kZigzag ? 2 * cp : cp;
  MIH_CHECK(seq % pieces == 0, "context parallelism: a sequence of ", seq, " tokens does not split into ", pieces,
            layout == CpLayout::kZigzag ? " zigzag chunks (2 * cp(" : " pieces (cp(", cp,
            ")); use a sequence length divisible by ", pieces, " or pad the sequences");
}

}  // namespace

at::Tensor cp_token_ids(int64_t seq, int64_t cp, int64_t rank, CpLayout layout) {
  check_divides(seq, cp, layout);
  MIH_CHECK(rank >= 0 && rank < cp, "context parallelism: rank ", rank, " is outside [0, cp=", cp, ")");
  const auto opts = at::TensorOptions().dtype(at::kLong);
  if (layout == CpLayout::kContiguous) {
    const int64_t n = seq / cp;
    return at::arange(rank * n, (rank + 1) * n, opts);
  }
  const int64_t chunk = seq / (2 * cp);
  return at::cat({at::arange(rank * chunk, (rank + 1) * chunk, opts),
                  at::arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk, opts)});
}

at::Tensor cp_gathered_token_ids(int64_t seq, int64_t cp, CpLayout layout) {
  std::vector<at::Tensor> ids;
  for (int64_t r = 0; r < cp; ++r) ids.push_back(cp_token_ids(seq, cp, r, layout));
  return at::cat(ids);
}

at::Tensor cp_shard_sequence(const at::Tensor& x, int64_t dim, int64_t cp, int64_t rank, CpLayout layout) {
  if (cp == 1) return x;
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  MIH_CHECK(d >= 0 && d < x.dim(), "context parallelism: sequence dim ", dim, " is out of range for a ", x.dim(),
            "-d tensor");
  return x.index_select(d, cp_token_ids(x.size(d), cp, rank, layout).to(x.device()));
}

at::Tensor cp_unshard_sequence(const at::Tensor& gathered, int64_t dim, int64_t cp, CpLayout layout) {
  if (cp == 1) return gathered;
  const int64_t d = dim < 0 ? dim + gathered.dim() : dim;
  // gathered[:, j] holds token ids[j]; the inverse permutation puts token t back at t.
  at::Tensor ids = cp_gathered_token_ids(gathered.size(d), cp, layout);
  return gathered.index_select(d, at::argsort(ids).to(gathered.device()));
}

at::Tensor sequence_token_ids(int64_t seq, int64_t cp, int64_t cp_rank, CpLayout layout, int64_t sp_tp,
                              int64_t tp_rank) {
  const at::Tensor ids = cp_token_ids(seq, cp, cp_rank, layout);
  return sp_shard_sequence(ids, 0, sp_tp, tp_rank);
}

at::Tensor sp_shard_sequence(const at::Tensor& x, int64_t dim, int64_t sp_tp, int64_t tp_rank) {
  MIH_CHECK(sp_tp >= 1 && tp_rank >= 0 && tp_rank < sp_tp, "sequence parallelism: tp rank ", tp_rank,
            " is outside [0, tp=", sp_tp, ")");
  if (sp_tp == 1) return x;
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  MIH_CHECK(d >= 0 && d < x.dim(), "sequence parallelism: sequence dim ", dim, " is out of range for a ", x.dim(),
            "-d tensor");
  MIH_CHECK(x.size(d) % sp_tp == 0, "sequence parallelism: ", x.size(d), " tokens (dim ", d, " of ", x.sizes(),
            ") do not split into tp=", sp_tp, " equal chunks; use a sequence length divisible by cp * tp");
  const int64_t n = x.size(d) / sp_tp;
  return x.narrow(d, tp_rank * n, n);
}

at::Tensor CpShard::query_ids(int64_t local_seq) const {
  return cp_token_ids(local_seq * size(), size(), rank(), layout);
}

at::Tensor CpShard::key_ids(int64_t local_seq) const { return cp_gathered_token_ids(local_seq * size(), size(), layout); }

namespace {

// [B or 1, 1, S/CP, S]: true where a query may not attend a key (cp_causal_attention).
at::Tensor hidden_keys(const CpShard& cp, int64_t batch, int64_t local_seq, const CpAttentionMask& mask,
                       c10::Device device) {
  // F21 (docs/fault-catalog.md): the queries numbered in this rank's local coordinates (0..S/CP) while the
  // gathered keys carry global ones, so the causal mask hides the wrong keys.
  const at::Tensor local = at::arange(local_seq, at::kLong);
  const at::Tensor q_ids = fault::active(fault::Fault::kF21) ? local : cp.query_ids(local_seq);
  const at::Tensor k_ids = cp.key_ids(local_seq);
  at::Tensor hidden = (k_ids.unsqueeze(0) > q_ids.unsqueeze(1)).unsqueeze(0);  // [1, S/CP, S]
  if (mask.document_ids.defined()) {
    const at::Tensor& docs = mask.document_ids;
    MIH_CHECK(docs.dim() == 2 && docs.size(0) == batch && docs.size(1) == k_ids.size(0) &&
                  docs.scalar_type() == at::kLong,
              "cp_causal_attention: document_ids must be [B, S] = [", batch, ", ", k_ids.size(0),
              "] int64 (the whole row on every cp rank: declare the field cp-replicated), got ", docs.sizes(), " ",
              docs.scalar_type());
    // F37 (docs/fault-catalog.md): the queries' documents looked up at their local indices, the keys' at
    // their global ids: a cp rank's queries take the documents of the row's first tokens.
    const at::Tensor q_docs = docs.index_select(1, fault::active(fault::Fault::kF37) ? local : q_ids);
    const at::Tensor k_docs = docs.index_select(1, k_ids);
    hidden = hidden | (q_docs.unsqueeze(2) != k_docs.unsqueeze(1));  // [B, S/CP, S]
  }
  MIH_CHECK(mask.window >= 0, "cp_causal_attention: the sliding window must be >= 0 (0: none), got ", mask.window);
  if (mask.window > 0) {
    const at::Tensor distance = q_ids.unsqueeze(1) - k_ids.unsqueeze(0);  // [S/CP, S]
    at::Tensor outside = distance >= mask.window;
    if (fault::active(fault::Fault::kF39) && cp.size() > 1) {
      // F39 (docs/fault-catalog.md): the window of the keys gathered from another cp rank one key
      // wider (distance <= W): at a cp chunk boundary a query sees W + 1 keys.
      const at::Tensor remote = (at::arange(k_ids.size(0), at::kLong) / local_seq != cp.rank()).unsqueeze(0);
      outside = at::where(remote, distance > mask.window, outside);
    }
    hidden = hidden | outside.unsqueeze(0);
  }
  return hidden.unsqueeze(1).to(device);
}

}  // namespace

at::Tensor cp_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CpShard& cp,
                               const CpAttentionMask& mask) {
  MIH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.sizes().slice(0, 3) == v.sizes().slice(0, 3),
            "cp_causal_attention: expected q [B, Hq, S, D], k [B, Hkv, S, D] and v [B, Hkv, S, Dv], got q ", q.sizes(),
            ", k ", k.sizes(), ", v ", v.sizes());
  MIH_CHECK(q.size(0) == k.size(0) && q.size(2) == k.size(2) && q.size(3) == k.size(3),
            "cp_causal_attention: q ", q.sizes(), " and k ", k.sizes(), " disagree on B, S or D");
  const int64_t hq = q.size(1), hkv = k.size(1), local_seq = q.size(2), head_dim = q.size(3);
  MIH_CHECK(hkv > 0 && hq % hkv == 0, "cp_causal_attention: ", hq, " query heads do not group over ", hkv,
            " key/value heads (n_heads must be a multiple of n_kv_heads)");
  // One collective for K and V, side by side on the features (V's width may differ from K's,
  // as in multi-head latent attention): [B, Hkv, S/CP, D + Dv] -> [B, Hkv, S, D + Dv], rank-major.
  at::Tensor kv = at::cat({k, v}, -1);
  if (cp.size() > 1) {
    // The contract (CommVolume): K and V all-gathered over cp, dK and dV reduce-scattered back.
    const int64_t bytes = kv.numel() * static_cast<int64_t>(kv.element_size());
    cp.comm->expect("region.all_gather", bytes, "cp_causal_attention");
    if (at::GradMode::is_enabled() && kv.requires_grad()) {
      cp.comm->expect("region.reduce_scatter", bytes * cp.size(), "cp_causal_attention");
    }
    kv = sequence_all_gather(kv, *cp.comm, 2);
  }
  at::Tensor keys = kv.narrow(-1, 0, head_dim), values = kv.narrow(-1, head_dim, v.size(3));
  if (hq != hkv) {
    keys = keys.repeat_interleave(hq / hkv, 1);
    values = values.repeat_interleave(hq / hkv, 1);
  }
  at::Tensor scores = at::matmul(q, keys.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
  const at::Tensor hidden = hidden_keys(cp, q.size(0), local_seq, mask, q.device());
  scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(scores, -1), values);
}

}  // namespace mih
