// Autograd region functions: the collectives of tensor, sequence and fully-sharded data
// parallelism as differentiable ops (Megatron-LM's mappings.py, PyTorch FSDP's all-gather).
// Each is the identity on a 1-rank axis, so a model written with them is plain single-device
// code at degree 1. Every backward runs its collective exactly once: a second backward
// through the same graph throws instead of silently re-reducing (docs/spike-fsdp.md section 3.4).
//
// Shapes: `dim` is any tensor dim (negative counts from the end); N = the axis size.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Optional.h>

#include "harness/runtime/communicator.h"

namespace mih {

/// Forward: identity. Backward: all-reduce (sum) of the gradient over `comm`.
/// Megatron's f / copy_to_tensor_model_parallel_region: enter a region where each rank
/// computes a partial result from the same input.
at::Tensor copy_to_region(const at::Tensor& x, Communicator& comm);

/// Forward: all-reduce (sum) over `comm`. Backward: identity. Megatron's g /
/// reduce_from_tensor_model_parallel_region: leave a region of partial sums.
at::Tensor reduce_from_region(const at::Tensor& x, Communicator& comm);

/// Forward: all-gather along `dim`, [.., D, ..] -> [.., N*D, ..]. Backward: this rank's chunk
/// of the gradient along `dim`.
at::Tensor gather_from_region(const at::Tensor& x, Communicator& comm, int64_t dim);

/// Sequence parallelism, entering a tensor-parallel region: forward all-gather along the
/// sequence dim, [B, S/TP, H] -> [B, S, H]; backward reduce-scatter (sum) along it.
at::Tensor sequence_all_gather(const at::Tensor& x, Communicator& comm, int64_t seq_dim);

/// Sequence parallelism, leaving a tensor-parallel region: forward reduce-scatter (sum)
/// along the sequence dim, [B, S, H] partial -> [B, S/TP, H]; backward all-gather.
/// Throws: mih::Error{kInvalidSpec} if S does not divide by TP.
at::Tensor sequence_reduce_scatter(const at::Tensor& x, Communicator& comm, int64_t seq_dim);

/// FSDP parameter all-gather over `comm` (dp_shard): forward gathers every rank's dim-0 rows
/// (uneven: chunks of ceil(rows / N), the last ones shorter or empty) into the full tensor of
/// `full_rows` rows, cast to `compute_dtype`; backward reduce-scatters (sum) the gradient in
/// `reduce_dtype` and returns this rank's rows, in the shard's dtype, as a fresh tensor.
/// `reduce_site` labels the reduce-scatter in the comm ledger (a string literal: the ledger
/// keeps the pointer; ParallelContext passes its reduction path's site, reduction_paths.h).
/// Shape: shard [rows_r, ...] -> [full_rows, ...].
at::Tensor fsdp_all_gather(const at::Tensor& shard, Communicator& comm, int64_t full_rows,
                           c10::optional<c10::ScalarType> compute_dtype = c10::nullopt,
                           c10::optional<c10::ScalarType> reduce_dtype = c10::nullopt,
                           const char* reduce_site = "fsdp.reduce_scatter");

/// Expert-parallel token exchange (dispatch and combine): forward sends input_splits[j]
/// rows of `x` (dim 0, in order) to axis rank j and returns the rows received,
/// output_splits[j] from rank j, in rank order; backward is the reverse all-to-all of the
/// gradient (the splits swapped). Every member passes the splits its peers expect
/// (output_splits[j] on rank i = input_splits[i] on rank j: exchange the counts first).
/// Shape: [sum(input_splits), ...] -> [sum(output_splits), ...].
/// Throws: mih::Error{kInvalidSpec} if a split list does not have one entry per axis rank,
///   a split is negative, or input_splits does not sum to x's dim 0.
at::Tensor all_to_all_rows(const at::Tensor& x, Communicator& comm, const std::vector<int64_t>& output_splits,
                           const std::vector<int64_t>& input_splits);

/// Gathers `x` along `dim` over `comm` without autograd (for full-tensor gathers and checks).
/// Shape: [.., D, ..] -> [.., N*D, ..].
at::Tensor all_gather_dim(const at::Tensor& x, Communicator& comm, int64_t dim);

}  // namespace mih
