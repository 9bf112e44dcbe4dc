// Internal to the c10d sources of harness/compat (c10d.cpp, c10d_store.cpp, c10d_group.cpp,
// c10d_collectives.cpp): the state behind the Store and Group handles, this libtorch's backend
// base class, and the error translation every call shares. It includes c10d headers: never
// include it outside harness/compat.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>

#include "harness/base/error.h"
#include "harness/compat/collectives.h"
#include "harness/compat/store.h"

// Backend base class: ProcessGroupGloo/NCCL derive from ProcessGroup in 1.13 and from Backend
// in 2.x (PR #88330). 1.13 already ships an unused Backend.hpp, so the version macro, not
// __has_include, decides (docs/libtorch-compat.md section 1.1).
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
namespace mih::compat::internal {
using C10dBackend = c10d::Backend;
}
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
namespace mih::compat::internal {
using C10dBackend = c10d::ProcessGroup;
}
#endif

namespace mih::compat::internal {

struct StoreImpl {
  c10::intrusive_ptr<c10d::Store> store;
  std::string description;
  uint16_t port = 0;
};

// One backend instance, shared by every Group handle renamed from it.
struct BackendState {
  c10::intrusive_ptr<C10dBackend> backend;
  std::chrono::milliseconds timeout{0};
  int device_index = 0;
  // -1 unknown, 0 absent (fallback), 1 native; learned at first use (a missing native op
  // throws synchronously at call time on every rank, before any communication).
  std::atomic<int> native_all_gather{-1};
  std::atomic<int> native_reduce_scatter{-1};
  std::function<void()> shutdown;

  ~BackendState() {
    if (shutdown) shutdown();
  }
};

struct GroupImpl {
  std::string name;
  int rank = 0;
  std::vector<int> ranks;
  BackendKind kind = BackendKind::kSelf;
  std::shared_ptr<BackendState> state;  // null for kSelf
};

/// "[0, 1, 2]".
std::string join_ranks(const std::vector<int>& ranks);

/// The first line of an exception's text, without c10's backtrace.
std::string short_what(const std::exception& e);

/// Turns a c10d/Gloo/NCCL exception into a mih::Error naming the op and the group. The
/// backends report failures only as text, so the code is chosen from it.
Error transport_error(const GroupImpl& g, std::string_view op, const std::exception& e);

/// Waits for `work`, a little longer than the group timeout; a failure is a transport_error.
void wait_work(const GroupImpl& g, std::string_view op, const c10::intrusive_ptr<c10d::Work>& work);

}  // namespace mih::compat::internal
