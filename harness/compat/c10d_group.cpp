// The process groups behind collectives.h: Group handles, the size-1 self group, and
// new_group with its Gloo (transport devices cached per interface or host) and NCCL backends.
#include <algorithm>
#include <csignal>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "harness/base/error.h"
#include "harness/compat/c10d_internal.h"
#include "harness/compat/collectives.h"
#include "harness/compat/store.h"

#if MIH_WITH_GLOO
#ifndef USE_C10D_GLOO
#error "USE_C10D_GLOO is not defined: ProcessGroupGloo.hpp would declare nothing (CMake sets it on mih::compat)"
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace mih::compat {

using internal::BackendState;
using internal::GroupImpl;
using internal::join_ranks;
using internal::short_what;
using internal::transport_error;

namespace {

// 2.x warns when a ProcessGroupNCCL is destroyed without shutdown(); 1.13 has none.
template <class Backend>
void shutdown_if_supported(Backend& backend) {
  if constexpr (requires { backend.shutdown(); }) backend.shutdown();
}

std::mutex& gloo_device_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

const std::string& Group::name() const { return impl_->name; }
int Group::rank() const { return impl_->rank; }
int Group::size() const { return static_cast<int>(impl_->ranks.size()); }
const std::vector<int>& Group::ranks() const { return impl_->ranks; }
BackendKind Group::backend() const { return impl_->kind; }

Group Group::renamed(std::string name) const {
  auto impl = std::make_shared<GroupImpl>(*impl_);
  impl->name = std::move(name);
  return Group(std::move(impl));
}

Group self_group(const std::string& name, int global_rank) {
  auto impl = std::make_shared<GroupImpl>();
  impl->name = name;
  impl->rank = 0;
  impl->ranks = {global_rank};
  impl->kind = BackendKind::kSelf;
  return Group(std::move(impl));
}

#if MIH_WITH_GLOO
namespace {
std::shared_ptr<::gloo::transport::Device> gloo_device(const GroupOptions& options) {
  std::lock_guard<std::mutex> lock(gloo_device_mutex());
  static std::map<std::string, std::shared_ptr<::gloo::transport::Device>> cache;
  std::string key = !options.gloo_interface.empty()  ? "if:" + options.gloo_interface
                    : !options.gloo_hostname.empty() ? "host:" + options.gloo_hostname
                                                     : std::string("default");
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::shared_ptr<::gloo::transport::Device> device;
  try {
    if (!options.gloo_interface.empty()) {
      device = c10d::ProcessGroupGloo::createDeviceForInterface(options.gloo_interface);
    } else if (!options.gloo_hostname.empty()) {
      device = c10d::ProcessGroupGloo::createDeviceForHostname(options.gloo_hostname);
    } else {
      device = c10d::ProcessGroupGloo::createDefaultDevice();
    }
  } catch (const std::exception& e) {
    MIH_THROW(Code::kFailedPrecondition, "cannot create the Gloo device '", key, "': ", short_what(e),
              "; set GLOO_SOCKET_IFNAME to a network interface of this host");
  }
  cache.emplace(key, device);
  return device;
}
}  // namespace
#endif

Group new_group(const Store& store, const std::string& name, const std::vector<int>& global_ranks,
                int global_rank, const GroupOptions& options) {
  // Gloo writes to sockets whose peer may have died; the default SIGPIPE action would kill
  // this rank instead of letting the write fail as a transport error. Python (where c10d
  // usually runs) ignores SIGPIPE at start-up; so do we, once, at the first group.
  static std::once_flag sigpipe_once;
  std::call_once(sigpipe_once, [] { std::signal(SIGPIPE, SIG_IGN); });
  MIH_CHECK(!global_ranks.empty(), "group '", name, "': the member list is empty");
  std::set<int> unique(global_ranks.begin(), global_ranks.end());
  MIH_CHECK(unique.size() == global_ranks.size(), "group '", name, "': ranks repeat in ",
            join_ranks(global_ranks));
  auto pos = std::find(global_ranks.begin(), global_ranks.end(), global_rank);
  MIH_CHECK(pos != global_ranks.end(), "group '", name, "': rank ", global_rank,
            " is not a member of ", join_ranks(global_ranks),
            "; only members construct a group");
  MIH_CHECK_CODE(backend_available(options.backend), Code::kUnimplemented, "backend '",
                 backend_name(options.backend), "' is not available in this build (libtorch ",
                 torch_version(),
                 options.backend == BackendKind::kGloo ? "; gloo headers were not found at build time)"
                                                       : "; libtorch is not a CUDA build)");

  auto impl = std::make_shared<GroupImpl>();
  impl->name = name;
  impl->rank = static_cast<int>(pos - global_ranks.begin());
  impl->ranks = global_ranks;
  impl->kind = options.backend;
  impl->state = std::make_shared<BackendState>();
  impl->state->timeout = options.timeout;
  impl->state->device_index = options.device_index;
  const int size = static_cast<int>(global_ranks.size());
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("mih/pg/" + name, store.impl()->store);
  try {
    switch (options.backend) {
      case BackendKind::kGloo: {
#if MIH_WITH_GLOO
        auto o = c10d::ProcessGroupGloo::Options::create(options.timeout);
        o->devices.push_back(gloo_device(options));
        o->threads = std::max(1, options.gloo_threads);
        impl->state->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, impl->rank, size, o);
#endif
        break;
      }
      case BackendKind::kNccl: {
#ifdef USE_C10D_NCCL
        c10::cuda::set_device(static_cast<c10::DeviceIndex>(options.device_index));
        auto o = c10d::ProcessGroupNCCL::Options::create();
        o->timeout = options.timeout;
        auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, impl->rank, size, o);
        impl->state->backend = nccl;
        impl->state->shutdown = [pg = nccl.get()] { shutdown_if_supported(*pg); };
#endif
        break;
      }
      case BackendKind::kSelf:
        impl->state.reset();
        break;
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    Error error = transport_error(*impl, "creating the group", e);
    if (error.code() == Code::kDeadlineExceeded) {
      error = Error(Code::kDeadlineExceeded,
                    mih::internal::str("creating group '", name, "' (global ranks ", join_ranks(global_ranks),
                                  ") timed out after ", options.timeout.count(),
                                  " ms: not every member joined (", short_what(e), ")"));
    }
    throw error;
  }
  return Group(std::move(impl));
}

}  // namespace mih::compat
