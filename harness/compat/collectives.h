// Process groups and collective wrappers with one meaning on every libtorch version and
// backend. The only place (with store.h) where c10d is used; callers see at::Tensor only.
//
// Semantics fixed here, whatever the backend does natively (docs/libtorch-compat.md section 1.5):
//   - every call is synchronous: it returns when the result is in the output tensor;
//   - kAvg is a sum followed by a division by the group size (truncating for integer dtypes);
//   - on Gloo, bfloat16 and bool reductions are computed in float32 / int32 and copied back,
//     and data-movement ops move bfloat16 / bool as float16 / uint8 bytes (bit exact);
//   - all_gather_into_tensor and reduce_scatter_tensor use the backend's native op where it
//     has one and otherwise a fallback (list all_gather; all_reduce of a copy + own chunk);
//   - non-contiguous tensors are made contiguous and the result is copied back.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

#include "harness/compat/store.h"

namespace mih::compat {

/// Communication backend of a group.
enum class BackendKind {
  kGloo,  ///< CPU (and CUDA where Gloo has it); requires gloo headers at build time
  kNccl,  ///< CUDA; compiled only when libtorch is a CUDA build
  kSelf,  ///< a size-1 group with no backend: every collective is a local copy
};

/// Returns "gloo", "nccl" or "self".
std::string_view backend_name(BackendKind kind);

/// Parses "gloo" / "nccl".
/// Throws: mih::Error{kInvalidSpec} listing the valid names.
BackendKind parse_backend(std::string_view name);

/// Returns true iff this build of mih and libtorch can create groups of `kind`.
bool backend_available(BackendKind kind);

/// Returns the libtorch version this harness was compiled against, e.g. "1.13.0".
std::string torch_version();

/// The CUDA runtime libtorch was built with ("12.4"), "" on a CPU-only libtorch.
std::string cuda_version();

/// The CUDA devices this process sees (CUDA_VISIBLE_DEVICES applied): 0 on a CPU-only
/// libtorch or without a driver. Initializes CUDA's driver in this process (no context): a
/// process that forks ranks afterwards must exec them (mih's launcher does, or forks them
/// from its fork server, which never called this).
int cuda_device_count();

/// The NCCL version c10d's NCCL backend was built with ("2.21.5"), "" without that backend.
std::string nccl_version();

/// Reduction of all_reduce and reduce_scatter_tensor.
enum class ReduceOp { kSum, kAvg, kMax, kMin };

/// Returns "sum", "avg", "max" or "min".
std::string_view reduce_op_name(ReduceOp op);

/// How a group is created.
struct GroupOptions {
  BackendKind backend = BackendKind::kGloo;
  /// Timeout of group construction (every member must join) and of every collective.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  /// Gloo: bind to this network interface (e.g. "eth0"); empty = see gloo_hostname.
  std::string gloo_interface;
  /// Gloo: bind to this host name or address; empty with no interface = the machine's
  /// hostname (Gloo's default device). Local runs use "127.0.0.1".
  std::string gloo_hostname;
  /// Gloo worker threads per group. Calls are synchronous, so one is enough.
  int gloo_threads = 1;
  /// NCCL: the CUDA device of this rank (usually the local rank).
  int device_index = 0;
};

namespace internal {
struct GroupImpl;
}

/// A process group: the members' global ranks, this process's rank in it, and the backend.
/// Copies share the backend. Not thread-safe: one thread issues a group's collectives.
class Group {
 public:
  /// The group's name in messages and evidence (a mesh axis name such as "tp").
  const std::string& name() const;
  /// This process's rank within the group, in [0, size()).
  int rank() const;
  int size() const;
  /// Global ranks of the members, in group-rank order.
  const std::vector<int>& ranks() const;
  BackendKind backend() const;
  /// Returns a handle on the same backend with another name (for a mesh axis whose
  /// members equal those of an axis built before it).
  Group renamed(std::string name) const;

  const std::shared_ptr<internal::GroupImpl>& impl() const { return impl_; }
  explicit Group(std::shared_ptr<internal::GroupImpl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<internal::GroupImpl> impl_;
};

/// Creates the group of `global_ranks` (sorted or not; group rank = position) as seen by
/// `global_rank`, which must be a member. Blocks until every member has joined. All groups
/// must be created in one global order on every rank (construction is a collective).
/// `name` must be unique per store: it prefixes the group's rendezvous keys.
/// The first call sets SIGPIPE to ignored for the process (as Python does), so that a write
/// to a dead peer's socket is a kUnavailable error instead of a killed rank.
/// Throws: mih::Error{kInvalidSpec} if `global_rank` is not a member or ranks repeat;
///   kUnimplemented if the backend is not in this build; kDeadlineExceeded if a member
///   does not join within options.timeout.
Group new_group(const Store& store, const std::string& name,
                const std::vector<int>& global_ranks, int global_rank,
                const GroupOptions& options);

/// Returns the size-1 group of `global_rank` with no backend.
Group self_group(const std::string& name, int global_rank);

/// Pending point-to-point work; wait() completes it. Destroying a Work without waiting
/// waits (a send buffer must outlive the transfer).
class Work {
 public:
  Work() = default;
  Work(Work&&) noexcept;
  Work& operator=(Work&&) noexcept;
  ~Work();
  /// Blocks until done.
  /// Throws: mih::Error{kDeadlineExceeded} or {kUnavailable} on a transport failure.
  void wait();

  struct Impl;
  explicit Work(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

// Collectives. Every tensor argument must be defined and on the group's device; group-rank
// arguments (root, dst, src) are ranks within the group. All throw mih::Error:
//   kInvalidSpec on mismatched shapes/dtypes, kUnimplemented for a dtype/op the backend
//   cannot do, kDeadlineExceeded when the call does not complete within the group timeout,
//   kUnavailable when a peer died or the connection broke. The message names the op, the
//   group and its global ranks.

/// Reduces `tensor` over the group in place. Shape: any; same on every rank.
void all_reduce(const Group& group, at::Tensor& tensor, ReduceOp op);

/// Gathers every rank's `input` along dim 0 into `output`.
/// Shape: input [D0, ...], output [size * D0, ...] (rank r's input at rows r*D0..).
void all_gather_into_tensor(const Group& group, at::Tensor& output, const at::Tensor& input);

/// Reduces `input` over the group and leaves chunk `rank` (along dim 0) in `output`.
/// Shape: input [size * D0, ...], output [D0, ...].
void reduce_scatter_tensor(const Group& group, at::Tensor& output, const at::Tensor& input,
                           ReduceOp op);

/// Copies `tensor` of group rank `root` to every member, in place.
void broadcast(const Group& group, at::Tensor& tensor, int root);

/// Sends rows of `input` to every member and receives theirs into `output`, along dim 0.
/// `input_splits[j]` rows go to group rank j; `output_splits[j]` rows come from j. Empty
/// split lists mean equal splits (dim 0 divisible by the group size).
/// Shape: input [sum(input_splits), ...], output [sum(output_splits), ...].
void all_to_all_single(const Group& group, at::Tensor& output, const at::Tensor& input,
                       const std::vector<int64_t>& output_splits,
                       const std::vector<int64_t>& input_splits);

/// Returns when every member has called barrier.
void barrier(const Group& group);

/// Starts sending `tensor` to group rank `dst` with `tag`; `tensor` must stay alive and
/// unchanged until the Work is waited on.
Work isend(const Group& group, const at::Tensor& tensor, int dst, int tag);

/// Starts receiving into `tensor` from group rank `src` with `tag`.
Work irecv(const Group& group, at::Tensor& tensor, int src, int tag);

}  // namespace mih::compat
