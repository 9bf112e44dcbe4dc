// Which tokens of a sequence a rank holds, and context-parallel attention. Context
// parallelism (CP) shards the sequence dim of every activation over the cp axis, and attention
// all-gathers K and V over cp so each rank's queries see every key (docs/spike-ac-cp.md section 2;
// Megatron-LM's context parallelism without the ring). Which tokens a cp rank holds is the
// layout:
//   contiguous: rank r holds tokens [r*S/CP, (r+1)*S/CP);
//   zigzag:     the sequence is cut into 2*CP chunks and rank r holds chunks r and 2*CP-1-r,
//               which balances causal attention work (Megatron-LM / TransformerEngine).
// Sequence parallelism (SP: tp > 1 with ParallelConfig::sequence_parallel) then cuts a cp
// rank's tokens once more between the tensor-parallel layers: tp rank t holds the t-th of TP
// contiguous chunks of them (sequence_token_ids, sp_shard_sequence; in a model,
// ParallelContext::sequence_parallel_chunk and local_token_ids).
// Masks and positions are computed from global token ids, never from a rank offset: an offset
// formula is right for one layout only (docs/spike-ac-cp.md section 2.3).
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

/// The global indices of the tokens one rank holds of a sequence of `seq` tokens, in local
/// order: cp rank `cp_rank`'s tokens (cp_token_ids), and of those, with `sp_tp` > 1 (sequence
/// parallelism over tp ranks, in the regions between tensor-parallel layers), the
/// `tp_rank`-th of `sp_tp` contiguous chunks: what sequence_reduce_scatter (regions.h) leaves
/// that rank, e.g. the output of VocabParallelEmbedding, of RowParallelLinear and of a norm
/// on the residual stream. Example: seq 16, cp 2 zigzag, sp_tp 2: cp rank 0 holds tokens
/// {0..3, 12..15}; its tp rank 0 holds {0, 1, 2, 3}, tp rank 1 {12, 13, 14, 15}.
/// The one implementation of this layout: the activation probes and dropout masks place
/// elements with it (activations.h) and ports line batch fields up with it.
/// Shape: [S / (CP * sp_tp)] int64 (CPU).
/// Throws: mih::Error{kInvalidSpec} if S does not split over cp (as cp_token_ids), if a cp
///   rank's S/CP tokens do not split into sp_tp chunks, or a rank is out of range.
at::Tensor sequence_token_ids(int64_t seq, int64_t cp, int64_t cp_rank, CpLayout layout, int64_t sp_tp = 1,
                              int64_t tp_rank = 0);

/// The `tp_rank`-th of `sp_tp` contiguous chunks of `x` along `dim`: a sequence-parallel rank's
/// tokens of a tensor that holds its cp rank's whole local sequence on `dim` (a batch field as
/// the Trainer hands it to the model). Identity when sp_tp == 1.
/// Shape: [.., S/CP, ..] -> [.., S/(CP*sp_tp), ..].
/// Throws: mih::Error{kInvalidSpec} if dim `dim` does not split into sp_tp equal chunks.
at::Tensor sp_shard_sequence(const at::Tensor& x, int64_t dim, int64_t sp_tp, int64_t tp_rank);

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

/// What cp_causal_attention hides besides the future, in global token ids.
struct CpAttentionMask {
  /// Which document of its row each token is, for the whole row on every cp rank (a field the
  /// Trainer hands whole to every cp rank: TrainerOptions::cp_replicated_fields): a query
  /// attends only to keys of its own document (block-causal; TextPipelineOptions::document_ids).
  /// Looked up at the queries' and the gathered keys' global ids, so any layout is exact and a
  /// document that straddles a cp chunk boundary stays one document. Shape: [B, S] int64.
  /// Undefined (default): every row one document.
  at::Tensor document_ids;
  /// Sliding window W > 0: query q attends key k only if q - W < k <= q, in global token ids
  /// (transformers' sliding_window: a query sees itself and the W - 1 keys before it), so the
  /// window reaches across cp chunk boundaries exactly; composes with document_ids. 0
  /// (default): no window.
  int64_t window = 0;
};

/// Causal scaled-dot-product attention over a sequence sharded on cp, with grouped-query
/// attention (each group of n_heads / n_kv_heads query heads shares one K/V head; Ainslie et
/// al. 2023). K and V are stacked and all-gathered over cp in one collective (its backward
/// reduce-scatters dK and dV, summing every rank's queries' contributions); the causal mask
/// is key_id > query_id in global ids, so any layout is exact; `mask` hides more (documents).
/// Softmax scale 1/sqrt(D).
/// Shapes: q [B, Hq, S/CP, D], k [B, Hkv, S/CP, D], v [B, Hkv, S/CP, Dv] (Hq, Hkv: this tp
///   rank's heads; Dv may differ from D, as multi-head latent attention's) -> [B, Hq, S/CP, Dv]; mask.document_ids [B, S].
/// Throws: mih::Error{kInvalidSpec} if Hq is not a multiple of Hkv, the shapes disagree, or
///   mask.document_ids is not [B, S] (S = S/CP * CP) int64.
at::Tensor cp_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CpShard& cp,
                               const CpAttentionMask& mask = {});

}  // namespace mih
