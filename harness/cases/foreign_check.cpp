// `mih check` of another writer's evidence: the contract first, then the suites of measured
// evidence registered at run time (GoogleTest's RegisterTest), one per case and reference.
#include "harness/cases/foreign_check.h"
#include "harness/cases/foreign_check_internal.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/json_fields.h"
#include "harness/base/strings.h"
#include "harness/compare/compare.h"
#include "harness/contract/contract.h"
#include "harness/evidence/evidence_store.h"
#include "harness/spec/model_spec.h"

namespace mih::cases {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The suites no foreign writer's evidence instantiates, and why (docs/evidence.md, "What each
// suite reads").
constexpr char kNotInstantiated[] =
    "TensorParallelGradients, GradientPresence, "
    "OptimizerLayout, SharedState, UndeclaredSharedState, DataContract, CpReplicatedInputs, TensorParallelInputs, "
    "CheckpointCoverage, SourceCheckpoint, FrozenParameters, Structure, TiedParameters and PipelineOutputs judge the "
    "findings of mih's session checks, which run inside mih's trainer on its live state (a findings file of another "
    "writer is not evidence of them); CommVolume, PipelineSchedule, FsdpUnits, ActivationCheckpointEquivalence, "
    "Resume, StateInvariants, ModuleParity, ModalityGradients and MatchesOriginal judge records "
    "of mih's runtime or a spec's declarations, and no spec compiled into this mih describes this evidence";

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

using foreign::ForeignCase;
// The case environment.json describes (validated by the contract already), checked against
// the directory it is in.
ForeignCase read_case(const fs::path& dir) {
  const contract::Validation v =
      contract::require_valid_case_dir(dir, "fix the writer that produced it (mih validate names every problem)");
  const json env = read_json_file(dir / layout::kEnvironment);
  MIH_CHECK_CODE(env.contains("case") && env["case"].is_object(), Code::kFailedPrecondition, "evidence ",
                 (dir / layout::kEnvironment).string(),
                 ": no 'case' (its name, compare_to and config.dtype): mih check cannot tell which case it is");
  const json& c = env["case"];
  ForeignCase out;
  out.dir = dir;
  out.writer = v.writer;
  out.name = c.value("name", "");
  out.spec = dir.parent_path().filename().string();
  out.dtype = c.contains("config") && c["config"].is_object() ? c["config"].value("dtype", "") : "";
  out.world_size = env.contains("world_size") && env["world_size"].is_number_integer() ? env["world_size"].get<int64_t>() : 1;
  MIH_CHECK_CODE(out.world_size >= 1 && out.world_size <= 65536, Code::kFailedPrecondition, "evidence ",
                 (dir / layout::kEnvironment).string(), ": world_size ", out.world_size, " is not a number of ranks");
  MIH_CHECK_CODE(out.name == dir.filename().string(), Code::kFailedPrecondition, "evidence ", dir.string(),
                 " holds the evidence of case '", out.name, "' (environment.json case.name): check it where it was "
                 "written, <root>/<spec>/", out.name);
  const std::string compare_to = c.value("compare_to", "");
  // A sibling case's name, never a path: the reference is read inside the same spec directory.
  MIH_CHECK_CODE(compare_to.find_first_of("/\\") == std::string::npos && compare_to != "." && compare_to != "..",
                 Code::kFailedPrecondition, "evidence ", (dir / layout::kEnvironment).string(), ": case.compare_to '",
                 compare_to, "' is not a case name (a sibling directory of ", dir.string(), ")");
  MIH_CHECK_CODE(compare_to != out.name, Code::kFailedPrecondition, "evidence ", (dir / layout::kEnvironment).string(),
                 ": case.compare_to names the case itself: a case is compared with another run (its 1-rank run)");
  if (!compare_to.empty()) out.reference = dir.parent_path() / compare_to;
  // mih's case runner writes case_run.json (outcome, digests): such a directory is mih's
  // evidence, checked by every suite that applies to it, never by this weaker check because
  // its stamp was renamed.
  std::error_code ec;
  MIH_CHECK_CODE(!fs::exists(dir / layout::kCaseRecord, ec) && !fs::exists(dir / layout::kCaseRequest, ec),
                 Code::kFailedPrecondition, "evidence ", dir.string(), " holds mih's case records (",
                 layout::kCaseRecord, ", ", layout::kCaseRequest, ") but names the writer '", v.writer,
                 "': mih's evidence is checked as mih's; rerun the case, or restore its environment.json");
  // What the foreign suites read: missing, it is bad evidence (12), not a failed test.
  for (const char* file : {layout::kMetrics, layout::kProbes, layout::kParameterWatchlist}) {
    MIH_CHECK_CODE(fs::exists(dir / file, ec), Code::kFailedPrecondition, "evidence ", dir.string(), " has no ", file,
                   ", which mih check reads (NumericParity); the writer must write it (docs/evidence.md)");
  }
  return out;
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

}  // namespace

using namespace foreign;

std::vector<fs::path> foreign_case_dirs(const fs::path& evidence) {
  std::vector<fs::path> out;
  for (const fs::path& dir : contract::case_dirs(evidence)) {
    if (!mih_writer(writer_of(dir))) out.push_back(dir);
  }
  return out;
}

int check_foreign_evidence(const fs::path& evidence, const std::vector<std::string>& args) {
  const std::vector<fs::path> dirs = contract::case_dirs(evidence);
  std::vector<std::string> gtest = {"mih check"};
  bool progress = true, filtered = false;
  for (const std::string& a : args) {
    if (a == "--no-progress") {
      progress = false;
    } else if (a.rfind("--gtest_", 0) == 0) {
      filtered = filtered || a.rfind("--gtest_filter=", 0) == 0;
      gtest.push_back(a);
    } else {
      std::fprintf(stderr, "mih check: another writer's evidence takes --gtest_* flags and --no-progress, not '%s': "
                   "its tolerances and suites are this mih's own (docs/evidence.md)\n", a.c_str());
      return 2;
    }
  }
  std::vector<ForeignCase> cases;
  std::map<std::string, int> writers;
  for (const fs::path& dir : dirs) {
    const std::string writer = writer_of(dir);
    MIH_CHECK_CODE(!mih_writer(writer), Code::kFailedPrecondition, "mih check: ", evidence.string(),
                   " mixes mih's evidence (", dir.string(), ") with another writer's: check each writer's case "
                   "directories on their own");
    cases.push_back(read_case(dir));
    check_records(cases.back());
    ++writers[writer];
  }
  const spec::Tolerances defaults;
  int registered = 0;
  std::set<std::string> suites;  // the Foreign suites registered for some case
  for (const ForeignCase& c : cases) {
    if (c.reference.empty()) continue;
    MIH_CHECK_CODE(is_case_dir(c.reference), Code::kFailedPrecondition, "evidence ", c.dir.string(),
                   " is compared with ", c.reference.filename().string(), " (environment.json case.compare_to), and ",
                   c.reference.string(), " holds no case directory: write the reference's evidence there");
    const ForeignCase ref = read_case(c.reference);
    check_records(ref);
    // The reference is the case's 1-rank run: a multi-rank run is no independent reference (a
    // reduction bug it shares would pass).
    MIH_CHECK_CODE(ref.world_size == 1, Code::kFailedPrecondition, "evidence ", c.dir.string(), " is compared with ",
                   c.reference.string(), ", which ran on ", ref.world_size, " ranks (environment.json world_size): a "
                   "case's compare_to is its 1-rank run");
    MIH_CHECK_CODE(ref.dtype == c.dtype, Code::kFailedPrecondition, "evidence ", c.dir.string(), " is ", c.dtype,
                   ", its reference ", c.reference.string(), " ", ref.dtype, ": compare runs of one dtype");
    const auto tol = defaults.cross_topology.find(c.dtype);
    MIH_CHECK_CODE(tol != defaults.cross_topology.end(), Code::kFailedPrecondition, "evidence ", c.dir.string(),
                   ": dtype '", c.dtype, "' (environment.json case.config.dtype) has no tolerance in this mih (float64, "
                   "float32, bfloat16)");
    const double tolerance = tol->second;
    register_test("Foreign/NumericParity", "MatchesReference/" + c.spec + "/" + c.name,
                  [c, tolerance] { numeric_parity(c, tolerance); });
    ++registered;
    std::error_code ec;
    if (fs::exists(c.dir / layout::kInputIdentity, ec) || fs::exists(c.reference / layout::kInputIdentity, ec)) {
      register_test("Foreign/InputIdentity", "SameInputsAsReference/" + c.spec + "/" + c.name, [c] { same_inputs(c); });
      ++registered;
    }
    // Where the writer recorded every rank's copy (more than one rank holding a piece).
    if (any_compared(replica_files(c.dir, "replicas_step"))) {
      register_test("Foreign/ReplicaConsistency", "ReplicasAgreeAfterEveryStep/" + c.spec + "/" + c.name,
                    [c] { replicas_agree(c); });
      ++registered;
      suites.insert("ReplicaConsistency");
    }
    // Where the writer recorded every rank's gradient pieces after its synchronization.
    if (!replica_files(c.dir, "gradient_replicas_step").empty()) {
      register_test("Foreign/GradientSync", "GradientsAgreeAfterSync/" + c.spec + "/" + c.name,
                    [c] { gradients_agree(c); });
      ++registered;
      suites.insert("GradientSync");
    }
    // Where it captured a checkpoint's save (before_save/) or load.
    if (fs::exists(c.dir / layout::kRoundtripLoad, ec) || fs::exists(c.dir / layout::before_save(layout::kRoundtripSave), ec)) {
      register_test("Foreign/CheckpointRoundTrip", "RestoresWhatWasSaved/" + c.spec + "/" + c.name,
                    [c] { checkpoint_round_trip(c); });
      ++registered;
      suites.insert("CheckpointRoundTrip");
    }
  }
  MIH_CHECK_CODE(registered > 0, Code::kFailedPrecondition, "mih check: no case of ", evidence.string(),
                 " names a reference (environment.json case.compare_to): there is nothing to check it against");
  if (progress) {
    std::string names;
    for (const auto& [w, n] : writers) names += (names.empty() ? "" : ", ") + w + " (" + std::to_string(n) + ")";
    // What this evidence instantiates beyond NumericParity and InputIdentity, and what it does not, with why.
    const std::vector<std::pair<std::string, std::string>> measured = {
        {"ReplicaConsistency", "no case records a parameter piece's copies on two ranks or more "
                               "(cases/runtime/replicas_step<k>.json digests)"},
        {"GradientSync", "no case records every rank's gradient pieces after its synchronization "
                         "(cases/runtime/gradient_replicas_step<k>.json: a trainer session writes them, the Python writer "
                         "does not)"},
        {"CheckpointRoundTrip", "no case captured a checkpoint's save and load (checkpoint/roundtrip_load.json)"}};
    std::string ran = "NumericParity, InputIdentity", absent;
    for (const auto& [suite, why] : measured) {
      if (suites.count(suite)) {
        ran += ", " + suite;
      } else {
        absent += suite + " (" + why + "); ";
      }
    }
    std::fprintf(stderr, "mih check: %zu case director%s written by %s, valid under %s version %d; %d test(s) of "
                 "measured evidence (%s), at this mih's tolerances; not instantiated for it: %s%s\n",
                 cases.size(), cases.size() == 1 ? "y" : "ies", names.c_str(), contract::kName, contract::kVersion,
                 registered, ran.c_str(), absent.c_str(), kNotInstantiated);
  }
  if (!filtered) gtest.push_back("--gtest_filter=Foreign/*");
  std::vector<char*> argv;
  for (auto& a : gtest) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  ::testing::InitGoogleTest(&argc, argv.data());
  const int rc = RUN_ALL_TESTS();
  MIH_CHECK(::testing::UnitTest::GetInstance()->test_to_run_count() > 0,
            "mih check: the filter selects none of the ", registered, " test(s) of this evidence (Foreign/*)");
  return rc == 0 ? 0 : 1;
}

}  // namespace mih::cases
