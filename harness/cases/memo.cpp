// Memoized case launches and the run's exit status (see memo.h).
#include "harness/cases/memo.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <ostream>

#include <nlohmann/json.hpp>

#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/base/sha256.h"
#include "harness/cases/case_runner.h"
#include "harness/compare/verdicts.h"

namespace mih::cases {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool g_infrastructure_failed = false;
Code g_infrastructure_code = Code::kOk;
Code g_input_code = Code::kOk;  // bad input or evidence (kInvalidSpec, kFailedPrecondition)
int g_cases_launched = 0;
const auto g_start = std::chrono::steady_clock::now();

void note_infrastructure(Code code) {
  g_infrastructure_failed = true;
  if (g_infrastructure_code == Code::kOk) g_infrastructure_code = code;
}

// The fault a case runs with ("" for none).
std::string fault_of(const CaseParam& p) {
  return run_options().fault_cases.count(p.case_name) ? run_options().fault : std::string();
}

// What produced a case's evidence: this binary, the resolved case (its config, steps, kind,
// what it is compared with), the training backend, the fault. Evidence with another
// fingerprint is relaunched, never reused.
std::string fingerprint(const CaseParam& p) {
  std::string id = p.spec + "|" + json(case_of(p)).dump() + "|" + p.training_backend + "|" + fault_of(p);
  struct stat st {};
  if (::stat("/proc/self/exe", &st) == 0) id += "|" + std::to_string(st.st_size) + ":" + std::to_string(st.st_mtime);
  return sha256_hex(id).substr(0, 16);
}

// An exclusive flock on <root>/<spec>/.<case>.lock for as long as it lives: one launch of a
// case at a time over every process sharing the evidence root.
class CaseLock {
 public:
  explicit CaseLock(const fs::path& file) {
    fs::create_directories(file.parent_path());
    fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    MIH_CHECK_CODE(fd_ >= 0, Code::kFailedPrecondition, "cannot open the case lock ", file.string(), ": ",
                   std::strerror(errno), "; is the evidence root writable?");
    while (::flock(fd_, LOCK_EX) != 0) {
      MIH_CHECK_CODE(errno == EINTR, Code::kFailedPrecondition, "cannot lock ", file.string(), ": ", std::strerror(errno));
    }
  }
  ~CaseLock() { ::close(fd_); }
  CaseLock(const CaseLock&) = delete;
  CaseLock& operator=(const CaseLock&) = delete;

 private:
  int fd_ = -1;
};

CaseOutcome verify_only_outcome(const CaseParam& p, const fs::path& dir) {
  CaseOutcome out;
  out.evidence = dir;
  MIH_CHECK_CODE(fs::is_directory(dir), Code::kFailedPrecondition, "verify-only: no evidence for case ", p.spec, "/",
                 p.case_name, " at ", dir.string(), "; produce it first, e.g. `mih run --spec ", p.spec, " --case ",
                 p.case_name, " --matrix ", p.matrix, " --evidence-root ", run_options().evidence_root.string(),
                 "` or the torchrun/srun launch of docs/gpu-nightly.md, or restrict the run with --gtest_filter");
  verdicts::CaseEvidence ev(dir);
  const json& info = ev.case_info();
  MIH_CHECK_CODE(info.value("name", "") == p.case_name, Code::kFailedPrecondition, "evidence ", dir.string(),
                 " holds case '", info.value("name", ""), "', not '", p.case_name,
                 "': this directory belongs to another run or matrix; point --evidence-root at the run that produced it");
  const std::string spec_name = ev.json("spec.resolved.json").value("name", "");
  MIH_CHECK_CODE(spec_name == p.spec, Code::kFailedPrecondition, "evidence ", dir.string(), " is of spec '", spec_name,
                 "', not '", p.spec, "': point --evidence-root at the run of this spec");
  out.outcome = "verify_only";
  if (ev.has("case_run.json")) {
    const json& run = ev.json("case_run.json");
    out.outcome = run.value("outcome", "ran");
    out.error = run.value("error", "");
    out.seconds = run.value("seconds", 0.0);
  }
  if (out.outcome != "ran" && out.outcome != "verify_only" && out.outcome != "failed") {
    out.code = Code::kAborted;
  }
  return out;
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", s);
  return buf;
}

}  // namespace

void PrintTo(const CaseParam& p, std::ostream* os) { *os << p.spec << "/" << p.case_name; }

const spec::Case& case_of(const CaseParam& p) { return resolved_matrix(p.spec, p.matrix).at(p.case_name); }

void progress(const std::string& line) {
  if (!run_options().progress) return;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - g_start).count();
  std::fprintf(stderr, "[mih %6.1fs] %s\n", s, line.c_str());
}

int cases_launched() { return g_cases_launched; }

void note_error(Code code) {
  if (code == Code::kInvalidSpec || code == Code::kFailedPrecondition) {
    if (g_input_code == Code::kOk) g_input_code = code;
  } else if (code != Code::kOk) {
    note_infrastructure(code);
  }
}

int run_exit_status(int gtest_rc) {
  if (g_infrastructure_failed) return exit_status(g_infrastructure_code);
  if (g_input_code != Code::kOk) return exit_status(g_input_code);
  return gtest_rc == 0 ? 0 : 1;
}

const CaseOutcome& ensure_case(const CaseParam& p) {
  static std::mutex mu;
  static std::map<std::string, CaseOutcome> memo;
  std::lock_guard<std::mutex> lock(mu);
  const std::string key = p.spec + "/" + p.case_name + "/" + p.training_backend + "/" + p.matrix;
  auto it = memo.find(key);
  if (it != memo.end()) return it->second;
  const RunOptions& options = run_options();
  const fs::path root = options.evidence_root;
  const fs::path dir = fs::absolute(root / p.spec / p.case_name);
  CaseOutcome out;
  if (options.verify_only) {
    out = verify_only_outcome(p, dir);
  } else {
    const std::string fp = fingerprint(p);
    CaseLock case_lock(root / p.spec / ("." + p.case_name + ".lock"));
    bool reused = false;
    if (fs::exists(dir / "case_run.json")) {
      try {
        const json run = read_json_file(dir / "case_run.json");
        if (run.value("fingerprint", "") == fp) {
          out.evidence = dir;
          out.outcome = run.value("outcome", "");
          out.error = run.value("error", "");
          out.seconds = run.value("seconds", 0.0);
          out.code = out.outcome == "transport_failure" ? Code::kAborted : Code::kOk;
          reused = true;
        }
      } catch (const std::exception&) {
        // unreadable: relaunch
      }
    }
    if (!reused) {
      const spec::Case& c = case_of(p);
      const std::string fault = fault_of(p);
      progress(p.spec + "/" + p.case_name + ": launching " + std::to_string(c.world_size()) + " rank(s) (" +
               c.config.name() + (c.save_config ? ", resume" : "") + (fault.empty() ? "" : ", fault " + fault) + ")");
      CaseRunOptions o;
      o.matrix = p.matrix;
      o.evidence_root = root;
      o.training_backend = p.training_backend;
      o.fingerprint = fp;
      o.fault = fault;
      o.timeout = options.case_timeout;
      const CaseRunResult r = run_case(spec::SpecRegistry::instance().get(p.spec), c, o);
      out.evidence = r.evidence;
      out.outcome = r.outcome;
      out.error = r.error;
      out.code = r.code;
      out.seconds = r.seconds;
      out.launched_here = true;
      ++g_cases_launched;
      progress(p.spec + "/" + p.case_name + ": " + r.outcome + " (" + r.state + ") in " + seconds_text(r.seconds) +
               " s; " + std::to_string(g_cases_launched) + " case(s) launched");
    }
  }
  if (out.outcome == "transport_failure") note_infrastructure(out.code == Code::kOk ? Code::kAborted : out.code);
  return memo.emplace(key, std::move(out)).first->second;
}

}  // namespace mih::cases
