// adopt_group: a caller's own c10d backend as a compat::Group (adopt.h).
#include "harness/compat/adopt.h"

#include <csignal>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "harness/base/error.h"
#include "harness/compat/c10d_internal.h"

namespace mih::compat {

static_assert(std::is_same_v<C10dBackend, internal::C10dBackend>, "adopt.h and c10d_internal.h name one class");

Group adopt_group(const c10::intrusive_ptr<C10dBackend>& backend, const std::string& name,
                  const std::vector<int>& global_ranks, std::chrono::milliseconds timeout) {
  // As new_group: a write to a dead peer's socket is an error, not a killed process.
  static std::once_flag sigpipe_once;
  std::call_once(sigpipe_once, [] { std::signal(SIGPIPE, SIG_IGN); });
  MIH_CHECK(backend, "group '", name, "': the backend to adopt is null; pass the process group the trainer built");
  MIH_CHECK(!global_ranks.empty(), "group '", name, "': the member list is empty");
  std::set<int> unique(global_ranks.begin(), global_ranks.end());
  MIH_CHECK(unique.size() == global_ranks.size(), "group '", name, "': ranks repeat in ",
            internal::join_ranks(global_ranks));
  MIH_CHECK(backend->getSize() == static_cast<int>(global_ranks.size()), "group '", name, "': the backend has ",
            backend->getSize(), " members and the global ranks given are ", internal::join_ranks(global_ranks),
            ": list the global rank of each member, in the backend's rank order");
  std::string kind;
  try {
    kind = backend->getBackendName();
  } catch (const std::exception& e) {
    MIH_CHECK(false, "group '", name, "': the backend does not name itself (", internal::short_what(e),
              "): adopt a ProcessGroupGloo or ProcessGroupNCCL");
  }
  auto impl = std::make_shared<internal::GroupImpl>();
  impl->name = name;
  impl->rank = backend->getRank();
  impl->ranks = global_ranks;
  if (kind == "gloo") {
    impl->kind = BackendKind::kGloo;
  } else if (kind == "nccl") {
    impl->kind = BackendKind::kNccl;
  } else {
    MIH_CHECK(false, "group '", name, "': backend '", kind, "' is neither gloo nor nccl, which mih can adopt");
  }
  impl->state = std::make_shared<internal::BackendState>();
  impl->state->backend = backend;
  impl->state->timeout = timeout;
  return Group(std::move(impl));
}

}  // namespace mih::compat
