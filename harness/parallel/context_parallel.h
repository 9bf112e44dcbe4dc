// Context parallelism (CP): the sequence dim of every activation is sharded over the cp axis,
// and attention all-gathers K and V over cp so each rank's queries see every key
// (spike_ac_cp.md section 2; Megatron-LM's context parallelism without the ring). Which
// tokens a rank holds is the layout:
//   contiguous: rank r holds tokens [r*S/CP, (r+1)*S/CP);
//   zigzag:     the sequence is cut into 2*CP chunks and rank r holds chunks r and 2*CP-1-r,
//               which balances causal attention work (Megatron-LM / TransformerEngine).
// Masks and rotary positions are computed from global token ids, never from a rank offset:
// an offset formula is right for one layout only (spike_ac_cp.md section 2.3).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <ATen/core/Tensor.h>

#include "harness/runtime/communicator.h"
#include "harness/base/parallel_config.h"  // CpLayout

namespace mih {

/// The global indices of the tokens cp rank `rank` holds, in local order.
/// Shape: [S/CP] int64 (CPU).
/// Throws: mih::Error{kInvalidSpec} if S does not divide by CP (contiguous) or 2*CP (zigzag),
///   naming the sizes and the fix.
at::Tensor cp_token_ids(int64_t seq, int64_t cp, int64_t rank, CpLayout layout);

/// The global indices of the keys after an all-gather over cp (rank-major: rank 0's tokens,
/// then rank 1's, ...); not monotone for zigzag. Shape: [S] int64 (CPU).
at::Tensor cp_gathered_token_ids(int64_t seq, int64_t cp, CpLayout layout);

/// This cp rank's tokens of `x` along `dim` (index_select with cp_token_ids).
/// Shape: [.., S, ..] -> [.., S/CP, ..].
at::Tensor cp_shard_sequence(const at::Tensor& x, int64_t dim, int64_t cp, int64_t rank, CpLayout layout);

/// Puts a rank-major gathered sequence back in global token order along `dim` (the inverse
/// of sharding then all-gathering). Shape: [.., S, ..] -> [.., S, ..].
at::Tensor cp_unshard_sequence(const at::Tensor& gathered, int64_t dim, int64_t cp, CpLayout layout);

/// Where a rank's local tokens sit in the sequence: what CP attention and rotary embeddings
/// need. At cp = 1 the ids are 0..S-1 and attention is plain causal attention.
struct CpShard {
  Communicator* comm = nullptr;  ///< the cp axis (size 1 when CP is off)
  CpLayout layout = CpLayout::kContiguous;

  int64_t size() const { return comm ? comm->size() : 1; }
  int64_t rank() const { return comm ? comm->rank() : 0; }
  /// Global ids of the local tokens, [S/CP], for a local length of `local_seq` tokens.
  at::Tensor query_ids(int64_t local_seq) const;
  /// Global ids of the gathered keys, [S], rank-major.
  at::Tensor key_ids(int64_t local_seq) const;
};

/// Causal scaled-dot-product attention over a sequence sharded on cp, with grouped-query
/// attention (each group of n_heads / n_kv_heads query heads shares one K/V head; Ainslie et
/// al. 2023). K and V are stacked and all-gathered over cp in one collective (its backward
/// reduce-scatters dK and dV, summing every rank's queries' contributions); the causal mask
/// is key_id > query_id in global ids, so any layout is exact. Softmax scale 1/sqrt(D).
/// Shapes: q [B, Hq, S/CP, D], k and v [B, Hkv, S/CP, D] (Hq, Hkv: this tp rank's heads)
///   -> [B, Hq, S/CP, D].
/// Throws: mih::Error{kInvalidSpec} if Hq is not a multiple of Hkv or the shapes disagree.
at::Tensor cp_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CpShard& cp);

}  // namespace mih
