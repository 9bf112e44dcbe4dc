// Communicator: ledger records and error context around the compat collectives.
#include "harness/runtime/communicator.h"

#include <optional>

#include <cstring>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/runtime/dtypes.h"

namespace mih {

Communicator::Communicator(std::string axis, compat::Group group, std::shared_ptr<CommLedger> ledger)
    : axis_(std::move(axis)), group_(std::move(group)), ledger_(std::move(ledger)) {}

template <class Fn>
void Communicator::record(std::string_view op, const at::Tensor* payload, const CallSite& site, Fn&& fn) {
  int64_t seq = -1;
  const bool recorded = ledger_ && group_.size() > 1;  // a 1-rank axis moves nothing
  if (recorded) {
    bool has = payload && payload->defined();
    std::string dtype = has ? dtype_name(payload->scalar_type()) : "";
    int64_t numel = has ? payload->numel() : 0;
    int64_t bytes = has ? numel * static_cast<int64_t>(payload->element_size()) : 0;
    seq = ledger_->begin(axis_, group_.ranks(), op, dtype, numel, bytes, site);
  }
  try {
    fn();
  } catch (Error& e) {
    if (recorded) ledger_->fail(seq, e.message());
    e.add_context(internal::str("on mesh axis '", axis_, "', called from ", site.str()));
    throw;
  } catch (const std::exception& e) {
    if (recorded) ledger_->fail(seq, e.what());
    // What the process group throws: the transport's (a peer that died or closed its
    // connection: unavailable; a collective past its timeout: deadline exceeded), never a
    // verdict on the model; anything else (a size mismatch) is a harness or model bug.
    const std::string what = e.what();
    auto has = [&](const char* s) { return what.find(s) != std::string::npos; };
    const Code code = has("imed out") || has("imeout")                                           ? Code::kDeadlineExceeded
                      : has("transport") || has("onnection") || has("peer") || has("Broken pipe") ||
                              has("NCCL") || has("nccl")                                         ? Code::kUnavailable
                                                                                                 : Code::kInternal;
    Error wrapped(code, internal::str(op, " on mesh axis '", axis_, "': ", e.what()));
    wrapped.add_context(internal::str("called from ", site.str()));
    throw wrapped;
  }
  if (recorded) ledger_->end(seq);
}

void Communicator::expect(std::string_view site, int64_t bytes, std::string layer) const {
  if (!ledger_ || size() == 1) return;
  ledger_->expect({axis_, std::string(site), std::move(layer), bytes});
}

void Communicator::all_reduce(at::Tensor& tensor, ReduceOp op, CallSite site) {
  std::string name = internal::str("all_reduce.", compat::reduce_op_name(op));
  record(name, &tensor, site, [&] { compat::all_reduce(group_, tensor, op); });
}

void Communicator::all_gather_into_tensor(at::Tensor& output, const at::Tensor& input, CallSite site) {
  record("all_gather", &input, site, [&] { compat::all_gather_into_tensor(group_, output, input); });
}

at::Tensor Communicator::all_gather(const at::Tensor& input, int64_t dim, CallSite site) {
  MIH_CHECK(input.dim() > 0, "all_gather on mesh axis '", axis_, "': input must have a dim to gather on");
  dim = dim < 0 ? dim + input.dim() : dim;
  MIH_CHECK(dim >= 0 && dim < input.dim(), "all_gather on mesh axis '", axis_, "': dim ", dim,
            " out of range for a ", input.dim(), "-d input");
  // Gather along dim 0 of a [size, ...] buffer, then move the rank dim next to `dim`.
  auto sizes = input.sizes().vec();
  sizes.insert(sizes.begin(), size());
  at::Tensor stacked = at::empty(sizes, input.options());
  record("all_gather", &input, site, [&] { compat::all_gather_into_tensor(group_, stacked, input); });
  if (dim == 0) return stacked.flatten(0, 1);
  return stacked.movedim(0, dim).flatten(dim, dim + 1);
}

void Communicator::reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                         CallSite site) {
  std::string name = internal::str("reduce_scatter.", compat::reduce_op_name(op));
  record(name, &input, site, [&] { compat::reduce_scatter_tensor(group_, output, input, op); });
}

void Communicator::broadcast(at::Tensor& tensor, int root, CallSite site) {
  record("broadcast", &tensor, site, [&] { compat::broadcast(group_, tensor, root); });
}

void Communicator::all_to_all_single(at::Tensor& output, const at::Tensor& input,
                                     const std::vector<int64_t>& output_splits,
                                     const std::vector<int64_t>& input_splits, CallSite site) {
  record("all_to_all", &input, site,
         [&] { compat::all_to_all_single(group_, output, input, output_splits, input_splits); });
}

void Communicator::barrier(CallSite site) {
  record("barrier", nullptr, site, [&] { compat::barrier(group_); });
}

void Communicator::send(const at::Tensor& tensor, int dst, int tag, CallSite site) {
  record("send", &tensor, site, [&] { compat::isend(group_, tensor, dst, tag).wait(); });
}

compat::Work Communicator::isend(const at::Tensor& tensor, int dst, int tag, CallSite site) {
  std::optional<compat::Work> work;  // (Work's default constructor needs its Impl)
  record("send", &tensor, site, [&] { work.emplace(compat::isend(group_, tensor, dst, tag)); });
  return std::move(*work);
}

void Communicator::recv(at::Tensor& tensor, int src, int tag, CallSite site) {
  record("recv", &tensor, site, [&] { compat::irecv(group_, tensor, src, tag).wait(); });
}

void Communicator::send_recv(const at::Tensor& to_send, int dst, at::Tensor& to_recv, int src, int tag,
                             CallSite site) {
  record("send_recv", &to_send, site, [&] {
    compat::Work sent = compat::isend(group_, to_send, dst, tag);
    compat::Work received = compat::irecv(group_, to_recv, src, tag);
    sent.wait();
    received.wait();
  });
}

std::vector<nlohmann::json> all_gather_json(Communicator& comm, const nlohmann::json& value, c10::Device device,
                                            CallSite site) {
  const std::string bytes = value.dump();
  at::Tensor length = at::full({1}, static_cast<int64_t>(bytes.size()), at::TensorOptions().dtype(at::kLong).device(device));
  at::Tensor lengths = comm.all_gather(length, 0, site).cpu();
  const int64_t longest = lengths.max().item<int64_t>();
  at::Tensor mine = at::zeros({longest}, at::kByte);
  std::memcpy(mine.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  at::Tensor all = comm.all_gather(mine.to(device), 0, site).cpu().contiguous();
  std::vector<nlohmann::json> out;
  const auto* data = reinterpret_cast<const char*>(all.data_ptr<uint8_t>());
  for (int r = 0; r < comm.size(); ++r) {
    const int64_t n = lengths[r].item<int64_t>();
    out.push_back(nlohmann::json::parse(std::string_view(data + r * longest, static_cast<size_t>(n))));
  }
  return out;
}

}  // namespace mih
