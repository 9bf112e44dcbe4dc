// A process group the caller built with c10d itself (its own ProcessGroupGloo or
// ProcessGroupNCCL), adopted as a compat::Group, so that its collectives go through mih's
// wrappers (one meaning on every libtorch version, transport failures as mih::Error) and a
// Communicator can ledger them. The only compat header that names a c10d type: the class a
// backend derives from is c10d::ProcessGroup in libtorch 1.13 and c10d::Backend in 2.x.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include "harness/compat/collectives.h"

namespace mih::compat {

/// The c10d class a backend (ProcessGroupGloo, ProcessGroupNCCL) derives from in this
/// libtorch: c10d::ProcessGroup (1.13) or c10d::Backend (2.x). A caller passes its own
/// `c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options)` either way.
#if TORCH_VERSION_MAJOR >= 2
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

/// Adopts `backend` (the caller keeps using it too; collectives are synchronous and issued
/// in one order on every member, so the two may interleave) as the group `name` of the global
/// ranks `global_ranks` (in group-rank order: global_ranks[backend->getRank()] is this
/// process). `timeout` bounds every wait on it (a hung peer is a kDeadlineExceeded error).
/// Throws: mih::Error{kInvalidSpec} when backend is null, its size differs from
///   global_ranks.size(), ranks repeat, or its backend is neither Gloo nor NCCL.
Group adopt_group(const c10::intrusive_ptr<C10dBackend>& backend, const std::string& name,
                  const std::vector<int>& global_ranks,
                  std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace mih::compat
