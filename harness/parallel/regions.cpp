// The autograd Functions behind regions.h. The Communicator travels to backward as an integer
// in saved_data (it outlives the graph: the mesh owns it); an empty save_for_backward plus
// get_saved_variables in backward turns a second backward into an error.
#include "harness/parallel/regions.h"

#include <torch/csrc/autograd/custom_function.h>

#include <ATen/ATen.h>

#include "harness/base/error.h"

namespace mih {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Communicator& comm_of(int64_t id) { return *reinterpret_cast<Communicator*>(static_cast<intptr_t>(id)); }

void save_comm(AutogradContext* ctx, int64_t comm_id) {
  ctx->saved_data["comm"] = comm_id;
  ctx->save_for_backward({});  // see the file comment: guards against a second backward
}

Communicator& saved_comm(AutogradContext* ctx) {
  ctx->get_saved_variables();  // throws on a second backward through this node
  return comm_of(ctx->saved_data["comm"].toInt());
}

int64_t normalize_dim(const at::Tensor& x, int64_t dim) {
  int64_t d = dim < 0 ? dim + x.dim() : dim;
  MIH_CHECK(d >= 0 && d < x.dim(), "dim ", dim, " is out of range for a ", x.dim(), "-d tensor");
  return d;
}

at::Tensor gather_along(const at::Tensor& x, Communicator& comm, int64_t dim) {
  if (comm.size() == 1) return x;
  return comm.all_gather(x.contiguous(), dim, "region.all_gather");
}

// The backward of gather_along: the gradient's size along `dim` is N times the input's.
at::Tensor chunk_along(const at::Tensor& x, Communicator& comm, int64_t dim) {
  if (comm.size() == 1) return x;
  MIH_INTERNAL_ASSERT(x.size(dim) % comm.size() == 0, "gather's gradient: dim ", dim, " of size ", x.size(dim),
                      " does not split over the ", comm.size(), " ranks of axis '", comm.axis(), "'");
  return x.chunk(comm.size(), dim)[comm.rank()].contiguous();
}

// Reduce-scatter (sum) along `dim`: [.., N*D, ..] -> [.., D, ..].
at::Tensor reduce_scatter_along(const at::Tensor& x, Communicator& comm, int64_t dim) {
  if (comm.size() == 1) return x;
  MIH_CHECK(x.size(dim) % comm.size() == 0, "cannot reduce-scatter dim ", dim, " of size ", x.size(dim),
            " over the ", comm.size(), " ranks of axis '", comm.axis(), "': it must divide evenly");
  // The collective works on dim 0: bring `dim` to the front, contiguously.
  at::Tensor front = x.movedim(dim, 0).contiguous();
  auto out_sizes = front.sizes().vec();
  out_sizes[0] /= comm.size();
  at::Tensor out = at::empty(out_sizes, front.options());
  comm.reduce_scatter_tensor(out, front, ReduceOp::kSum, "region.reduce_scatter");
  return out.movedim(0, dim).contiguous();
}

struct CopyToRegion : public torch::autograd::Function<CopyToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm_id) {
    save_comm(ctx, comm_id);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Communicator& comm = saved_comm(ctx);
    at::Tensor g = grads[0].contiguous().clone();
    comm.all_reduce(g, ReduceOp::kSum, "region.copy_to.backward");
    return {g, at::Tensor()};
  }
};

struct ReduceFromRegion : public torch::autograd::Function<ReduceFromRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm_id) {
    save_comm(ctx, comm_id);
    at::Tensor y = x.contiguous().clone();
    comm_of(comm_id).all_reduce(y, ReduceOp::kSum, "region.reduce_from");
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    saved_comm(ctx);
    return {grads[0], at::Tensor()};
  }
};

using DimOp = at::Tensor (*)(const at::Tensor&, Communicator&, int64_t);

// A region along a tensor dim: `Forward` in forward, its conjugate `Backward` in backward.
template <DimOp Forward, DimOp Backward>
struct DimRegion : public torch::autograd::Function<DimRegion<Forward, Backward>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm_id, int64_t dim) {
    save_comm(ctx, comm_id);
    ctx->saved_data["dim"] = dim;
    return Forward(x, comm_of(comm_id), dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Communicator& comm = saved_comm(ctx);
    return {Backward(grads[0], comm, ctx->saved_data["dim"].toInt()), at::Tensor(), at::Tensor()};
  }
};

using GatherFromRegion = DimRegion<gather_along, chunk_along>;
using SequenceAllGather = DimRegion<gather_along, reduce_scatter_along>;
using SequenceReduceScatter = DimRegion<reduce_scatter_along, gather_along>;

// The rows of `x` exchanged by the splits (no autograd): see all_to_all_rows.
at::Tensor exchange_rows(const at::Tensor& x, Communicator& comm, const std::vector<int64_t>& output_splits,
                         const std::vector<int64_t>& input_splits, const char* site) {
  int64_t rows = 0;
  for (int64_t s : output_splits) rows += s;
  auto sizes = x.sizes().vec();
  sizes[0] = rows;
  at::Tensor out = at::empty(sizes, x.options());
  comm.all_to_all_single(out, x.contiguous(), output_splits, input_splits, site);
  return out;
}

struct AllToAllRows : public torch::autograd::Function<AllToAllRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm_id,
                            const std::vector<int64_t>& output_splits, const std::vector<int64_t>& input_splits) {
    save_comm(ctx, comm_id);
    ctx->saved_data["output_splits"] = output_splits;
    ctx->saved_data["input_splits"] = input_splits;
    return exchange_rows(x, comm_of(comm_id), output_splits, input_splits, "region.all_to_all");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Communicator& comm = saved_comm(ctx);
    // The rows went out by input_splits and came in by output_splits: their gradients go back.
    const std::vector<int64_t> out_splits = ctx->saved_data["output_splits"].toIntVector();
    const std::vector<int64_t> in_splits = ctx->saved_data["input_splits"].toIntVector();
    return {exchange_rows(grads[0], comm, in_splits, out_splits, "region.all_to_all.backward"), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

struct FsdpAllGather : public torch::autograd::Function<FsdpAllGather> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& shard, int64_t comm_id, int64_t full_rows,
                            int64_t compute_dtype, int64_t reduce_dtype, int64_t reduce_site) {
    save_comm(ctx, comm_id);
    ctx->saved_data["reduce_site"] = reduce_site;  // a string literal's address (see regions.h)
    ctx->saved_data["full_rows"] = full_rows;
    ctx->saved_data["rows"] = shard.size(0);
    ctx->saved_data["reduce_dtype"] = reduce_dtype;
    ctx->saved_data["shard_dtype"] = static_cast<int64_t>(shard.scalar_type());
    Communicator& comm = comm_of(comm_id);
    const int64_t chunk = (full_rows + comm.size() - 1) / comm.size();
    ctx->saved_data["chunk"] = chunk;
    const auto dtype = static_cast<at::ScalarType>(compute_dtype);
    auto sizes = shard.sizes().vec();
    sizes[0] = chunk;
    at::Tensor padded = at::zeros(sizes, shard.options().dtype(dtype));
    padded.narrow(0, 0, shard.size(0)).copy_(shard);
    sizes[0] = chunk * comm.size();
    at::Tensor full = at::empty(sizes, padded.options());
    comm.all_gather_into_tensor(full, padded, "fsdp.all_gather");
    // Short shards are the last ones, so the first full_rows rows are the tensor in order.
    return full.narrow(0, 0, full_rows);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Communicator& comm = saved_comm(ctx);
    const int64_t chunk = ctx->saved_data["chunk"].toInt(), rows = ctx->saved_data["rows"].toInt();
    const auto reduce_dtype = static_cast<at::ScalarType>(ctx->saved_data["reduce_dtype"].toInt());
    const auto shard_dtype = static_cast<at::ScalarType>(ctx->saved_data["shard_dtype"].toInt());
    auto sizes = grads[0].sizes().vec();
    sizes[0] = chunk * comm.size();
    // Never reduce autograd's gradient in place: copy it into a zeroed padded buffer.
    at::Tensor padded = at::zeros(sizes, grads[0].options().dtype(reduce_dtype));
    padded.narrow(0, 0, grads[0].size(0)).copy_(grads[0]);
    sizes[0] = chunk;
    at::Tensor mine = at::empty(sizes, padded.options());
    const auto* site = reinterpret_cast<const char*>(static_cast<intptr_t>(ctx->saved_data["reduce_site"].toInt()));
    comm.reduce_scatter_tensor(mine, padded, ReduceOp::kSum, site);
    // A fresh tensor: a view would keep the whole padded buffer alive as the leaf's .grad.
    return {mine.narrow(0, 0, rows).to(shard_dtype).clone(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

int64_t id_of(Communicator& comm) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(&comm)); }

}  // namespace

at::Tensor copy_to_region(const at::Tensor& x, Communicator& comm) {
  if (comm.size() == 1) return x;
  return CopyToRegion::apply(x, id_of(comm));
}

at::Tensor reduce_from_region(const at::Tensor& x, Communicator& comm) {
  if (comm.size() == 1) return x;
  return ReduceFromRegion::apply(x, id_of(comm));
}

at::Tensor gather_from_region(const at::Tensor& x, Communicator& comm, int64_t dim) {
  if (comm.size() == 1) return x;
  return GatherFromRegion::apply(x, id_of(comm), normalize_dim(x, dim));
}

at::Tensor sequence_all_gather(const at::Tensor& x, Communicator& comm, int64_t seq_dim) {
  if (comm.size() == 1) return x;
  return SequenceAllGather::apply(x, id_of(comm), normalize_dim(x, seq_dim));
}

at::Tensor sequence_reduce_scatter(const at::Tensor& x, Communicator& comm, int64_t seq_dim) {
  if (comm.size() == 1) return x;
  return SequenceReduceScatter::apply(x, id_of(comm), normalize_dim(x, seq_dim));
}

at::Tensor fsdp_all_gather(const at::Tensor& shard, Communicator& comm, int64_t full_rows,
                           c10::optional<c10::ScalarType> compute_dtype, c10::optional<c10::ScalarType> reduce_dtype,
                           const char* reduce_site) {
  if (comm.size() == 1) return compute_dtype && *compute_dtype != shard.scalar_type() ? shard.to(*compute_dtype) : shard;
  MIH_CHECK(shard.dim() >= 1, "fsdp_all_gather: a parameter shard needs a dim 0, got a 0-d tensor");
  const auto compute = static_cast<int64_t>(compute_dtype.value_or(shard.scalar_type()));
  const auto reduce = static_cast<int64_t>(reduce_dtype.value_or(shard.scalar_type()));
  MIH_CHECK(reduce_site != nullptr, "fsdp_all_gather: reduce_site is null; give the reduce-scatter a label");
  return FsdpAllGather::apply(shard, id_of(comm), full_rows, compute, reduce,
                              static_cast<int64_t>(reinterpret_cast<intptr_t>(reduce_site)));
}

at::Tensor all_to_all_rows(const at::Tensor& x, Communicator& comm, const std::vector<int64_t>& output_splits,
                           const std::vector<int64_t>& input_splits) {
  const auto n = static_cast<size_t>(comm.size());
  MIH_CHECK(output_splits.size() == n && input_splits.size() == n, "all_to_all_rows on axis '", comm.axis(),
            "': ", input_splits.size(), " input and ", output_splits.size(), " output splits for ", n,
            " ranks; give one split per axis rank");
  MIH_CHECK(x.dim() >= 1, "all_to_all_rows on axis '", comm.axis(), "': a 0-d tensor has no rows to send");
  int64_t sent = 0;
  for (const auto* splits : {&input_splits, &output_splits}) {
    for (int64_t s : *splits) {
      MIH_CHECK(s >= 0, "all_to_all_rows on axis '", comm.axis(), "': split ", s, " is negative");
    }
  }
  for (int64_t s : input_splits) sent += s;
  MIH_CHECK(sent == x.size(0), "all_to_all_rows on axis '", comm.axis(), "': the input splits sum to ", sent,
            " rows, the input has ", x.size(0));
  if (comm.size() == 1) return x;
  return AllToAllRows::apply(x, id_of(comm), output_splits, input_splits);
}

at::Tensor all_gather_dim(const at::Tensor& x, Communicator& comm, int64_t dim) {
  return gather_along(x, comm, normalize_dim(x, dim));
}

}  // namespace mih
