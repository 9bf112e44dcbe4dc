// The conformance runner (see conformance.h).
#include "suites/conformance.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "harness/base/fault.h"
#include "harness/base/files.h"
#include "harness/base/sha256.h"
#include "harness/cli/case_runner.h"
#include "harness/cli/cli.h"
#include "harness/runtime/worker.h"
#include "harness/session/backend.h"
#include "harness/spec/case_matrix.h"

namespace mih::conformance {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json read_json_file(const fs::path& file) {
  std::string text;
  MIH_CHECK_CODE(read_file(file, &text), Code::kFailedPrecondition, "cannot read ", file.string());
  return json::parse(text);
}

bool g_enabled = false;  // set by conformance_main: instantiate the cases
bool g_infrastructure_failed = false;
Code g_infrastructure_code = Code::kOk;
int g_cases_launched = 0;
const auto g_start = std::chrono::steady_clock::now();

std::vector<Registration>& registry() {
  static std::vector<Registration> r;
  return r;
}

const Registration* registration(const std::string& prefix) {
  for (const auto& r : registry()) {
    if (r.prefix == prefix) return &r;
  }
  return nullptr;
}

bool selected(const Registration& r) {
  const bool named = options().prefixes.count(r.prefix) > 0;
  return (options().only_spec.empty() || options().only_spec == r.spec) &&
         (named || (options().prefixes.empty() && !r.on_request));
}

// The fault a case runs with ("" for none).
std::string fault_of(const CaseParam& p) {
  return options().fault_cases.count(p.case_name) ? options().fault : std::string();
}

std::string matrix_of(const Registration& r) { return options().matrix.empty() ? r.matrix : options().matrix; }

// Resolved matrices, by (spec, matrix).
const spec::CaseMatrix& matrix(const std::string& spec_name, const std::string& source) {
  static std::map<std::pair<std::string, std::string>, spec::CaseMatrix> cache;
  auto key = std::make_pair(spec_name, source);
  auto it = cache.find(key);
  if (it == cache.end()) {
    it = cache.emplace(key, spec::resolve_matrix_source(spec::SpecRegistry::instance().get(spec_name), source)).first;
  }
  return it->second;
}

double elapsed_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - g_start).count();
}

void progress(const std::string& line) {
  if (options().progress) std::fprintf(stderr, "[mih %6.1fs] %s\n", elapsed_s(), line.c_str());
}

// What produced a case's evidence: this binary, the matrix (its content for a file), the
// backend, the case. Evidence with another fingerprint is relaunched, never reused.
std::string fingerprint(const CaseParam& p) {
  std::string id = p.spec + "|" + p.case_name + "|" + p.backend + "|" + p.matrix + "|" + fault_of(p);
  struct stat st {};
  if (::stat("/proc/self/exe", &st) == 0) id += "|" + std::to_string(st.st_size) + ":" + std::to_string(st.st_mtime);
  if (fs::is_regular_file(p.matrix)) {
    std::ifstream in(p.matrix);
    std::stringstream ss;
    ss << in.rdbuf();
    id += "|" + sha256_hex(ss.str());
  }
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

Code g_input_code = Code::kOk;  // bad input or evidence (kInvalidSpec, kFailedPrecondition)

void note_infrastructure(Code code) {
  g_infrastructure_failed = true;
  if (g_infrastructure_code == Code::kOk) g_infrastructure_code = code;
}

CaseOutcome verify_only_outcome(const CaseParam& p, const fs::path& dir) {
  CaseOutcome out;
  out.evidence = dir;
  MIH_CHECK_CODE(fs::is_directory(dir), Code::kFailedPrecondition, "verify-only: no evidence for case ", p.spec, "/",
                 p.case_name, " at ", dir.string(), "; produce it first, e.g. `mih run --spec ", p.spec, " --case ",
                 p.case_name, " --matrix ", p.matrix, " --evidence-root ", options().evidence_root.string(),
                 "` or the torchrun/srun launch of the README, or restrict the run with --gtest_filter");
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

}  // namespace

Options& options() {
  static Options o;
  return o;
}

void note_error(Code code) {
  if (code == Code::kInvalidSpec || code == Code::kFailedPrecondition) {
    if (g_input_code == Code::kOk) g_input_code = code;
  } else if (code != Code::kOk) {
    note_infrastructure(code);
  }
}

bool add_registration(Registration r) {
  for (const auto& x : registry()) {
    if (x.prefix == r.prefix) {
      std::fprintf(stderr, "mih: MIH_CONFORMANCE_SUITES prefix '%s' is registered twice (specs '%s' and '%s')\n",
                   r.prefix.c_str(), x.spec.c_str(), r.spec.c_str());
      std::abort();
    }
  }
  registry().push_back(std::move(r));
  return true;
}

const std::vector<Registration>& registrations() { return registry(); }

void PrintTo(const CaseParam& p, std::ostream* os) { *os << p.spec << "/" << p.case_name; }

std::vector<CaseParam> cases_for(const std::string& prefix) {
  std::vector<CaseParam> out;
  if (!g_enabled) return out;
  const Registration* r = registration(prefix);
  if (!r) return out;
  if (!selected(*r)) return out;
  const spec::CaseMatrix& m = matrix(r->spec, matrix_of(*r));
  const auto backend = BackendRegistry::instance().make(r->backend);
  for (const auto& c : m.cases) {
    if (!backend->unsupported(c.config, c.save_config.has_value()).empty()) continue;
    out.push_back({r->prefix, r->spec, matrix_of(*r), r->backend, c.name});
  }
  return out;
}

std::string param_name(const ::testing::TestParamInfo<CaseParam>& info) { return info.param.case_name; }

const CaseOutcome& ensure_case(const CaseParam& p) {
  static std::mutex mu;
  static std::map<std::string, CaseOutcome> memo;
  std::lock_guard<std::mutex> lock(mu);
  const std::string key = p.spec + "/" + p.case_name + "/" + p.backend + "/" + p.matrix;
  auto it = memo.find(key);
  if (it != memo.end()) return it->second;
  const fs::path root = options().evidence_root;
  const fs::path dir = fs::absolute(root / p.spec / p.case_name);
  CaseOutcome out;
  if (options().verify_only) {
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
      const spec::Case& c = matrix(p.spec, p.matrix).at(p.case_name);
      const std::string fault = fault_of(p);
      progress(p.spec + "/" + p.case_name + ": launching " + std::to_string(c.world_size()) + " rank(s) (" + c.config.name() +
               (c.save_config ? ", resume" : "") + (fault.empty() ? "" : ", fault " + fault) + ")");
      CaseRunOptions o;
      o.spec = p.spec;
      o.matrix = p.matrix;
      o.case_name = p.case_name;
      o.evidence_root = root;
      o.backend = p.backend;
      o.fingerprint = fp;
      o.fault = fault;
      o.timeout = std::chrono::milliseconds(static_cast<int64_t>(options().case_timeout_s * 1000));
      const CaseRunResult r = run_case(o);
      out.evidence = r.evidence;
      out.outcome = r.outcome;
      out.error = r.error;
      out.code = r.code;
      out.seconds = r.seconds;
      out.launched_here = true;
      ++g_cases_launched;
      progress(p.spec + "/" + p.case_name + ": " + r.outcome + " (" + r.state + ") in " +
               std::to_string(r.seconds).substr(0, std::to_string(r.seconds).find('.') + 2) + " s; " +
               std::to_string(g_cases_launched) + " case(s) launched");
    }
  }
  if (out.outcome == "transport_failure") note_infrastructure(out.code == Code::kOk ? Code::kAborted : out.code);
  return memo.emplace(key, std::move(out)).first->second;
}

const verdicts::CaseEvidence* ConformanceTest::evidence() { return other(GetParam().case_name); }

const verdicts::CaseEvidence* ConformanceTest::other(const std::string& case_name) {
  static std::map<std::string, std::unique_ptr<verdicts::CaseEvidence>> views;
  CaseParam p = GetParam();
  p.case_name = case_name;
  const CaseOutcome* o = nullptr;
  try {
    o = &ensure_case(p);
  } catch (const Error& e) {
    note_error(e.code());
    ADD_FAILURE() << "case " << p.spec << "/" << case_name << " could not run: " << e.what();
    return nullptr;
  }
  if (o->outcome == "transport_failure") {
    ADD_FAILURE() << "INFRASTRUCTURE FAILURE (not a conformance verdict): case " << p.spec << "/" << case_name
                  << " did not complete:\n"
                  << o->error << "\n  (logs: " << (o->evidence / "run").string() << ")";
    return nullptr;
  }
  if (o->outcome == "failed") {
    ADD_FAILURE() << "case " << p.spec << "/" << case_name << " FAILED before its training finished: " << o->error
                  << "\n  (open " << (o->evidence / "integration_state.json").string() << " and "
                  << (o->evidence / "check/findings.json").string() << ")";
    return nullptr;
  }
  const std::string key = o->evidence.string();
  auto it = views.find(key);
  if (it == views.end()) it = views.emplace(key, std::make_unique<verdicts::CaseEvidence>(o->evidence)).first;
  return it->second.get();
}

std::string ConformanceTest::compare_to() { return matrix(GetParam().spec, GetParam().matrix).at(GetParam().case_name).compare_to; }

std::string ConformanceTest::kind() {
  return spec::case_kind_name(matrix(GetParam().spec, GetParam().matrix).at(GetParam().case_name).kind);
}

const verdicts::CaseEvidence* ConformanceTest::compared() {
  const std::string target = compare_to();
  return target.empty() ? nullptr : other(target);
}

std::string ConformanceTest::without_activation_checkpointing() {
  const spec::CaseMatrix& m = matrix(GetParam().spec, GetParam().matrix);
  ParallelConfig want = m.at(GetParam().case_name).config;
  want.activation_checkpointing = false;
  for (const auto& c : m.cases) {
    if (c.kind == spec::CaseKind::kTrain && c.config.name() == want.name() && c.config.dtype == want.dtype) return c.name;
  }
  return "";
}

namespace {

// Appends one line per finished test to <root>/results.jsonl (whole-line O_APPEND writes:
// several processes of one ctest run share the file).
class ResultsWriter : public ::testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const std::string suite_full = info.test_suite_name(), name_full = info.name();
    const auto slash = suite_full.find('/');
    if (slash == std::string::npos) return;
    const Registration* r = registration(suite_full.substr(0, slash));
    if (!r) return;
    const auto pslash = name_full.rfind('/');
    const std::string case_name = pslash == std::string::npos ? "" : name_full.substr(pslash + 1);
    const auto* result = info.result();
    std::string status = result->Skipped() ? "skipped" : result->Failed() ? "failed" : "passed";
    std::string message;
    for (int i = 0; i < result->total_part_count(); ++i) {
      const auto& part = result->GetTestPartResult(i);
      if (part.failed() || part.skipped()) message += (message.empty() ? "" : "\n") + std::string(part.message());
    }
    char stamp[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    const json line = {{"name", suite_full + "." + name_full},
                       {"spec", r->spec},
                       {"case", case_name},
                       {"suite", suite_full.substr(slash + 1)},
                       {"test", pslash == std::string::npos ? name_full : name_full.substr(0, pslash)},
                       {"status", status},
                       {"message", message},
                       {"seconds", static_cast<double>(result->elapsed_time()) / 1000.0},
                       {"evidence", r->spec + "/" + case_name},
                       {"time", stamp}};
    const std::string text = line.dump() + "\n";
    const fs::path file = options().evidence_root / "results.jsonl";
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
      std::fprintf(stderr, "mih: cannot append to %s: %s\n", file.c_str(), std::strerror(errno));
    }
    if (fd >= 0) ::close(fd);
  }
};

std::string run_id() {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  return std::string(stamp) + "-" + std::to_string(::getpid());
}

// `mih check <dir>`: a case directory (<root>/<spec>/<case>) or a run root.
std::vector<std::string> check_arguments(const fs::path& target, std::string* filter) {
  MIH_CHECK_CODE(fs::is_directory(target), Code::kFailedPrecondition, "mih check: ", target.string(),
                 " is not a directory; give a case's evidence directory (<root>/<spec>/<case>) or a run root");
  std::vector<std::string> args = {"--verify-only"};
  if (fs::exists(target / "environment.json") && fs::exists(target / "spec.resolved.json")) {
    const verdicts::CaseEvidence ev(target);
    const std::string spec_name = ev.json("spec.resolved.json").value("name", "");
    const fs::path root = fs::absolute(target).parent_path().parent_path();
    args.insert(args.end(), {"--evidence-root", root.string(), "--only-spec", spec_name});
    if (ev.has("case_run.json")) args.insert(args.end(), {"--matrix", ev.json("case_run.json").value("matrix", "")});
    // Name the spec's registrations: an on-request one (a fault-catalog variant) runs only then.
    std::string prefixes;
    for (const auto& r : registrations()) {
      if (r.spec == spec_name) prefixes += (prefixes.empty() ? "" : ",") + r.prefix;
    }
    if (!prefixes.empty()) args.insert(args.end(), {"--prefixes", prefixes});
    *filter = "*/*.*/" + ev.case_info().value("name", "");
  } else {
    args.insert(args.end(), {"--evidence-root", fs::absolute(target).string()});
    if (fs::exists(target / "run.json")) {
      const json run = read_json_file(target / "run.json");
      if (!run.value("matrix", "").empty()) args.insert(args.end(), {"--matrix", run.value("matrix", "")});
    }
    // Only the specs with evidence under this root.
    std::string specs, prefixes;
    for (const auto& r : registrations()) {
      if (!fs::is_directory(target / r.spec)) continue;
      specs += (specs.empty() ? "" : ":") + r.prefix + "/*";
      prefixes += (prefixes.empty() ? "" : ",") + r.prefix;
    }
    MIH_CHECK_CODE(!specs.empty(), Code::kFailedPrecondition, "mih check: ", target.string(),
                   " holds no evidence of a registered spec (no <spec>/ folder); is it a run root?");
    args.insert(args.end(), {"--prefixes", prefixes});
    *filter = specs;
  }
  return args;
}

// For ctest registration (cmake/MihConformance.cmake): one line per case of every
// registration, "<prefix> <spec> <case> <label,label,...>". Labels: the spec, the case's
// group and axes (dp_shard, tp, sp, cp, ac, mb, resume) and the suites that apply to it.
void print_cases() {
  for (const auto& r : registrations()) {
    if (!selected(r)) continue;
    const spec::CaseMatrix& m = matrix(r.spec, matrix_of(r));
    const auto backend = BackendRegistry::instance().make(r.backend);
    for (const auto& c : m.cases) {
      if (!backend->unsupported(c.config, c.save_config.has_value()).empty()) continue;
      const ParallelConfig& k = c.config;
      std::vector<std::string> labels = {"conformance", r.spec, c.group};
      if (k.dp_replicate > 1) labels.push_back("dp_replicate");
      if (k.dp_shard > 1) labels.push_back("dp_shard");
      if (k.cp > 1) labels.push_back("cp");
      if (k.tp > 1) labels.push_back("tp");
      if (k.sequence_parallel) labels.push_back("sp");
      if (k.activation_checkpointing) labels.push_back("ac");
      if (k.micro_batches > 1) labels.push_back("mb");
      const bool reference = c.kind == spec::CaseKind::kReference, resume = c.save_config.has_value();
      const bool parallel = c.world_size() > 1 || (resume && c.save_config->dims().product() > 1);
      for (const char* s : {"Structure", "OptimizerLayout", "DataContract", "CheckpointCoverage", "SharedState",
                            "ModalityGradients", "StateInvariants", "CommVolume"}) {
        labels.push_back(s);
      }
      if (k.dp_shard > 1) labels.push_back("FsdpUnits");
      if (!reference) labels.insert(labels.end(), {"InputIdentity", "NumericParity"});
      if (reference) labels.push_back("ModuleParity");
      if (resume) labels.insert(labels.end(), {"CheckpointRoundTrip", "Resume"});
      if (parallel) labels.push_back("ReplicaConsistency");
      if (k.activation_checkpointing) labels.push_back("ActivationCheckpointEquivalence");
      std::string joined;
      for (const auto& l : labels) joined += (joined.empty() ? "" : ",") + l;
      std::printf("%s %s %s %s\n", r.prefix.c_str(), r.spec.c_str(), c.name.c_str(), joined.c_str());
    }
  }
}

int run_tests(int argc, char** argv) {
  // mih flags first; the rest goes to GoogleTest.
  std::vector<char*> rest = {argv[0]};
  bool list_cases = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      MIH_CHECK(i + 1 < argc, flag, " needs a value");
      return argv[++i];
    };
    if (a == "--evidence-root") {
      options().evidence_root = value("--evidence-root");
    } else if (a == "--matrix") {
      options().matrix = value("--matrix");
    } else if (a == "--verify-only") {
      options().verify_only = true;
    } else if (a == "--prefixes") {
      std::stringstream list(value("--prefixes"));
      for (std::string x; std::getline(list, x, ',');) {
        MIH_CHECK(registration(x) != nullptr, "--prefixes: no MIH_CONFORMANCE_SUITES registration '", x, "' is linked");
        options().prefixes.insert(x);
      }
    } else if (a == "--only-spec") {
      options().only_spec = value("--only-spec");
    } else if (a == "--case-timeout") {
      options().case_timeout_s = std::stod(value("--case-timeout"));
    } else if (a == "--fault") {
      options().fault = fault::name(fault::parse(value("--fault")));
    } else if (a == "--fault-cases") {
      std::stringstream list(value("--fault-cases"));
      for (std::string x; std::getline(list, x, ',');) options().fault_cases.insert(x);
    } else if (a == "--no-progress") {
      options().progress = false;
    } else if (a == "--mih-list-cases") {
      list_cases = true;
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (list_cases) {
    print_cases();
    return 0;
  }
  MIH_CHECK(options().fault.empty() == options().fault_cases.empty(),
            "--fault and --fault-cases go together: the fault, and the cases that run with it (the others, the "
            "reference first, run fault-free)");
  if (options().evidence_root.empty()) {
    const char* env = std::getenv("MIH_EVIDENCE_ROOT");
    options().evidence_root = env && *env ? fs::path(env) : fs::path("build/mih-evidence") / run_id();
  }
  options().evidence_root = fs::absolute(options().evidence_root);
  bool listing = false;
  for (size_t i = 1; i < rest.size(); ++i) listing = listing || std::strncmp(rest[i], "--gtest_list_tests", 18) == 0;
  if (listing) {
  } else if (options().verify_only) {
    MIH_CHECK_CODE(fs::is_directory(options().evidence_root), Code::kFailedPrecondition, "--verify-only: evidence root ",
                   options().evidence_root.string(), " does not exist");
  } else {
    fs::create_directories(options().evidence_root);
  }
  // Resolve every registration's matrix now: a bad preset or file is bad input (exit 11)
  // before any test runs, not 160 failing tests.
  for (const auto& r : registrations()) {
    if (selected(r)) (void)matrix(r.spec, matrix_of(r));
  }
  g_enabled = true;
  int gargc = static_cast<int>(rest.size());
  ::testing::InitGoogleTest(&gargc, rest.data());
  ::testing::UnitTest::GetInstance()->listeners().Append(new ResultsWriter);
  if (::testing::UnitTest::GetInstance()->total_test_count() == 0) {
    std::fprintf(stderr, "%s: no conformance test is linked (MIH_CONFORMANCE_SUITES in a spec file of an OBJECT library)\n",
                 argv[0]);
    return 1;
  }
  if (!options().verify_only && !listing) {
    json regs = json::array();
    for (const auto& r : registrations()) regs.push_back({{"prefix", r.prefix}, {"spec", r.spec}, {"matrix", matrix_of(r)}, {"backend", r.backend}});
    std::ofstream(options().evidence_root / "run.json") << json({{"matrix", options().matrix}, {"registrations", regs}}).dump(2);
  }
  progress("evidence root " + options().evidence_root.string() + (options().verify_only ? " (verify-only)" : ""));
  if (listing) return RUN_ALL_TESTS();
  const int rc = RUN_ALL_TESTS();
  progress(std::to_string(g_cases_launched) + " case(s) launched; results in " +
           (options().evidence_root / "results.jsonl").string() + "; `mih report " + options().evidence_root.string() +
           " --format md` for the table");
  if (g_infrastructure_failed) return exit_status(g_infrastructure_code);
  if (g_input_code != Code::kOk) return exit_status(g_input_code);
  return rc == 0 ? 0 : 1;
}

int conformance_runner(const std::vector<std::string>& args) {
  std::vector<std::string> all = {"mih"};
  std::string filter;
  if (!args.empty() && args[0] == "--check") {
    MIH_CHECK(args.size() >= 2, "mih check needs an evidence directory");
    for (auto& a : check_arguments(args[1], &filter)) all.push_back(a);
    for (size_t i = 2; i < args.size(); ++i) all.push_back(args[i]);
    all.push_back("--gtest_filter=" + filter);
  } else {
    all.insert(all.end(), args.begin(), args.end());
  }
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  return run_tests(static_cast<int>(argv.size()), argv.data());
}

const bool g_runner_set = (set_conformance_runner(conformance_runner), true);

}  // namespace

int conformance_main(int argc, char** argv, bool tests_by_default) {
  (void)g_runner_set;
  if (argc > 1 && std::strcmp(argv[1], "worker") == 0) return worker_main(argc - 1, argv + 1);
  // A subcommand, --help or --version is the CLI; a conformance or GoogleTest flag runs the
  // suites; no argument runs them in a conformance binary and prints the help in `mih`.
  bool tests = tests_by_default;
  if (argc > 1) {
    const std::string a = argv[1];
    static const std::set<std::string> flags = {"--evidence-root", "--matrix",      "--verify-only", "--case-timeout",
                                                "--prefixes",      "--only-spec",   "--no-progress", "--mih-list-cases",
                                                "--fault",         "--fault-cases"};
    if (a[0] != '-' || a == "--help" || a == "-h" || a == "--version") {
      tests = false;
    } else {
      tests = tests || flags.count(a) > 0 || a.rfind("--gtest_", 0) == 0;
    }
  }
  if (!tests) return cli_main(argc, argv);
  try {
    return run_tests(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "mih: %s error: %s\n", std::string(code_name(e.code())).c_str(), e.what());
    return exit_status(e.code());
  }
}

}  // namespace mih::conformance
