// `mih check` of another writer's evidence: the contract and the typed reading of every record
// first (bad evidence is exit 12 before any test), then every suite of the suite table whose
// declared reads (harness/compare/suite_reads.h) a case holds, registered at run time
// (GoogleTest's RegisterTest) and judged by the suite's own verdicts.
#include "harness/cases/foreign_check.h"

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/json_fields.h"
#include "harness/base/strings.h"
#include "harness/compare/suite_reads.h"
#include "harness/compare/verdicts.h"
#include "harness/contract/contract.h"
#include "harness/contract/evidence_layout.h"
#include "harness/contract/input_identity_row.h"
#include "harness/contract/metrics_row.h"
#include "harness/contract/replica_records.h"
#include "harness/contract/roundtrip_capture.h"
#include "harness/evidence/evidence_store.h"
#include "harness/spec/model_spec.h"

namespace mih::cases {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using verdicts::CaseEvidence;

// A foreign writer's case as environment.json describes it.
struct ForeignCase {
  fs::path dir, reference;
  std::string spec, name, dtype, writer;
  int64_t world_size = 1, steps = 0;
};

bool is_case_dir(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && !fs::is_symlink(dir, ec) &&
         (fs::exists(dir / layout::kEnvironment, ec) || fs::exists(dir / layout::kCaseRecord, ec));
}

// environment.json's stamp's writer, "" when it has none or cannot be read.
std::string writer_of(const fs::path& dir) {
  try {
    const json env = read_json_file(dir / layout::kEnvironment);
    if (env.is_object() && env.contains(contract::kStampKey) && env[contract::kStampKey].is_object()) {
      const json& s = env[contract::kStampKey];
      // A stamp of another shape is the contract's to refuse, as mih's evidence would be.
      return s.contains("writer") && s["writer"].is_string() ? s["writer"].get<std::string>() : "";
    }
  } catch (const Error&) {
  }
  return "";
}

bool mih_writer(const std::string& writer) { return writer.empty() || writer.rfind("mih ", 0) == 0; }

// `key` of `object` (field `where` of environment.json): its value, or `absent` when it has
// none; a value of another type is refused naming the field.
template <typename T>
T optional_field(const json& object, const char* key, const std::string& where, T absent) {
  if (!object.is_object() || !object.contains(key)) return absent;
  try {
    return object[key].get<T>();
  } catch (const json::exception&) {
    MIH_THROW(Code::kFailedPrecondition, "evidence ", where, ": ", key, " is ", object[key].dump().substr(0, 80),
              ", of the wrong type: the writer or an edit broke it");
  }
}

// The names of the case and its reference, checked against the directory it is in.
void check_names(const ForeignCase& c, const std::string& compare_to, const std::string& env_file) {
  MIH_CHECK_CODE(c.name == c.dir.filename().string(), Code::kFailedPrecondition, "evidence ", c.dir.string(),
                 " holds the evidence of case '", c.name, "' (environment.json case.name): check it where it was "
                 "written, <root>/<spec>/", c.name);
  // A sibling case's name, never a path: the reference is read inside the same spec directory.
  MIH_CHECK_CODE(compare_to.find_first_of("/\\") == std::string::npos && compare_to != "." && compare_to != "..",
                 Code::kFailedPrecondition, "evidence ", env_file, ": case.compare_to '", compare_to,
                 "' is not a case name (a sibling directory of ", c.dir.string(), ")");
  MIH_CHECK_CODE(compare_to != c.name, Code::kFailedPrecondition, "evidence ", env_file,
                 ": case.compare_to names the case itself: a case is compared with another run (its 1-rank run)");
}

// mih's case runner writes case_run.json (outcome, digests): such a directory is mih's evidence,
// checked by every suite that applies to it, never by this check because its stamp was renamed.
// What NumericParity reads of every case is the least a case holds: missing, it is bad evidence.
void check_files(const ForeignCase& c) {
  std::error_code ec;
  MIH_CHECK_CODE(!fs::exists(c.dir / layout::kCaseRecord, ec) && !fs::exists(c.dir / layout::kCaseRequest, ec),
                 Code::kFailedPrecondition, "evidence ", c.dir.string(), " holds mih's case records (",
                 layout::kCaseRecord, ", ", layout::kCaseRequest, ") but names the writer '", c.writer,
                 "': mih's evidence is checked as mih's; rerun the case, or restore its environment.json");
  for (const char* file : {layout::kMetrics, layout::kProbes, layout::kParameterWatchlist}) {
    MIH_CHECK_CODE(fs::exists(c.dir / file, ec), Code::kFailedPrecondition, "evidence ", c.dir.string(), " has no ", file,
                   ", which mih check reads (NumericParity); the writer must write it (docs/evidence.md)");
  }
}

// The case environment.json describes (validated by the contract first), checked against the
// directory it is in.
ForeignCase read_case(const fs::path& dir) {
  const contract::Validation v =
      contract::require_valid_case_dir(dir, "fix the writer that produced it (mih validate names every problem)");
  const std::string env_file = (dir / layout::kEnvironment).string();
  const json env = read_json_file(dir / layout::kEnvironment);
  MIH_CHECK_CODE(env.contains("case") && env["case"].is_object(), Code::kFailedPrecondition, "evidence ", env_file,
                 ": no 'case' (its name, compare_to and config.dtype): mih check cannot tell which case it is");
  const json& c = env["case"];
  ForeignCase out;
  out.dir = dir;
  out.writer = v.writer;
  out.spec = dir.parent_path().filename().string();
  out.name = optional_field<std::string>(c, "name", env_file + " case", "");
  out.dtype = optional_field<std::string>(c.contains("config") ? c["config"] : json(), "dtype", env_file + " case.config", "");
  out.steps = optional_field<int64_t>(c, "steps", env_file + " case", 0);
  out.world_size = optional_field<int64_t>(env, "world_size", env_file, 1);
  MIH_CHECK_CODE(out.world_size >= 1 && out.world_size <= 65536, Code::kFailedPrecondition, "evidence ", env_file,
                 ": world_size ", out.world_size, " is not a number of ranks");
  const std::string compare_to = optional_field<std::string>(c, "compare_to", env_file + " case", "");
  check_names(out, compare_to, env_file);
  if (!compare_to.empty()) out.reference = dir.parent_path() / compare_to;
  check_files(out);
  return out;
}

// The records of a foreign case read typed before any test reads them (bad evidence is exit 12,
// never a test that passes on what it skipped): metrics and input identity rows, the replica
// and gradient records against its structure, steps and world (contract::replica_steps); a run
// that stopped early; degrees that do not make its world.
void check_records(const ForeignCase& c) {
  const EvidenceDir dir = EvidenceDir::open_existing(c.dir);
  contract::ReplicaFrame frame;
  for (const auto& [step, row] : contract::metrics_rows(dir.read_jsonl(layout::kMetrics), (c.dir / layout::kMetrics).string())) {
    frame.steps.insert(step);
  }
  std::error_code ec;
  if (fs::exists(c.dir / layout::kInputIdentity, ec)) {
    contract::input_identity_rows(dir.read_jsonl(layout::kInputIdentity), (c.dir / layout::kInputIdentity).string());
  }
  if (c.steps > 0 && !frame.steps.empty()) {
    const int64_t first = *frame.steps.begin(), last = *frame.steps.rbegin();
    MIH_CHECK_CODE(static_cast<int64_t>(frame.steps.size()) == c.steps - first && last == c.steps - 1,
                   Code::kFailedPrecondition, "evidence ", c.dir.string(), " records steps ", first, "-", last,
                   " of a run of ", c.steps, " (environment.json case.steps): the run did not finish; rerun it");
  }
  const int64_t product = CaseEvidence(c.dir).config().world_size();
  MIH_CHECK_CODE(product == c.world_size, Code::kFailedPrecondition, "evidence ", c.dir.string(), ": the degrees of ",
                 layout::kConfigResolved, " make ", product, " rank(s), and environment.json says world_size ", c.world_size);
  frame.shapes = contract::global_shapes(read_json_file(c.dir / layout::kStructure), (c.dir / layout::kStructure).string());
  frame.world_size = c.world_size;
  contract::replica_steps(c.dir, contract::ReplicaKind::kParameters, frame);
  contract::replica_steps(c.dir, contract::ReplicaKind::kGradients, frame);
}

// The reference of `c`: a 1-rank case of the same dtype beside it. Returns its tolerance.
double check_reference(const ForeignCase& c) {
  MIH_CHECK_CODE(is_case_dir(c.reference), Code::kFailedPrecondition, "evidence ", c.dir.string(), " is compared with ",
                 c.reference.filename().string(), " (environment.json case.compare_to), and ", c.reference.string(),
                 " holds no case directory: write the reference's evidence there");
  const ForeignCase ref = read_case(c.reference);
  check_records(ref);
  // The reference is the case's 1-rank run: a multi-rank run is no independent reference (a
  // reduction bug it shares would pass).
  MIH_CHECK_CODE(ref.world_size == 1, Code::kFailedPrecondition, "evidence ", c.dir.string(), " is compared with ",
                 c.reference.string(), ", which ran on ", ref.world_size, " ranks (environment.json world_size): a "
                 "case's compare_to is its 1-rank run");
  MIH_CHECK_CODE(ref.dtype == c.dtype, Code::kFailedPrecondition, "evidence ", c.dir.string(), " is ", c.dtype,
                 ", its reference ", c.reference.string(), " ", ref.dtype, ": compare runs of one dtype");
  const spec::Tolerances defaults;
  const auto tol = defaults.cross_topology.find(c.dtype);
  MIH_CHECK_CODE(tol != defaults.cross_topology.end(), Code::kFailedPrecondition, "evidence ", c.dir.string(),
                 ": dtype '", c.dtype, "' (environment.json case.config.dtype) has no tolerance in this mih (float64, "
                 "float32, bfloat16)");
  return tol->second;
}

class ForeignTest : public ::testing::Test {
 public:
  explicit ForeignTest(std::function<void()> body) : body_(std::move(body)) {}
  void TestBody() override { body_(); }

 private:
  std::function<void()> body_;
};

void register_test(const std::string& suite, const std::string& name, std::function<void()> body) {
  ::testing::RegisterTest(suite.c_str(), name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                          [body]() -> ::testing::Test* { return new ForeignTest(body); });
}

// A case as the suites' verdicts take it; the evidence it points to is owned here.
struct Judged {
  ForeignCase c;
  std::shared_ptr<const CaseEvidence> ev, reference;
  verdicts::JudgedCase judged() const {
    return {*ev, reference.get(), tolerance, first_step};
  }
  double tolerance = 0;
  int64_t first_step = 0;
};

// The step a resumed run starts at (its load phase's capture), 0 for a run from scratch.
int64_t first_step_of(const CaseEvidence& ev) {
  if (!ev.has(layout::kRoundtripLoad)) return 0;
  return contract::roundtrip_capture(layout::kRoundtripLoad, ev.json(layout::kRoundtripLoad),
                                     (ev.dir() / layout::kRoundtripLoad).string()).next_step;
}

// A verdict as the result of a foreign test: a failure naming the case, its writer and its
// reference; a pass printing what it examined.
void expect_verdict(const Judged& j, const std::string& suite,
                    verdicts::Verdict (*verdict)(const verdicts::JudgedCase&)) {
  verdicts::Verdict v;
  try {
    v = verdict(j.judged());
  } catch (const Error& e) {
    v = verdicts::Verdict::fail(e.message());
  }
  if (v.passed()) {
    if (!v.message.empty()) std::printf("  %s\n", v.message.c_str());
    return;
  }
  char tolerance[32];
  std::snprintf(tolerance, sizeof tolerance, "%g", j.tolerance);
  ADD_FAILURE() << j.c.spec << "/" << j.c.name << " (" << j.c.writer << ")"
                << (j.reference ? " against " + j.c.reference.filename().string() : std::string())
                << (suite == "NumericParity"
                        ? ", tolerance " + std::string(tolerance) + " (" + j.c.dtype + ", this mih's cross-topology default)"
                        : std::string())
                << ":\n  " << (v.status == verdicts::Verdict::Status::kSkip ? "nothing to check: " : "") << v.message;
}

// What the check instantiated, per suite: the cases it ran on, and why it did not on the others.
struct Instantiated {
  std::map<std::string, int> cases;                  // suite -> cases it runs on
  std::map<std::string, std::set<std::string>> why;  // suite -> why not, on some case
  int tests = 0;
};

// Every suite of the table whose declared reads `j` holds, registered on it.
void instantiate(const std::shared_ptr<const Judged>& j, const std::vector<verdicts::DeclaredReads>& suites,
                 Instantiated* out) {
  const verdicts::JudgedCase judged = j->judged();
  for (const auto& [suite, reads] : suites) {
    if (!reads) continue;
    const std::vector<std::string> missing = verdicts::missing_reads(*reads, judged);
    const std::string nothing = missing.empty() && reads->examinable ? reads->examinable(judged) : "";
    if (!missing.empty() || !nothing.empty()) {
      out->why[suite].insert(missing.empty() ? nothing : "needs " + join(missing, ", "));
      continue;
    }
    ++out->cases[suite];
    for (const auto& [test, verdict] : reads->tests) {
      register_test("Foreign/" + suite, test + "/" + j->c.spec + "/" + j->c.name,
                    [j, suite, v = verdict] { expect_verdict(*j, suite, v); });
      ++out->tests;
    }
  }
}

// The header: the writers, the suites that ran and the files the others need.
void print_header(const std::vector<ForeignCase>& cases, const std::vector<verdicts::DeclaredReads>& suites,
                  const Instantiated& in) {
  std::map<std::string, int> writers;
  for (const ForeignCase& c : cases) ++writers[c.writer];
  std::string names, ran, absent, mih_only;
  for (const auto& [w, n] : writers) names += (names.empty() ? "" : ", ") + w + " (" + std::to_string(n) + ")";
  for (const auto& [suite, reads] : suites) {
    const auto count = in.cases.find(suite);
    if (!reads) {
      mih_only += (mih_only.empty() ? "" : ", ") + suite;
    } else if (count != in.cases.end()) {
      ran += (ran.empty() ? "" : ", ") + suite + " (" + std::to_string(count->second) + " case(s))";
    } else {
      const auto why = in.why.find(suite);
      absent += suite + " (" + (why == in.why.end() ? std::string("no case") : join(why->second, "; ")) + "); ";
    }
  }
  std::fprintf(stderr, "mih check: %zu case director%s written by %s, valid under %s version %d; %d test(s) of the "
               "suite table's suites whose evidence the cases hold, judged by their own verdicts at this mih's "
               "tolerances: %s; not instantiated for it: %s%s judge records only mih's session writes (its checks' "
               "findings, its runtime's records) or a spec's declarations, which no other writer's evidence holds\n",
               cases.size(), cases.size() == 1 ? "y" : "ies", names.c_str(), contract::kName, contract::kVersion,
               in.tests, ran.c_str(), absent.c_str(), mih_only.c_str());
}

// The cases of `evidence`, read and checked, all another writer's.
std::vector<ForeignCase> read_cases(const fs::path& evidence) {
  std::vector<ForeignCase> cases;
  for (const fs::path& dir : contract::case_dirs(evidence)) {
    MIH_CHECK_CODE(!mih_writer(writer_of(dir)), Code::kFailedPrecondition, "mih check: ", evidence.string(),
                   " mixes mih's evidence (", dir.string(), ") with another writer's: check each writer's case "
                   "directories on their own");
    cases.push_back(read_case(dir));
    check_records(cases.back());
  }
  return cases;
}

// Every suite on every case whose evidence it reads.
Instantiated instantiate_all(const fs::path& evidence, const std::vector<ForeignCase>& cases,
                             const std::vector<verdicts::DeclaredReads>& suites) {
  MIH_CHECK_CODE(!suites.empty(), Code::kInternal, "mih check: no suite of the suite table was given (suites/suite_table.h "
                 "declared_reads())");
  Instantiated in;
  bool compared = false;
  for (const ForeignCase& c : cases) {
    auto j = std::make_shared<Judged>();
    j->c = c;
    j->ev = std::make_shared<const CaseEvidence>(c.dir);
    if (!c.reference.empty()) {
      j->tolerance = check_reference(c);
      j->reference = std::make_shared<const CaseEvidence>(c.reference);
      compared = true;
    }
    j->first_step = first_step_of(*j->ev);
    instantiate(j, suites, &in);
  }
  MIH_CHECK_CODE(compared, Code::kFailedPrecondition, "mih check: no case of ", evidence.string(),
                 " names a reference (environment.json case.compare_to): there is nothing to check it against");
  return in;
}

// --gtest_* flags and --no-progress into `gtest`; false (after saying why) for another argument.
bool split_args(const std::vector<std::string>& args, std::vector<std::string>* gtest, bool* progress, bool* filtered) {
  for (const std::string& a : args) {
    if (a == "--no-progress") {
      *progress = false;
    } else if (a.rfind("--gtest_", 0) == 0) {
      *filtered = *filtered || a.rfind("--gtest_filter=", 0) == 0;
      gtest->push_back(a);
    } else {
      std::fprintf(stderr, "mih check: another writer's evidence takes --gtest_* flags and --no-progress, not '%s': "
                   "its tolerances and suites are this mih's own (docs/evidence.md)\n", a.c_str());
      return false;
    }
  }
  return true;
}

}  // namespace

std::vector<fs::path> foreign_case_dirs(const fs::path& evidence) {
  std::vector<fs::path> out;
  for (const fs::path& dir : contract::case_dirs(evidence)) {
    if (!mih_writer(writer_of(dir))) out.push_back(dir);
  }
  return out;
}

int check_foreign_evidence(const fs::path& evidence, const std::vector<std::string>& args,
                           const std::vector<verdicts::DeclaredReads>& suites) {
  std::vector<std::string> gtest = {"mih check"};
  bool progress = true, filtered = false;
  if (!split_args(args, &gtest, &progress, &filtered)) return 2;
  const std::vector<ForeignCase> cases = read_cases(evidence);
  const Instantiated in = instantiate_all(evidence, cases, suites);
  if (progress) print_header(cases, suites, in);
  if (!filtered) gtest.push_back("--gtest_filter=Foreign/*");
  std::vector<char*> argv;
  for (auto& a : gtest) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  ::testing::InitGoogleTest(&argc, argv.data());
  const int rc = RUN_ALL_TESTS();
  MIH_CHECK(::testing::UnitTest::GetInstance()->test_to_run_count() > 0,
            "mih check: the filter selects none of the ", in.tests, " test(s) of this evidence (Foreign/*)");
  return rc == 0 ? 0 : 1;
}

}  // namespace mih::cases
