// The c10d implementation behind store.h and collectives.h, with c10d_store.cpp,
// c10d_group.cpp and c10d_collectives.cpp the only sources that include c10d headers and the
// libtorch version macros (docs/libtorch-compat.md sections 1, 8). Here: backend and op names, the
// libtorch version, and how a transport failure becomes a mih::Error.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <exception>
#include <initializer_list>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/Context.h>
#include <ATen/Version.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/NCCLUtils.hpp>
#endif

#include "harness/base/error.h"
#include "harness/compat/c10d_internal.h"
#include "harness/compat/collectives.h"
#include "harness/base/strings.h"

namespace mih::compat {
namespace internal {
namespace {

bool contains_any(const std::string& text, std::initializer_list<const char*> needles) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* n : needles) {
    if (lower.find(n) != std::string::npos) return true;
  }
  return false;
}

std::chrono::milliseconds wait_budget(const BackendState& s) {
  // The backend enforces s.timeout itself and reports the more precise error; this outer
  // bound only catches a backend that never completes the work.
  return s.timeout + s.timeout / 10 + std::chrono::milliseconds(500);
}

}  // namespace

std::string join_ranks(const std::vector<int>& ranks) {
  return "[" + join(ranks, ", ") + "]";
}

std::string short_what(const std::exception& e) {
  std::string text;
  if (auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    text = c10_error->what_without_backtrace();
  } else {
    text = e.what();
  }
  auto eol = text.find('\n');
  if (eol != std::string::npos) text.resize(eol);
  return text;
}

Error transport_error(const GroupImpl& g, std::string_view op, const std::exception& e) {
  std::string detail = short_what(e);
  std::string where = mih::internal::str(op, " on group '", g.name, "' (global ranks ", join_ranks(g.ranks),
                                    ", this rank's group rank ", g.rank, ")");
  long long timeout_ms = g.state ? static_cast<long long>(g.state->timeout.count()) : 0;
  if (contains_any(detail, {"timed out", "timeout"})) {
    return Error(Code::kDeadlineExceeded,
                 mih::internal::str(where, " did not complete within ", timeout_ms,
                               " ms: a member rank is missing, stuck, or slower than the timeout (",
                               detail, ")"));
  }
  if (contains_any(detail, {"not support", "no support", "invalid scalar type", "unsupported"})) {
    return Error(Code::kUnimplemented,
                 mih::internal::str(where, " is not supported by the ", backend_name(g.kind),
                               " backend: ", detail));
  }
  return Error(Code::kUnavailable,
               mih::internal::str(where, " failed in the transport: a peer rank died or closed its "
                             "connection (", detail, ")"));
}

void wait_work(const GroupImpl& g, std::string_view op, const c10::intrusive_ptr<c10d::Work>& work) {
  try {
    work->wait(wait_budget(*g.state));
  } catch (const std::exception& e) {
    throw transport_error(g, op, e);
  }
}

}  // namespace internal

std::string_view backend_name(BackendKind kind) {
  switch (kind) {
    case BackendKind::kGloo: return "gloo";
    case BackendKind::kNccl: return "nccl";
    case BackendKind::kSelf: return "self";
  }
  return "unknown";
}

BackendKind parse_backend(std::string_view name) {
  if (name == "gloo") return BackendKind::kGloo;
  if (name == "nccl") return BackendKind::kNccl;
  MIH_THROW(Code::kInvalidSpec, "unknown backend '", name, "'; valid: [gloo, nccl]");
}

bool backend_available(BackendKind kind) {
  switch (kind) {
    case BackendKind::kGloo: return MIH_WITH_GLOO != 0;
    case BackendKind::kNccl:
#ifdef USE_C10D_NCCL
      return true;
#else
      return false;
#endif
    case BackendKind::kSelf: return true;
  }
  return false;
}

std::string torch_version() { return TORCH_VERSION; }

std::string cuda_version() {
  if (!at::globalContext().hasCUDA()) return "";
  // at::show_config() of a CUDA build says "  - CUDA Runtime 12.4".
  const std::string config = at::show_config();
  const std::string marker = "CUDA Runtime ";
  const auto pos = config.find(marker);
  if (pos == std::string::npos) return "unknown";
  const auto begin = pos + marker.size();
  return config.substr(begin, config.find_first_of(" \n", begin) - begin);
}

int cuda_device_count() {
  // at::getNumGPUs: the CUDA hooks' device count, 0 without CUDA support or a driver (1.13 and 2.x).
  return static_cast<int>(at::getNumGPUs());
}

std::string nccl_version() {
#ifdef USE_C10D_NCCL
  return c10d::getNcclVersion();
#else
  return "";
#endif
}

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "unknown";
}

}  // namespace mih::compat
