// Communicator: the collectives of one mesh axis, as every layer and check calls them. Each
// call goes through harness/compat (one meaning on every libtorch version), is recorded in
// the comm ledger, and turns a transport failure into a mih::Error naming the axis, the op
// and the ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <nlohmann/json_fwd.hpp>

#include "harness/compat/collectives.h"
#include "harness/runtime/comm_ledger.h"

namespace mih {

using compat::ReduceOp;

/// The process group of one mesh axis ("tp", "dp_shard_cp", ...) plus the ledger it
/// records into. Cheap to copy (handles). One thread issues an axis's collectives at a time.
///
/// All methods throw mih::Error: kInvalidSpec for mismatched shapes or dtypes;
/// kDeadlineExceeded when the call does not complete within the group timeout;
/// kUnavailable when a peer rank died or the connection broke; kUnimplemented for a
/// dtype the backend cannot move. The message names the op, the axis and its global ranks,
/// and the call site.
class Communicator {
 public:
  /// `ledger` may be null (nothing recorded). Calls on a 1-rank axis move nothing and are
  /// not recorded.
  Communicator(std::string axis, compat::Group group, std::shared_ptr<CommLedger> ledger);

  const std::string& axis() const { return axis_; }
  /// This rank's index along the axis, in [0, size()).
  int rank() const { return group_.rank(); }
  int size() const { return group_.size(); }
  /// Global ranks of the axis group, in axis-rank order.
  const std::vector<int>& ranks() const { return group_.ranks(); }
  const compat::Group& group() const { return group_; }

  /// Reduces `tensor` in place over the axis. kAvg = sum / size() (truncating for integers).
  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kSum, CallSite site = {});

  /// Shape: input [D0, ...] -> output [size() * D0, ...], axis rank r's input at rows r*D0.
  void all_gather_into_tensor(at::Tensor& output, const at::Tensor& input, CallSite site = {});

  /// Returns every rank's `input` concatenated along `dim`.
  /// Shape: [..., Dk, ...] -> [..., size() * Dk, ...] for dim = k.
  at::Tensor all_gather(const at::Tensor& input, int64_t dim = 0, CallSite site = {});

  /// Shape: input [size() * D0, ...] -> output [D0, ...], the reduced chunk of this rank.
  void reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input, ReduceOp op = ReduceOp::kSum,
                             CallSite site = {});

  /// Copies the tensor of axis rank `root` to every member, in place.
  void broadcast(at::Tensor& tensor, int root, CallSite site = {});

  /// Exchanges rows along dim 0: `input_splits[j]` rows to axis rank j, `output_splits[j]`
  /// rows from it. Empty splits = equal splits.
  void all_to_all_single(at::Tensor& output, const at::Tensor& input,
                         const std::vector<int64_t>& output_splits = {},
                         const std::vector<int64_t>& input_splits = {}, CallSite site = {});

  void barrier(CallSite site = {});

  /// Declares that the caller's layer issues (now, or in its backward) one collective on
  /// this axis at `site` moving `bytes` (the input payload, as the ledger counts it). A
  /// no-op on a 1-rank axis or without a ledger. See ExpectedComm.
  void expect(std::string_view site, int64_t bytes, std::string layer = "") const;

  /// Sends `tensor` to axis rank `dst`. Blocks until the transfer completes.
  void send(const at::Tensor& tensor, int dst, int tag = 0, CallSite site = {});
  /// Receives into `tensor` from axis rank `src`.
  void recv(at::Tensor& tensor, int src, int tag = 0, CallSite site = {});
  /// Starts sending `tensor` to axis rank `dst` and returns at once; the transfer completes
  /// by Work::wait (keep `tensor` alive until then). Recorded in the ledger as a "send" of
  /// the tensor's bytes when started (a pipeline stage's activation or its gradient).
  compat::Work isend(const at::Tensor& tensor, int dst, int tag = 0, CallSite site = {});
  /// Sends `to_send` to `dst` and receives `to_recv` from `src` concurrently (a ring step
  /// that cannot deadlock whatever the order of the ranks).
  void send_recv(const at::Tensor& to_send, int dst, at::Tensor& to_recv, int src, int tag = 0,
                 CallSite site = {});

 private:
  template <class Fn>
  void record(std::string_view op, const at::Tensor* payload, const CallSite& site, Fn&& fn);

  std::string axis_;
  compat::Group group_;
  std::shared_ptr<CommLedger> ledger_;
};

/// Every member's `value`, in axis-rank order, on every member: two all-gathers over `comm`
/// (the lengths, then the serialized values padded to the longest). For small, irregular
/// payloads (findings, digests) whose shapes differ between ranks; tensors go on `device`
/// (the group's: CUDA for NCCL).
/// Throws: as the collectives.
std::vector<nlohmann::json> all_gather_json(Communicator& comm, const nlohmann::json& value,
                                            c10::Device device = c10::Device(c10::DeviceType::CPU),
                                            CallSite site = {});

}  // namespace mih
