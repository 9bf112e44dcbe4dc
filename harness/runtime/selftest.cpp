// The collective selftest: inputs are a pure function of (global rank, index), so every rank
// computes what any collective must return without asking anyone.
#include "harness/runtime/selftest.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <map>
#include <sstream>

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/compat/collectives.h"
#include "harness/runtime/dtypes.h"
#include "harness/runtime/fork_server.h"
#include "harness/base/strings.h"

extern char** environ;

namespace mih {
namespace {

using Clock = std::chrono::steady_clock;

// Input of global rank `r` at flat index `offset + i`: small integers in [-8, 8], exact in
// every dtype, different on every rank and position.
at::Tensor pattern(int r, int64_t numel, int64_t offset = 0) {
  at::Tensor i = at::arange(offset, offset + numel, at::kDouble);
  return at::fmod(i * 3 + (r + 1) * 7, 17) - 8;
}

// all_to_all: rows rank `src` sends to rank `dst` (axis ranks), 1 to 3.
int64_t a2a_rows(int src, int dst) { return 1 + (src + 2 * dst) % 3; }

// all_to_all payload from global rank `src_g` to global rank `dst_g`: [rows, cols].
at::Tensor a2a_block(int src_g, int dst_g, int64_t rows, int64_t cols) {
  at::Tensor k = at::arange(rows, at::kDouble).unsqueeze(1);
  at::Tensor c = at::arange(cols, at::kDouble).unsqueeze(0);
  return at::fmod(k * 2 + c + (src_g * 5 + dst_g * 3), 13) - 6;
}

at::Tensor reduce_expected(const std::vector<at::Tensor>& inputs, ReduceOp op, bool integral) {
  at::Tensor acc = inputs.front().clone();
  for (size_t k = 1; k < inputs.size(); ++k) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += inputs[k]; break;
      case ReduceOp::kMax: acc = at::maximum(acc, inputs[k]); break;
      case ReduceOp::kMin: acc = at::minimum(acc, inputs[k]); break;
    }
  }
  if (op == ReduceOp::kAvg) {
    acc = acc / static_cast<double>(inputs.size());
    if (integral) acc = at::trunc(acc);
  }
  return acc;
}

double dtype_eps(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return 1.1920929e-07;
    case at::kDouble: return 2.220446049250313e-16;
    case at::kBFloat16: return 0.0078125;
    case at::kHalf: return 0.0009765625;
    default: return 0;
  }
}

// Compares in float64 against `expected` rounded through the dtype under test.
void compare(SelftestCheck& check, const at::Tensor& actual, const at::Tensor& expected, at::ScalarType dtype,
             bool reduction) {
  at::Tensor want = expected.to(dtype).to(at::kDouble).reshape(-1);
  at::Tensor got = actual.to(at::kCPU).to(at::kDouble).reshape(-1);
  double scale = std::max(1.0, want.abs().max().item<double>());
  double tol = reduction ? 2 * dtype_eps(dtype) * scale : 0.0;
  at::Tensor diff = (got - want).abs();
  int64_t worst = diff.argmax().item<int64_t>();
  double err = diff[worst].item<double>();
  check.tolerance = tol;
  if (!(err <= tol)) {  // NaN fails too
    if (check.ok || err > check.max_abs_error) {
      std::ostringstream d;
      d << "index " << worst << ": expected " << want[worst].item<double>() << ", got " << got[worst].item<double>()
        << " (abs error " << err << ", tolerance " << tol << ")";
      check.detail = d.str();
    }
    check.ok = false;
  }
  check.max_abs_error = std::max(check.max_abs_error, err);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct OpRunner {
  Communicator& comm;
  at::ScalarType dtype;
  int64_t rows, cols;
  c10::Device device;

  // A CPU-computed float64 value as a tensor under test.
  at::Tensor on_device(const at::Tensor& values) const { return values.to(device, dtype); }

  int me() const { return comm.rank(); }
  int n() const { return comm.size(); }
  int global(int axis_rank) const { return comm.ranks()[static_cast<size_t>(axis_rank)]; }
  bool integral() const { return !at::isFloatingType(dtype); }

  // Runs `op` once: returns the call's duration in microseconds.
  double run(const std::string& op, SelftestCheck& check) {
    const int64_t numel = rows * cols;
    // A barrier first, so the time is the op's own and not the skew of the ranks' arrivals.
    auto timed = [this](auto&& fn) {
      if (n() > 1) comm.barrier("selftest.align");
      auto t0 = Clock::now();
      fn();
      return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    };
    if (op.rfind("all_reduce.", 0) == 0) {
      ReduceOp rop = parse_reduce(op.substr(11));
      at::Tensor t = on_device(pattern(global(me()), numel)).reshape({rows, cols});
      double us = timed([&] { comm.all_reduce(t, rop, "selftest"); });
      std::vector<at::Tensor> inputs;
      for (int m = 0; m < n(); ++m) inputs.push_back(pattern(global(m), numel));
      compare(check, t, reduce_expected(inputs, rop, integral()), dtype, /*reduction=*/true);
      return us;
    }
    if (op == "all_gather") {
      at::Tensor in = on_device(pattern(global(me()), numel)).reshape({rows, cols});
      at::Tensor out = at::empty({n() * rows, cols}, in.options());
      double us = timed([&] { comm.all_gather_into_tensor(out, in, "selftest"); });
      std::vector<at::Tensor> parts;
      for (int m = 0; m < n(); ++m) parts.push_back(pattern(global(m), numel));
      compare(check, out, at::cat(parts), dtype, false);
      return us;
    }
    if (op.rfind("reduce_scatter.", 0) == 0) {
      ReduceOp rop = parse_reduce(op.substr(15));
      at::Tensor in = on_device(pattern(global(me()), n() * numel)).reshape({n() * rows, cols});
      at::Tensor out = at::empty({rows, cols}, in.options());
      double us = timed([&] { comm.reduce_scatter_tensor(out, in, rop, "selftest"); });
      std::vector<at::Tensor> inputs;
      for (int m = 0; m < n(); ++m) inputs.push_back(pattern(global(m), numel, me() * numel));
      compare(check, out, reduce_expected(inputs, rop, integral()), dtype, true);
      return us;
    }
    if (op == "broadcast") {
      const int root = n() - 1;
      at::Tensor t = on_device(pattern(global(me()), numel)).reshape({rows, cols});
      double us = timed([&] { comm.broadcast(t, root, "selftest"); });
      compare(check, t, pattern(global(root), numel), dtype, false);
      return us;
    }
    if (op == "all_to_all") {
      std::vector<int64_t> in_splits, out_splits;
      std::vector<at::Tensor> blocks, expected;
      for (int j = 0; j < n(); ++j) {
        in_splits.push_back(a2a_rows(me(), j));
        out_splits.push_back(a2a_rows(j, me()));
        blocks.push_back(a2a_block(global(me()), global(j), in_splits.back(), cols));
        expected.push_back(a2a_block(global(j), global(me()), out_splits.back(), cols));
      }
      at::Tensor in = on_device(at::cat(blocks));
      int64_t out_rows = 0;
      for (int64_t s : out_splits) out_rows += s;
      at::Tensor out = at::empty({out_rows, cols}, in.options());
      double us = timed([&] { comm.all_to_all_single(out, in, out_splits, in_splits, "selftest"); });
      compare(check, out, at::cat(expected), dtype, false);
      return us;
    }
    if (op == "send_recv") {
      const int dst = (me() + 1) % n(), src = (me() + n() - 1) % n();
      at::Tensor out = on_device(pattern(global(me()), numel)).reshape({rows, cols});
      at::Tensor in = at::empty_like(out);
      double us = timed([&] { comm.send_recv(out, dst, in, src, /*tag=*/0, "selftest"); });
      compare(check, in, pattern(global(src), numel), dtype, false);
      return us;
    }
    if (op == "barrier") return timed([&] { comm.barrier("selftest"); });
    MIH_THROW(Code::kInternal, "selftest: unknown op '", op, "'");
  }

  static ReduceOp parse_reduce(const std::string& name) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      if (compat::reduce_op_name(op) == name) return op;
    }
    MIH_THROW(Code::kInternal, "selftest: unknown reduction '", name, "'");
  }
};

std::string fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

}  // namespace

void to_json(nlohmann::json& j, const SelftestCheck& c) {
  j = nlohmann::json{{"axis", c.axis},
                     {"op", c.op},
                     {"dtype", c.dtype},
                     {"group_size", c.group_size},
                     {"applicable", c.applicable},
                     {"ok", c.ok},
                     {"max_abs_error", c.max_abs_error},
                     {"tolerance", c.tolerance},
                     {"detail", c.detail},
                     {"median_us", c.median_us}};
}

void from_json(const nlohmann::json& j, SelftestCheck& c) {
  c.axis = j.at("axis").get<std::string>();
  c.op = j.at("op").get<std::string>();
  c.dtype = j.at("dtype").get<std::string>();
  c.group_size = j.at("group_size").get<int>();
  c.applicable = j.at("applicable").get<bool>();
  c.ok = j.at("ok").get<bool>();
  c.max_abs_error = j.at("max_abs_error").get<double>();
  c.tolerance = j.at("tolerance").get<double>();
  c.detail = j.at("detail").get<std::string>();
  c.median_us = j.at("median_us").get<double>();
}

const std::vector<std::string>& selftest_ops() {
  static const std::vector<std::string> kOps = {
      "all_reduce.sum", "all_reduce.avg",     "all_reduce.max",     "all_reduce.min", "all_gather", "reduce_scatter.sum",
      "reduce_scatter.avg", "broadcast", "all_to_all", "send_recv", "barrier"};
  return kOps;
}

std::vector<SelftestCheck> run_collective_selftest(DeviceMesh& mesh, const SelftestOptions& options) {
  MIH_CHECK(options.repeats >= 1 && options.rows >= 1 && options.cols >= 1,
            "selftest: repeats, rows and cols must be >= 1");
  std::vector<at::ScalarType> dtypes;
  for (const auto& name : options.dtypes) dtypes.push_back(parse_dtype(name));
  std::vector<SelftestCheck> checks;
  for (MeshAxis axis : kAllMeshAxes) {
    Communicator& comm = mesh.comm(axis);
    for (const std::string& op : selftest_ops()) {
      bool per_dtype = op != "barrier";
      for (size_t d = 0; d < (per_dtype ? dtypes.size() : 1); ++d) {
        SelftestCheck check;
        check.axis = comm.axis();
        check.op = op;
        check.dtype = per_dtype ? options.dtypes[d] : "-";
        check.group_size = comm.size();
        if (op == "send_recv" && comm.size() < 2) {
          check.applicable = false;
          checks.push_back(check);
          continue;
        }
        OpRunner runner{comm, per_dtype ? dtypes[d] : at::kFloat, options.rows, options.cols, options.device};
        std::vector<double> times;
        for (int k = 0; k < options.repeats; ++k) times.push_back(runner.run(op, check));
        check.median_us = median(times);
        checks.push_back(check);
      }
    }
  }
  return checks;
}

nlohmann::json summarize_selftest(const std::vector<std::vector<SelftestCheck>>& per_rank, const DeviceMesh& mesh,
                                  const SelftestOptions& options) {
  struct Cell {
    bool ok = true, applicable = false;
    double slowest_us = 0;
  };
  std::map<std::pair<std::string, std::string>, Cell> cells;
  nlohmann::json failures = nlohmann::json::array();
  for (size_t r = 0; r < per_rank.size(); ++r) {
    for (const auto& c : per_rank[r]) {
      Cell& cell = cells[{c.axis, c.op}];
      if (!c.applicable) continue;
      cell.applicable = true;
      cell.ok = cell.ok && c.ok;
      cell.slowest_us = std::max(cell.slowest_us, c.median_us);
      if (!c.ok) {
        nlohmann::json f = c;
        f["rank"] = r;
        failures.push_back(f);
      }
    }
  }
  nlohmann::json axes = nlohmann::json::array();
  for (MeshAxis axis : kAllMeshAxes) {
    const Communicator& comm = mesh.comm(axis);
    nlohmann::json ops = nlohmann::json::object();
    for (const auto& op : selftest_ops()) {
      const Cell& cell = cells[{comm.axis(), op}];
      ops[op] = {{"applicable", cell.applicable}, {"ok", cell.ok}, {"slowest_median_ms", cell.slowest_us / 1000.0}};
    }
    axes.push_back({{"axis", comm.axis()},
                    {"group_size", comm.size()},
                    {"pg_backend", compat::backend_name(comm.group().backend())},
                    {"ops", ops}});
  }
  return {{"ok", failures.empty()},
          {"world_size", mesh.world_size()},
          {"dims", mesh.config()},
          {"pg_backend", compat::backend_name(mesh.comm(MeshAxis::kWorld).group().backend())},
          {"torch_version", compat::torch_version()},
          {"dtypes", options.dtypes},
          {"repeats", options.repeats},
          {"shape", {options.rows, options.cols}},
          {"axes", axes},
          {"failures", failures}};
}

std::string format_selftest_table(const nlohmann::json& summary) {
  static const std::map<std::string, std::string> kShort = {
      {"all_reduce.sum", "ar.sum"}, {"all_reduce.avg", "ar.avg"}, {"all_reduce.max", "ar.max"},
      {"all_reduce.min", "ar.min"}, {"all_gather", "gather"},     {"reduce_scatter.sum", "rs.sum"},
      {"reduce_scatter.avg", "rs.avg"}, {"broadcast", "bcast"},   {"all_to_all", "a2a"},
      {"send_recv", "p2p"},         {"barrier", "barrier"}};
  std::ostringstream out;
  std::string dtypes;
  for (const auto& d : summary.at("dtypes")) dtypes += " " + d.get<std::string>();
  ParallelConfig dims = summary.at("dims").get<ParallelConfig>();
  out << "mih selftest: world_size " << summary.at("world_size").get<int>() << ", mesh " << dims.mesh_str() << ", backend "
      << summary.at("pg_backend").get<std::string>() << ", libtorch " << summary.at("torch_version").get<std::string>()
      << "; dtypes" << dtypes << "\n"
      << "cell: ok or FAIL, then the slowest rank's median ms per call; '-': not applicable (p2p needs 2+ ranks)\n\n";
  out << std::left << std::setw(13) << "axis" << std::setw(6) << "ranks";
  for (const auto& op : selftest_ops()) out << std::setw(10) << kShort.at(op);
  out << "\n";
  for (const auto& axis : summary.at("axes")) {
    out << std::setw(13) << axis.at("axis").get<std::string>() << std::setw(6) << axis.at("group_size").get<int>();
    for (const auto& op : selftest_ops()) {
      const auto& cell = axis.at("ops").at(op);
      std::string text = !cell.at("applicable").get<bool>() ? "-"
                         : cell.at("ok").get<bool>()
                             ? "ok " + fixed(cell.at("slowest_median_ms").get<double>(), 2)
                             : "FAIL";
      out << std::setw(10) << text;
    }
    out << "\n";
  }
  const auto& failures = summary.at("failures");
  if (failures.empty()) {
    out << "\nall checks passed\n";
  } else {
    out << "\n" << failures.size() << " check(s) failed:\n";
    for (const auto& f : failures) {
      out << "  rank " << f.at("rank").get<int>() << " " << f.at("op").get<std::string>() << " on axis '"
          << f.at("axis").get<std::string>() << "' (" << f.at("dtype").get<std::string>()
          << "): " << f.at("detail").get<std::string>() << "\n";
    }
  }
  return out.str();
}

std::vector<TaskOption> selftest_task_options() {
  SelftestOptions defaults;
  std::string dtypes = join(defaults.dtypes, ",");
  return {{"mesh", "mesh, e.g. dp_shard=2,tp=2 (default: the world size spread over all axes)", ""},
          {"repeats", "calls per (axis, op, dtype); the median time is reported", std::to_string(defaults.repeats)},
          {"dtypes", "comma-separated dtypes", dtypes}};
}

int run_selftest_task(WorkerContext& ctx) {
  SelftestOptions options;
  options.repeats = static_cast<int>(ctx.int_option("repeats"));
  options.device = ctx.device();
  options.dtypes.clear();
  std::istringstream dtypes(ctx.option("dtypes"));
  for (std::string d; std::getline(dtypes, d, ',');) {
    if (!d.empty()) options.dtypes.push_back(d);
  }
  MIH_CHECK(!options.dtypes.empty(), "selftest: --dtypes is empty; give at least one dtype, e.g. float32");
  const std::string& mesh_text = ctx.option("mesh");
  const World& world = ctx.world();
  ParallelConfig dims = mesh_text.empty() ? ParallelConfig::spread(world.world_size) : ParallelConfig::parse_mesh(mesh_text);
  dims.validate(world.world_size);
  DeviceMesh mesh = ctx.build_mesh(dims, "selftest");
  std::vector<SelftestCheck> mine = run_collective_selftest(mesh, options);

  compat::Store& store = ctx.store();
  store.set("mih/selftest/rank" + std::to_string(world.rank), nlohmann::json(mine).dump());
  if (world.rank != 0) return 0;
  std::vector<std::vector<SelftestCheck>> all;
  for (int r = 0; r < world.world_size; ++r) {
    all.push_back(nlohmann::json::parse(store.get("mih/selftest/rank" + std::to_string(r))).get<std::vector<SelftestCheck>>());
  }
  nlohmann::json summary = summarize_selftest(all, mesh, options);
  write_file_atomic(ctx.run_dir() / layout::kSelftest, summary.dump(2) + "\n");
  std::printf("%s", format_selftest_table(summary).c_str());
  return summary.at("ok").get<bool>() ? 0 : 1;
}

int run_ping_task(WorkerContext& ctx) {
  ParallelConfig dims;
  dims.dp_shard = ctx.world().world_size;  // one group: the world
  DeviceMesh mesh = ctx.build_mesh(dims, "ping");
  at::Tensor t = at::ones({1}, at::TensorOptions().device(ctx.device()));
  mesh.comm(MeshAxis::kWorld).all_reduce(t, ReduceOp::kSum, "ping");
  MIH_CHECK_CODE(t.item<float>() == static_cast<float>(ctx.world().world_size), Code::kInternal,
                 "ping: all_reduce gave ", t.item<float>(), ", expected ", ctx.world().world_size);
  return 0;
}

namespace {

// "pipe", "socket", "anon_inode:[eventfd]", or the path (an fd's kind without its inode).
std::string fd_kind(const std::string& target) {
  const auto colon = target.find(":[");
  return colon == std::string::npos ? target : target.substr(0, colon);
}

}  // namespace

nlohmann::json process_state() {
  nlohmann::json env = nlohmann::json::object();
  for (char** e = environ; e && *e; ++e) {
    const std::string entry(*e);
    const auto eq = entry.find('=');
    env[entry.substr(0, eq)] = eq == std::string::npos ? "" : entry.substr(eq + 1);
  }
  std::vector<std::string> fds;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    const int own = ::dirfd(d);
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.' || std::atoi(e->d_name) == own) continue;
      char target[4096] = {0};
      const std::string link = std::string("/proc/self/fd/") + e->d_name;
      const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
      fds.push_back(std::string(e->d_name) + " " + (n > 0 ? fd_kind(std::string(target, static_cast<size_t>(n))) : "?"));
    }
    ::closedir(d);
  }
  std::sort(fds.begin(), fds.end());
  sigset_t mask;
  ::sigprocmask(SIG_SETMASK, nullptr, &mask);
  std::vector<int> blocked, not_default, ignored;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sigismember(&mask, sig) == 1) blocked.push_back(sig);
    struct sigaction sa {};
    if (::sigaction(sig, nullptr, &sa) == 0 && sa.sa_handler != SIG_DFL) not_default.push_back(sig);
    if (::sigaction(sig, nullptr, &sa) == 0 && sa.sa_handler == SIG_IGN) ignored.push_back(sig);
  }
  const int threads = process_thread_count();
  using GetThreads = int (*)();
  auto blas = reinterpret_cast<GetThreads>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  const mode_t mask_bits = ::umask(022);
  ::umask(mask_bits);
  char cwd[4096] = {0};
  const at::Tensor draws = at::rand({4}, at::kDouble);
  return {{"env", env},
          {"fds", fds},
          {"blocked_signals", blocked},
          {"signals_not_default", not_default},
          {"signals_ignored", ignored},
          {"threads", threads},
          {"intra_op_threads", at::get_num_threads()},
          {"blas_threads", blas ? blas() : -1},
          {"rand", std::vector<double>(draws.data_ptr<double>(), draws.data_ptr<double>() + 4)},
          {"cwd", ::getcwd(cwd, sizeof cwd) ? cwd : ""},
          {"umask", static_cast<int>(mask_bits)},
          {"own_process_group", ::getpgrp() == ::getpid()}};
}

namespace {

// What --mutate changes after the state was recorded: every field a leak would show in.
void mutate_process_state() {
  ::setenv("MIH_STATE_MUTATED", "1", 1);
  at::manual_seed(1234);
  at::set_num_threads(2);
  (void)!::open("/dev/null", O_RDONLY);
  ::signal(SIGUSR1, SIG_IGN);
  sigset_t usr2;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  ::sigprocmask(SIG_BLOCK, &usr2, nullptr);
  ::umask(077);
  (void)!::chdir("/");
}

}  // namespace

int run_process_state_command(int argc, char** argv) {
  static int command_runs = 0;  // a fresh process has run no command yet
  ++command_runs;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s __process-state FILE [--mutate]\n", argc > 0 ? argv[0] : "mih-core");
    return 2;
  }
  nlohmann::json state = process_state();
  state["command_runs"] = command_runs;
  write_file_atomic(argv[2], state.dump(2) + "\n");
  if (argc > 3 && std::string(argv[3]) == "--mutate") {
    mutate_process_state();
    ++command_runs;
  }
  return 0;
}

int run_state_task(WorkerContext& ctx) {
  static int task_runs = 0;  // a process-wide counter: a fresh process has run no task yet
  ++task_runs;
  nlohmann::json state = process_state();
  state["rank"] = ctx.world().rank;
  state["task_runs"] = task_runs;
  write_file_atomic(ctx.run_dir() / layout::selftest_state_rank(ctx.world().rank), state.dump(2) + "\n");
  if (ctx.option("mutate") == "1") {
    mutate_process_state();
    ++task_runs;
  }
  return 0;
}

}  // namespace mih
