// The pipeline executor (see pipeline.h).
#include "harness/parallel/pipeline.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include <ATen/ATen.h>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/base/strings.h"
#include "harness/runtime/dtypes.h"

namespace mih::pp {

namespace {

// A p2p message's tag: the stage boundary it crosses (the receiving stage for an activation,
// the sending stage for a gradient, both = the later stage), the micro-batch, the direction.
int tag_of(const PipelineShape& shape, int later_stage, int micro_batch, bool gradient) {
  return (later_stage * shape.micro_batches + micro_batch) * 2 + (gradient ? 1 : 0);
}

}  // namespace

PipelineStep run_pipeline_step(Communicator& comm, ScheduleKind kind, const PipelineShape& shape,
                               const std::vector<std::vector<Action>>& orders, const StageModel& model,
                               int64_t global_valid_tokens) {
  MIH_CHECK(comm.size() == shape.pp, "pipeline: the pp group (axis ", comm.axis(), ") has ", comm.size(),
            " rank(s), the pipeline pp(", shape.pp, ")");
  MIH_CHECK(global_valid_tokens >= 1, "pipeline: the step has ", global_valid_tokens,
            " valid label(s): a step's loss is normalized by its valid-token count, which must be >= 1");
  if (const std::vector<std::string> problems = order_problems(kind, shape, orders); !problems.empty()) {
    MIH_THROW(Code::kInvalidSpec, "pipeline: the ", schedule_name(kind), " order of pp(", shape.pp, ") x vpp(",
              shape.vpp, ") with ", shape.micro_batches, " micro-batches is not a valid step (nothing was sent):\n  ",
              join(problems, "\n  "));
  }
  const int me = comm.rank();
  const int last = shape.stages() - 1;
  const double normalizer = static_cast<double>(global_valid_tokens);
  struct Slot {
    at::Tensor input;   // the received activation (a leaf), undefined on stage 0
    at::Tensor output;  // the activation sent on, or the last stage's normalized loss
  };
  std::map<std::pair<int, int>, Slot> slots;  // (stage, micro-batch) in flight
  std::vector<compat::Work> sends;
  std::vector<at::Tensor> send_buffers;       // alive until every send is waited on
  std::map<int, at::Tensor> local;            // by tag: a successor stage on this rank
  PipelineStep step;
  auto note_message = [&](const at::Tensor& t) {
    if (!step.message_shape.empty()) return;
    step.message_shape = t.sizes().vec();
    step.message_dtype = dtype_name(t.scalar_type());
  };
  auto send = [&](const at::Tensor& t, int stage_to, int tag) {
    const int dst = shape.rank_of(stage_to);
    at::Tensor buffer = t.detach().contiguous();
    if (dst == me) {
      local[tag] = buffer;
      return;
    }
    step.bytes_sent += buffer.numel() * static_cast<int64_t>(buffer.element_size());
    note_message(buffer);
    sends.push_back(comm.isend(buffer, dst, tag, tag % 2 == 0 ? "pipeline.activation" : "pipeline.gradient"));
    send_buffers.push_back(std::move(buffer));
  };
  auto receive = [&](at::Tensor into, int stage_from, int tag) {
    const int src = shape.rank_of(stage_from);
    if (src == me) {
      const auto it = local.find(tag);
      MIH_INTERNAL_ASSERT(it != local.end(), "a local pipeline message missing");
      into.copy_(it->second);
      local.erase(it);
      return into;
    }
    comm.recv(into, src, tag, tag % 2 == 0 ? "pipeline.activation" : "pipeline.gradient");
    note_message(into);
    return into;
  };
  for (const Action& a : orders[static_cast<size_t>(me)]) {
    const std::pair<int, int> key{a.stage, a.micro_batch};
    if (a.kind == Action::Kind::kForward) {
      Slot slot;
      if (a.stage > 0) {
        slot.input = receive(model.empty_activation(a.stage, a.micro_batch), a.stage - 1,
                             tag_of(shape, a.stage, a.micro_batch, false));
        slot.input.requires_grad_(true);
      }
      at::Tensor out = model.forward(a.stage, a.micro_batch, slot.input);
      if (a.stage == last) {
        // The micro-batch's share of the step's objective: its valid tokens' losses over the
        // step's valid-token count (a micro-batch without a valid label contributes 0).
        const at::Tensor mask = model.loss_mask(a.micro_batch).to(out.scalar_type());
        MIH_CHECK(mask.sizes() == out.sizes(), "pipeline: micro-batch ", a.micro_batch, "'s loss has shape ",
                  out.sizes(), " and its loss mask ", mask.sizes(), ": the last stage returns one loss per token");
        // F33 (docs/fault-catalog.md): each micro-batch's loss averaged over its own valid tokens and
        // backpropagated so, never normalized by the step's count (the micro-batches summed).
        out = fault::active(fault::Fault::kF33) ? (out * mask).sum() / std::max(mask.sum().item<double>(), 1.0)
                                                : (out * mask).sum() / normalizer;
        step.loss += out.item<double>();
      } else {
        send(out, a.stage + 1, tag_of(shape, a.stage + 1, a.micro_batch, false));
      }
      slot.output = out;
      slots[key] = std::move(slot);
    } else {
      Slot& slot = slots.at(key);  // order_problems: every backward follows its forward
      if (model.before_backward) model.before_backward(a.stage, a.micro_batch);
      if (a.stage == last) {
        slot.output.backward();
      } else {
        at::Tensor grad = receive(at::empty_like(slot.output), a.stage + 1, tag_of(shape, a.stage + 1, a.micro_batch, true));
        slot.output.backward(grad);
      }
      if (a.stage > 0) {
        const at::Tensor g = slot.input.grad();
        send(g.defined() ? g : at::zeros_like(slot.input), a.stage - 1, tag_of(shape, a.stage, a.micro_batch, true));
      }
      slots.erase(key);  // its activations are freed here
    }
    step.executed.push_back(a);
  }
  for (compat::Work& w : sends) w.wait();
  return step;
}

void sum_tied_gradient(Communicator& pp, at::Tensor& grad) {
  MIH_CHECK(grad.defined(), "pipeline: a tied parameter's gradient is undefined on pp rank ", pp.rank(),
            ": pass zeros of its shape on a rank that holds no copy");
  pp.all_reduce(grad, ReduceOp::kSum, "grad_sync.tied.pp");
}

double pipeline_grad_norm(Communicator& pp, const std::vector<at::Tensor>& counted) {
  // On the gradients' device: an NCCL group moves only CUDA tensors.
  c10::Device device(c10::DeviceType::CPU);
  for (const at::Tensor& g : counted) {
    if (g.defined()) device = g.device();
  }
  at::Tensor sq = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (const at::Tensor& g : counted) {
    if (g.defined()) sq += g.to(at::kDouble).pow(2).sum();
  }
  pp.all_reduce(sq);
  return std::sqrt(sq.item<double>());
}

}  // namespace mih::pp
