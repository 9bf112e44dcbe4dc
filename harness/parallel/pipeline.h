// The pipeline executor (issue 37): runs one training step of a pipeline rank in a schedule's
// order (harness/base/pipeline_schedule.h), sending each micro-batch's activation to the next
// stage's rank and its gradient back to the previous one point to point over the pp group.
// The objective is exactly the unsplit one: every micro-batch's loss is the sum of its valid
// tokens' losses divided by the step's global valid-token count before its backward, so the
// gradients the stages accumulate over the micro-batches are those of
// sum(valid token losses) / global valid tokens on the whole batch (a micro-batch with no
// valid label contributes 0, never 0/0).
//
// Communication: sends are started without waiting (compat::isend; the buffers live until the
// step's end, when every send is waited on), receives wait. Those are the semantics
// pp::order_problems checks an order against, and the step refuses an order it finds a
// problem in before any rank sends anything: a deadlocking order is an error naming where
// each rank waits, never a hang. A stage's successor on the same rank (pp = 1 with virtual
// stages) is handed its tensor in memory.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "harness/base/pipeline_schedule.h"
#include "harness/runtime/communicator.h"

namespace mih::pp {

/// What one pipeline rank computes, for the executor to run in the schedule's order.
struct StageModel {
  /// The forward of micro-batch `micro_batch` through stage `stage` (one of this rank's):
  /// `input` is the activation received from stage - 1, a leaf that requires grad (undefined
  /// on stage 0, which reads its micro-batch itself). Returns the activation for stage + 1,
  /// or on the last stage the loss of every token of the micro-batch, unreduced: [tokens].
  std::function<at::Tensor(int stage, int micro_batch, const at::Tensor& input)> forward;
  /// Last stage: 1 where micro-batch `micro_batch`'s token counts in the loss, 0 where it is
  /// masked: [tokens], any dtype.
  std::function<at::Tensor(int micro_batch)> loss_mask;
  /// An activation of the shape, dtype and device stage `stage` (> 0) receives for
  /// `micro_batch` from stage - 1 (its contents are overwritten).
  std::function<at::Tensor(int stage, int micro_batch)> empty_activation;
  /// Optional: called before the backward of micro-batch `micro_batch` through stage `stage`
  /// (whose activation-checkpointed regions recompute their forward in it), so that the
  /// model's per-micro-batch state is that micro-batch's again, not the last forward's.
  std::function<void(int stage, int micro_batch)> before_backward;
};

/// What one rank's step did.
struct PipelineStep {
  /// The sum of this rank's last-stage micro-batch losses, each normalized by the global
  /// valid-token count (0 on a rank without the last stage): summed over the pp ranks (and the
  /// data-parallel ones), the batch loss of the unsplit objective.
  double loss = 0;
  /// The actions in the order this rank ran them (the evidence's record of the schedule).
  std::vector<Action> executed;
  /// Bytes this rank sent over the pp group (activations forward, their gradients backward).
  int64_t bytes_sent = 0;
  /// The shape and dtype of the first message this rank sent or received over the pp group
  /// (an activation [rows, seq, hidden] or its gradient); empty when it moved none.
  std::vector<int64_t> message_shape;
  std::string message_dtype;
};

/// Runs rank comm.rank()'s part of one step: orders[comm.rank()] in order, the parameter
/// gradients accumulated by autograd (the caller zeroes them before and reduces them over
/// data parallelism after, as without pipelining). `orders` holds every pp rank's order
/// (every rank computes the same pp::schedule), checked whole before anything is sent.
/// `global_valid_tokens`: the valid labels of the whole step over every micro-batch and
/// data-parallel rank (the trainer counts them from the labels).
/// Throws: mih::Error{kInvalidSpec} when comm.size() is not shape.pp, when
///   global_valid_tokens < 1, or listing pp::order_problems of `orders`; as the
///   collectives (kDeadlineExceeded, kUnavailable) for a transport failure; as `model`.
PipelineStep run_pipeline_step(Communicator& comm, ScheduleKind kind, const PipelineShape& shape,
                               const std::vector<std::vector<Action>>& orders, const StageModel& model,
                               int64_t global_valid_tokens);

/// Sums the gradient of a parameter tied across stages (a tied embedding and head: a copy on
/// the first stage and one on the last) over the pp group, in place: `grad` is this rank's
/// copy's gradient, or zeros of its shape on a rank that holds no copy. Afterwards every copy
/// holds the gradient of the one logical parameter, so the copies take the same update and
/// stay identical (Megatron-LM's embedding group; a copy left unsynchronized trains on its
/// own part of the gradient and the copies drift apart, Megatron-LM#844). Call it before
/// clipping (ParallelContext::synchronize_gradients does, for every parameter tied across
/// stages in one flat buffer). Labelled "grad_sync.tied.pp". Throws: as
/// Communicator::all_reduce.
void sum_tied_gradient(Communicator& pp, at::Tensor& grad);

/// The global gradient norm over the pp group: the square root of the sum over the pp ranks
/// of the squared sums of `counted`, the gradients this rank counts: each of its stages'
/// parameters once, a tied parameter only on the first stage that holds a copy (counting both
/// copies makes its contribution twice, the norm "sqrt(2) too large", Megatron-LM#7227).
/// The same value on every rank. Throws: as Communicator::all_reduce.
double pipeline_grad_norm(Communicator& pp, const std::vector<at::Tensor>& counted);

}  // namespace mih::pp
