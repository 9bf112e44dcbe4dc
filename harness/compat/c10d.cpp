// The c10d implementation behind store.h and collectives.h: the only translation unit that
// includes c10d headers and the libtorch version macros (libtorch_compat.md sections 1, 8).
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>

#include "harness/base/error.h"
#include "harness/compat/collectives.h"
#include "harness/compat/store.h"

// Backend base class: ProcessGroupGloo/NCCL derive from ProcessGroup in 1.13 and from Backend
// in 2.x (PR #88330). 1.13 already ships an unused Backend.hpp, so the version macro, not
// __has_include, decides (libtorch_compat.md section 1.1).
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
namespace internal {

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

}  // namespace internal

using internal::BackendState;
using internal::GroupImpl;
using internal::StoreImpl;

namespace {

std::string join_ranks(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  out << "]";
  return out.str();
}

// The first line of an exception's text, without c10's backtrace.
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

bool contains_any(const std::string& text, std::initializer_list<const char*> needles) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* n : needles) {
    if (lower.find(n) != std::string::npos) return true;
  }
  return false;
}

// Turns a c10d/Gloo/NCCL exception into a mih::Error naming the op and the group. The
// backends report failures only as text, so the code is chosen from it.
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

std::chrono::milliseconds wait_budget(const BackendState& s) {
  // The backend enforces s.timeout itself and reports the more precise error; this outer
  // bound only catches a backend that never completes the work.
  return s.timeout + s.timeout / 10 + std::chrono::milliseconds(500);
}

void wait_work(const GroupImpl& g, std::string_view op, const c10::intrusive_ptr<c10d::Work>& work) {
  try {
    work->wait(wait_budget(*g.state));
  } catch (const std::exception& e) {
    throw transport_error(g, op, e);
  }
}

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
// any communication (libtorch_compat.md section 1.5). Returns false when the caller must
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

// ---- Store ---------------------------------------------------------------------------------

void Store::set(const std::string& key, const std::string& value) {
  impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string Store::get(const std::string& key) {
  std::vector<uint8_t> bytes;
  try {
    bytes = impl_->store->get(key);
  } catch (const std::exception& e) {
    MIH_THROW(Code::kDeadlineExceeded, "store ", impl_->description, ": key '", key,
              "' did not appear within ", impl_->store->getTimeout().count(), " ms (",
              short_what(e), ")");
  }
  return std::string(bytes.begin(), bytes.end());
}

int64_t Store::add(const std::string& key, int64_t delta) {
  try {
    return impl_->store->add(key, delta);
  } catch (const std::exception& e) {
    MIH_THROW(Code::kUnavailable, "store ", impl_->description, ": add('", key, "') failed: ",
              short_what(e));
  }
}

bool Store::check(const std::vector<std::string>& keys) {
  try {
    return impl_->store->check(keys);
  } catch (const std::exception& e) {
    MIH_THROW(Code::kUnavailable, "store ", impl_->description, ": check failed: ", short_what(e));
  }
}

void Store::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  try {
    impl_->store->wait(keys, timeout);
    return;
  } catch (const std::exception& e) {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (!check({k})) missing.push_back(k);
    }
    std::ostringstream list;
    for (size_t i = 0; i < missing.size(); ++i) list << (i ? ", " : "") << "'" << missing[i] << "'";
    MIH_THROW(Code::kDeadlineExceeded, "store ", impl_->description, ": timed out after ",
              timeout.count(), " ms waiting for key(s) [", list.str(), "] (", short_what(e), ")");
  }
}

Store Store::prefixed(const std::string& prefix) const {
  auto impl = std::make_shared<StoreImpl>();
  impl->store = c10::make_intrusive<c10d::PrefixStore>(prefix, impl_->store);
  impl->description = impl_->description + "/" + prefix;
  impl->port = impl_->port;
  return Store(std::move(impl));
}

const std::string& Store::description() const { return impl_->description; }

uint16_t Store::port() const { return impl_->port; }

Store make_file_store(const std::string& path, int world_size, std::chrono::milliseconds timeout) {
  auto impl = std::make_shared<StoreImpl>();
  try {
    impl->store = c10::make_intrusive<c10d::FileStore>(path, world_size);
  } catch (const std::exception& e) {
    MIH_THROW(Code::kFailedPrecondition, "cannot open the FileStore '", path, "': ", short_what(e),
              "; the run directory must be writable");
  }
  impl->store->setTimeout(timeout);
  impl->description = "file:" + path;
  return Store(std::move(impl));
}

Store make_tcp_store(const TcpStoreOptions& options) {
  c10d::TCPStoreOptions o;
  o.port = options.port;
  o.isServer = options.is_server;
  if (options.world_size > 0) o.numWorkers = static_cast<size_t>(options.world_size);
  o.waitWorkers = false;  // a hosting launcher must return before its workers exist
  o.timeout = options.timeout;
  auto impl = std::make_shared<StoreImpl>();
  std::string address = mih::internal::str("tcp://", options.host, ":", options.port);
  try {
    auto tcp = c10::make_intrusive<c10d::TCPStore>(options.host, o);
    impl->port = tcp->getPort();
    impl->store = tcp;
  } catch (const std::exception& e) {
    MIH_THROW(Code::kUnavailable, options.is_server ? "cannot host" : "cannot reach",
              " the TCPStore at ", address, " within ", options.timeout.count(), " ms: ",
              short_what(e),
              options.is_server ? "; is the port in use?"
                                : "; check MASTER_ADDR/MASTER_PORT and that the store host is up");
  }
  impl->store->setTimeout(options.timeout);
  impl->description = mih::internal::str("tcp://", options.host, ":", impl->port);
  return Store(std::move(impl));
}

Store make_hash_store(std::chrono::milliseconds timeout) {
  auto impl = std::make_shared<StoreImpl>();
  impl->store = c10::make_intrusive<c10d::HashStore>();
  impl->store->setTimeout(timeout);
  impl->description = "hash";
  return Store(std::move(impl));
}

// ---- Groups --------------------------------------------------------------------------------

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

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "unknown";
}

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

// ---- Collectives ---------------------------------------------------------------------------

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
