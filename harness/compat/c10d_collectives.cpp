// The collectives and point-to-point transfers behind collectives.h, with one meaning on every
// libtorch version and backend: Gloo's dtype workarounds, the native-or-fallback forms of
// all_gather_into_tensor and reduce_scatter_tensor, kAvg as a sum then a division, and Work.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "harness/base/error.h"
#include "harness/compat/c10d_internal.h"
#include "harness/compat/collectives.h"

namespace mih::compat {

using internal::BackendState;
using internal::GroupImpl;
using internal::transport_error;
using internal::wait_work;

namespace {

// Starts a collective with `start(backend)` and waits for it.
template <class Start>
void run(const GroupImpl& g, std::string_view op, Start&& start) {
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = start(*g.state->backend);
  } catch (const std::exception& e) {
    throw transport_error(g, op, e);
  }
  wait_work(g, op, work);
}

// Runs the backend's native form of an op when it has one, which is learned at first use:
// a missing native op throws c10::Error synchronously at call time, on every rank, before
// any communication (docs/libtorch-compat.md section 1.5). Returns false when the caller must
// use its fallback.
template <class Start>
bool run_native(const GroupImpl& g, std::atomic<int>& native, std::string_view op, Start&& start) {
  if (native.load() == 0) return false;
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = start(*g.state->backend);
  } catch (const c10::Error& e) {
    if (native.load() == 1) throw transport_error(g, op, e);  // it worked before: a real error
    native = 0;
    return false;
  }
  native = 1;
  wait_work(g, op, work);
  return true;
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // sum, then divide: see the file comment in collectives.h
      return c10d::ReduceOp::SUM;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
  }
  MIH_THROW(Code::kInternal, "unknown ReduceOp ", static_cast<int>(op));
}

void check_tensor(const GroupImpl& g, std::string_view op, const at::Tensor& t, const char* what) {
  MIH_CHECK(t.defined(), op, " on group '", g.name, "': '", what, "' is an undefined tensor");
  if (g.kind == BackendKind::kNccl) {
    MIH_CHECK(t.is_cuda(), op, " on group '", g.name, "' (nccl): '", what,
              "' must be a CUDA tensor, got device ", t.device().str());
  }
}

// Gloo moves only the types it can reduce (1.13: float, double, half, int8, uint8, int32,
// int64). bfloat16 travels as float16 and bool as uint8: same width, and data movement
// copies bytes without arithmetic, so the result is bit exact.
at::Tensor as_movable(const GroupImpl& g, const at::Tensor& t) {
  if (g.kind != BackendKind::kGloo) return t;
  if (t.scalar_type() == at::kBFloat16) return t.view(at::kHalf);
  if (t.scalar_type() == at::kBool) return t.view(at::kByte);
  return t;
}

// Gloo reduces neither bfloat16 (before 2.2) nor bool: reduce in a wider type.
c10::optional<at::ScalarType> reduction_upcast(const GroupImpl& g, at::ScalarType dtype) {
  if (dtype == at::kBool) return at::kInt;
  if (g.kind == BackendKind::kGloo && dtype == at::kBFloat16) return at::kFloat;
  return c10::nullopt;
}

void divide_for_avg(at::Tensor& t, int size) {
  if (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type())) {
    t.div_(size);
  } else {
    t.div_(size, "trunc");
  }
}

}  // namespace

void all_reduce(const Group& group, at::Tensor& tensor, ReduceOp op) {
  const GroupImpl& g = *group.impl();
  check_tensor(g, "all_reduce", tensor, "tensor");
  MIH_CHECK(!(op == ReduceOp::kAvg && tensor.scalar_type() == at::kBool),
            "all_reduce on group '", g.name, "': avg of a bool tensor is undefined; use max (any) or min (all)");
  if (g.kind == BackendKind::kSelf) return;  // one member: sum, avg, max and min are identity

  at::Tensor work = tensor.is_contiguous() ? tensor : tensor.contiguous();
  auto upcast = reduction_upcast(g, tensor.scalar_type());
  if (upcast) work = work.to(*upcast);
  std::vector<at::Tensor> list{work};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = g.state->timeout;
  run(g, "all_reduce", [&](internal::C10dBackend& b) { return b.allreduce(list, o); });
  if (op == ReduceOp::kAvg) divide_for_avg(work, group.size());
  if (tensor.scalar_type() == at::kBool) work = work.ne(0);  // sum/max: any, min: all
  if (!work.is_same(tensor)) tensor.copy_(work);
}

void all_gather_into_tensor(const Group& group, at::Tensor& output, const at::Tensor& input) {
  const GroupImpl& g = *group.impl();
  check_tensor(g, "all_gather_into_tensor", output, "output");
  check_tensor(g, "all_gather_into_tensor", input, "input");
  MIH_CHECK(output.scalar_type() == input.scalar_type(), "all_gather_into_tensor on group '", g.name,
            "': output dtype ", output.scalar_type(), " != input dtype ", input.scalar_type());
  MIH_CHECK(output.numel() == input.numel() * group.size(), "all_gather_into_tensor on group '", g.name,
            "': output must hold size(", group.size(), ") * input.numel(", input.numel(), ") = ",
            input.numel() * group.size(), " elements, got ", output.numel());
  if (g.kind == BackendKind::kSelf) {
    output.view(-1).copy_(input.reshape(-1));
    return;
  }
  at::Tensor out = output.is_contiguous() ? output : at::empty_like(output, at::MemoryFormat::Contiguous);
  at::Tensor in = as_movable(g, input.contiguous().view(-1));
  at::Tensor flat_out = as_movable(g, out.view(-1));
  BackendState& s = *g.state;
  c10d::AllgatherOptions o;
  o.timeout = s.timeout;
  // Gloo before 2.2 (PR #112144) has no _allgather_base: the list form below.
  bool done = run_native(g, s.native_all_gather, "all_gather_into_tensor",
                         [&](internal::C10dBackend& b) { return b._allgather_base(flat_out, in, o); });
  if (!done) {
    std::vector<std::vector<at::Tensor>> outs{flat_out.chunk(group.size())};
    std::vector<at::Tensor> ins{in};
    run(g, "all_gather_into_tensor", [&](internal::C10dBackend& b) { return b.allgather(outs, ins, o); });
  }
  if (!out.is_same(output)) output.copy_(out);
}

void reduce_scatter_tensor(const Group& group, at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  const GroupImpl& g = *group.impl();
  check_tensor(g, "reduce_scatter_tensor", output, "output");
  check_tensor(g, "reduce_scatter_tensor", input, "input");
  MIH_CHECK(output.scalar_type() == input.scalar_type(), "reduce_scatter_tensor on group '", g.name,
            "': output dtype ", output.scalar_type(), " != input dtype ", input.scalar_type());
  MIH_CHECK(input.numel() == output.numel() * group.size(), "reduce_scatter_tensor on group '", g.name,
            "': input must hold size(", group.size(), ") * output.numel(", output.numel(), ") = ",
            output.numel() * group.size(), " elements, got ", input.numel());
  if (g.kind == BackendKind::kSelf) {
    output.view(-1).copy_(input.reshape(-1));
    return;
  }
  BackendState& s = *g.state;
  bool upcast = reduction_upcast(g, input.scalar_type()).has_value();
  if (!upcast) {
    at::Tensor out = output.is_contiguous() ? output : at::empty_like(output, at::MemoryFormat::Contiguous);
    at::Tensor in = input.contiguous();
    at::Tensor flat_out = out.view(-1);
    at::Tensor flat_in = in.view(-1);
    c10d::ReduceScatterOptions o;
    o.reduceOp = to_c10d(op);
    o.timeout = s.timeout;
    // Gloo before 2.2 has no _reduce_scatter_base: the fallback below.
    if (run_native(g, s.native_reduce_scatter, "reduce_scatter_tensor",
                   [&](internal::C10dBackend& b) { return b._reduce_scatter_base(flat_out, flat_in, o); })) {
      if (op == ReduceOp::kAvg) divide_for_avg(out, group.size());
      if (!out.is_same(output)) output.copy_(out);
      return;
    }
  }
  // Fallback: all-reduce a copy and keep this rank's chunk (2x the traffic; Gloo only).
  at::Tensor reduced = input.contiguous().clone();
  all_reduce(group, reduced, op);
  output.view(-1).copy_(reduced.view(-1).chunk(group.size())[group.rank()]);
}

void broadcast(const Group& group, at::Tensor& tensor, int root) {
  const GroupImpl& g = *group.impl();
  check_tensor(g, "broadcast", tensor, "tensor");
  MIH_CHECK(root >= 0 && root < group.size(), "broadcast on group '", g.name, "': root ", root,
            " is not a group rank in [0, ", group.size(), ")");
  if (g.kind == BackendKind::kSelf) return;
  at::Tensor work = tensor.is_contiguous() ? tensor : tensor.contiguous();
  std::vector<at::Tensor> list{as_movable(g, work)};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = g.state->timeout;
  run(g, "broadcast", [&](internal::C10dBackend& b) { return b.broadcast(list, o); });
  if (!work.is_same(tensor)) tensor.copy_(work);
}

void all_to_all_single(const Group& group, at::Tensor& output, const at::Tensor& input,
                       const std::vector<int64_t>& output_splits, const std::vector<int64_t>& input_splits) {
  const GroupImpl& g = *group.impl();
  check_tensor(g, "all_to_all_single", output, "output");
  check_tensor(g, "all_to_all_single", input, "input");
  MIH_CHECK(output.scalar_type() == input.scalar_type(), "all_to_all_single on group '", g.name,
            "': output dtype ", output.scalar_type(), " != input dtype ", input.scalar_type());
  MIH_CHECK(input.dim() >= 1 && output.dim() >= 1, "all_to_all_single on group '", g.name,
            "': input and output need a dim 0 to split");
  auto check_splits = [&](const std::vector<int64_t>& splits, const at::Tensor& t, const char* what) {
    if (splits.empty()) {
      MIH_CHECK(t.size(0) % group.size() == 0, "all_to_all_single on group '", g.name, "': ", what,
                " dim 0 (", t.size(0), ") is not divisible by the group size (", group.size(),
                "); pass explicit splits");
      return;
    }
    MIH_CHECK(static_cast<int>(splits.size()) == group.size(), "all_to_all_single on group '", g.name,
              "': ", what, "_splits has ", splits.size(), " entries, expected one per rank (",
              group.size(), ")");
    int64_t sum = 0;
    for (int64_t s : splits) {
      MIH_CHECK(s >= 0, "all_to_all_single on group '", g.name, "': negative split ", s);
      sum += s;
    }
    MIH_CHECK(sum == t.size(0), "all_to_all_single on group '", g.name, "': ", what,
              "_splits sum to ", sum, " but dim 0 of ", what, " is ", t.size(0));
  };
  check_splits(input_splits, input, "input");
  check_splits(output_splits, output, "output");
  if (g.kind == BackendKind::kSelf) {
    output.copy_(input);
    return;
  }
  at::Tensor out = output.is_contiguous() ? output : at::empty_like(output, at::MemoryFormat::Contiguous);
  at::Tensor in = as_movable(g, input.contiguous());
  at::Tensor moved_out = as_movable(g, out);
  std::vector<int64_t> out_splits = output_splits;
  std::vector<int64_t> in_splits = input_splits;
  c10d::AllToAllOptions o;
  o.timeout = g.state->timeout;
  run(g, "all_to_all_single",
      [&](internal::C10dBackend& b) { return b.alltoall_base(moved_out, in, out_splits, in_splits, o); });
  if (!out.is_same(output)) output.copy_(out);
}

void barrier(const Group& group) {
  const GroupImpl& g = *group.impl();
  if (g.kind == BackendKind::kSelf) return;
  c10d::BarrierOptions o;
  o.timeout = g.state->timeout;
  if (g.kind == BackendKind::kNccl) o.device_ids = {g.state->device_index};
  run(g, "barrier", [&](internal::C10dBackend& b) { return b.barrier(o); });
}

// ---- Point to point ------------------------------------------------------------------------

struct Work::Impl {
  std::shared_ptr<GroupImpl> group;
  std::string op;
  c10::intrusive_ptr<c10d::Work> work;
  std::vector<at::Tensor> tensors;  // kept alive until the transfer completes
  at::Tensor copy_back_to;          // recv into a non-contiguous tensor
};

Work::Work(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Work::Work(Work&&) noexcept = default;
Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    if (impl_) {
      try {
        wait();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "mih: pending %s dropped with an error: %s\n", impl_->op.c_str(), e.what());
      }
    }
    impl_ = std::move(other.impl_);
  }
  return *this;
}

Work::~Work() {
  if (!impl_) return;
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mih: pending %s dropped with an error: %s\n", impl_ ? impl_->op.c_str() : "p2p",
                 e.what());
  }
}

void Work::wait() {
  if (!impl_) return;
  std::unique_ptr<Impl> impl = std::move(impl_);
  if (impl->work) wait_work(*impl->group, impl->op, impl->work);
  if (impl->copy_back_to.defined()) impl->copy_back_to.copy_(impl->tensors.front());
}

namespace {
Work start_p2p(const Group& group, const at::Tensor& tensor, int peer, int tag, bool is_send) {
  const GroupImpl& g = *group.impl();
  const char* op = is_send ? "send" : "recv";
  check_tensor(g, op, tensor, "tensor");
  MIH_CHECK(peer >= 0 && peer < group.size() && peer != group.rank(), op, " on group '", g.name,
            "': peer ", peer, " must be another group rank in [0, ", group.size(), "), this rank is ",
            group.rank());
  auto impl = std::make_unique<Work::Impl>();
  impl->group = group.impl();
  impl->op = mih::internal::str(op, is_send ? " to group rank " : " from group rank ", peer);
  at::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
  if (!is_send && !buffer.is_same(tensor)) impl->copy_back_to = tensor;
  impl->tensors = {as_movable(g, buffer)};
  try {
    impl->work = is_send ? g.state->backend->send(impl->tensors, peer, tag)
                         : g.state->backend->recv(impl->tensors, peer, tag);
  } catch (const std::exception& e) {
    throw transport_error(g, impl->op, e);
  }
  if (impl->copy_back_to.defined()) impl->tensors = {buffer};
  return Work(std::move(impl));
}
}  // namespace

Work isend(const Group& group, const at::Tensor& tensor, int dst, int tag) {
  return start_p2p(group, tensor, dst, tag, /*is_send=*/true);
}

Work irecv(const Group& group, at::Tensor& tensor, int src, int tag) {
  return start_p2p(group, tensor, src, tag, /*is_send=*/false);
}

}  // namespace mih::compat
