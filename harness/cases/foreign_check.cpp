// `mih check` of another writer's evidence: the contract first, then the suites of measured
// evidence registered at run time (GoogleTest's RegisterTest), one per case and reference.
#include "harness/cases/foreign_check.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/evidence_layout.h"
#include "harness/base/json_fields.h"
#include "harness/compare/compare.h"
#include "harness/evidence/contract.h"
#include "harness/evidence/evidence_store.h"
#include "harness/spec/model_spec.h"

namespace mih::cases {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The suites no foreign writer's evidence instantiates, and why (docs/evidence.md, "What each
// suite reads").
constexpr char kNotInstantiated[] =
    "not instantiated for it: GradientSync, TensorParallelGradients, GradientPresence, "
    "OptimizerLayout, SharedState, UndeclaredSharedState, DataContract, CpReplicatedInputs, TensorParallelInputs, "
    "CheckpointCoverage, SourceCheckpoint, FrozenParameters, Structure, TiedParameters and PipelineOutputs judge the "
    "findings of mih's session checks, which run inside mih's trainer on its live state (a findings file of another "
    "writer is not evidence of them); CommVolume, PipelineSchedule, FsdpUnits, ActivationCheckpointEquivalence, "
    "CheckpointRoundTrip, Resume, StateInvariants, ModuleParity, ModalityGradients and MatchesOriginal judge records "
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

struct ForeignCase {
  fs::path dir, reference;
  std::string spec, name, dtype, writer;
};

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

// NumericParity on a foreign case: compare_evidence at the binary's tolerance for its dtype.
void numeric_parity(const ForeignCase& c, double tolerance) {
  CompareOptions o;
  o.tolerance = tolerance;
  const Comparison cmp = compare_evidence(c.reference, c.dir, o);
  double worst = 0;
  std::string worst_name;
  int64_t first = -1, last = -1;
  for (const Measurement& m : cmp.measurements) {
    if (m.relative_error > worst) {
      worst = m.relative_error;
      worst_name = m.kind + " '" + m.name + "' step " + std::to_string(m.step) + " " + m.stage;
    }
    first = first < 0 ? m.step : std::min(first, m.step);
    last = std::max(last, m.step);
  }
  if (!cmp.passed()) {
    const Localization where = localize(cmp);
    ADD_FAILURE() << c.spec << "/" << c.name << " (" << c.writer << ") against " << c.reference.filename().string()
                  << ", tolerance " << tolerance << " (" << c.dtype << ", this mih's cross-topology default):\n  "
                  << cmp.summary() << "\n  localized to '" << where.blamed << "': " << where.reason;
    return;
  }
  std::printf("  examined %lld quantities (loss, grad norms, lr, watched tensors, module activations) over steps %lld-%lld "
              "against %s: largest relative error %.3g (%s), tolerance %g (%s)\n",
              static_cast<long long>(cmp.measurements.size()), static_cast<long long>(first),
              static_cast<long long>(last), c.reference.filename().string().c_str(), worst,
              worst_name.empty() ? "none" : worst_name.c_str(), tolerance, c.dtype.c_str());
  EXPECT_GT(cmp.measurements.size(), 0u) << "nothing was compared";
}

// InputIdentity on a foreign case: every step of the reference's global batch, field by field.
void same_inputs(const ForeignCase& c) {
  const EvidenceDir mine = EvidenceDir::open_existing(c.dir), theirs = EvidenceDir::open_existing(c.reference);
  // Rows by step; two rows of one step are not one run's (the second would hide the first).
  auto by_step = [](const EvidenceDir& d) {
    std::map<int64_t, json> out;
    for (const json& row : d.read_jsonl(layout::kInputIdentity)) {
      const int64_t step = row.at("step").get<int64_t>();
      MIH_CHECK_CODE(out.emplace(step, row).second, Code::kFailedPrecondition, "evidence file ",
                     (d.root() / layout::kInputIdentity).string(), " has two rows for step ", step);
    }
    return out;
  };
  std::error_code ec;
  ASSERT_TRUE(fs::exists(c.dir / layout::kInputIdentity, ec) && fs::exists(c.reference / layout::kInputIdentity, ec))
      << c.spec << "/" << c.name << ": " << (c.dir / layout::kInputIdentity).string() << " and "
      << (c.reference / layout::kInputIdentity).string() << " must both exist (one side recorded its inputs)";
  const std::map<int64_t, json> ref = by_step(theirs), seen = by_step(mine);
  int steps = 0;
  for (const auto& [step, row] : seen) {
    const auto it = ref.find(step);
    if (it == ref.end()) {
      ADD_FAILURE() << c.spec << "/" << c.name << ": step " << step << " has no input identity in the reference "
                    << c.reference.string();
      continue;
    }
    ++steps;
    // Every part: the global hash, each field's, the row count (a field edited under an
    // unchanged global hash is not the same batch).
    if (row.at("global") == it->second.at("global") && row.at("fields") == it->second.at("fields") &&
        row.at("rows") == it->second.at("rows")) {
      continue;
    }
    std::string fields;
    for (const auto& [field, hash] : row.at("fields").items()) {
      const json& other = it->second.at("fields");
      if (!other.contains(field) || other[field] != hash) fields += (fields.empty() ? "" : ", ") + field;
    }
    for (const auto& [field, hash] : it->second.at("fields").items()) {
      if (!row.at("fields").contains(field)) fields += (fields.empty() ? "" : ", ") + field + " (missing)";
    }
    ADD_FAILURE() << c.spec << "/" << c.name << " step " << step << ": the global batch differs from "
                  << c.reference.filename().string() << "'s in " << (fields.empty() ? "its row count" : fields)
                  << " (open " << (c.dir / layout::kInputIdentity).string() << ")";
  }
  ASSERT_GT(steps, 0) << c.spec << "/" << c.name << ": no step in common with the reference's input identity";
  std::printf("  examined the global batch of %d step(s) against %s\n", steps, c.reference.filename().string().c_str());
}

// The cases/runtime/replicas_step<k>.json files of `dir` whose records carry digests, by step.
std::map<int64_t, fs::path> replica_files(const fs::path& dir) {
  std::map<int64_t, fs::path> out;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir / layout::kRuntimeDir, ec)) {
    const std::string name = f.path().filename().string();
    const std::string prefix = fs::path(layout::replicas_step(0)).filename().string();  // "replicas_step0.json"
    const std::string head = prefix.substr(0, prefix.find('0'));
    if (name.rfind(head, 0) != 0) continue;
    const json j = read_json_file(f.path());
    if (j.contains("step") && j["step"].is_number_integer()) out[j["step"].get<int64_t>()] = f.path();
  }
  return out;
}

// ReplicaConsistency on a foreign case: after every step's optimizer, every rank's copy of
// every parameter has the same bytes (the digests each rank computed of its own copy).
void replicas_agree(const ForeignCase& c) {
  int64_t compared = 0, steps = 0;
  for (const auto& [step, file] : replica_files(c.dir)) {
    ++steps;
    const json j = read_json_file(file);
    if (!j.contains("parameters") || !j["parameters"].is_object()) continue;
    for (const auto& [fqn, record] : j["parameters"].items()) {
      if (!record.is_object() || !record.contains("digests") || !record["digests"].is_array()) continue;
      const json& d = record["digests"];
      if (d.size() < 2) continue;
      ++compared;
      std::string differ;
      for (size_t r = 1; r < d.size(); ++r) {
        if (d[r] != d[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
      }
      EXPECT_TRUE(differ.empty()) << c.spec << "/" << c.name << ": parameter '" << fqn << "' after step " << step
                                  << "'s optimizer: rank(s) " << differ << " hold other bytes than rank 0 (open "
                                  << file.string() << ")";
    }
  }
  ASSERT_GT(compared, 0) << c.spec << "/" << c.name << ": no parameter was held by two ranks or more in the replica "
                         << "records under " << (c.dir / layout::kRuntimeDir).string();
  std::printf("  examined %lld replicated parameter record(s) over %lld step(s)\n", static_cast<long long>(compared),
              static_cast<long long>(steps));
}

}  // namespace

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
    ++writers[writer];
  }
  const spec::Tolerances defaults;
  int registered = 0;
  for (const ForeignCase& c : cases) {
    if (c.reference.empty()) continue;
    MIH_CHECK_CODE(is_case_dir(c.reference), Code::kFailedPrecondition, "evidence ", c.dir.string(),
                   " is compared with ", c.reference.filename().string(), " (environment.json case.compare_to), and ",
                   c.reference.string(), " holds no case directory: write the reference's evidence there");
    const ForeignCase ref = read_case(c.reference);
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
    // Where the writer recorded every rank's copy (more than one rank), those copies.
    bool digests = false;
    for (const auto& [step, file] : replica_files(c.dir)) {
      const json j = read_json_file(file);
      if (!j.contains("parameters") || !j["parameters"].is_object()) continue;
      for (const auto& [fqn, record] : j["parameters"].items()) {
        digests = digests || (record.is_object() && record.contains("digests") && record["digests"].is_array() &&
                              record["digests"].size() > 1);
      }
    }
    if (digests) {
      register_test("Foreign/ReplicaConsistency", "ReplicasAgreeAfterEveryStep/" + c.spec + "/" + c.name,
                    [c] { replicas_agree(c); });
      ++registered;
    }
  }
  MIH_CHECK_CODE(registered > 0, Code::kFailedPrecondition, "mih check: no case of ", evidence.string(),
                 " names a reference (environment.json case.compare_to): there is nothing to check it against");
  if (progress) {
    std::string names;
    for (const auto& [w, n] : writers) names += (names.empty() ? "" : ", ") + w + " (" + std::to_string(n) + ")";
    std::fprintf(stderr, "mih check: %zu case director%s written by %s, valid under %s version %d; %d test(s) of "
                 "measured evidence (NumericParity, InputIdentity, ReplicaConsistency where each rank's copies are recorded), at "
                 "this mih's tolerances; %s\n",
                 cases.size(), cases.size() == 1 ? "y" : "ies", names.c_str(), contract::kName, contract::kVersion,
                 registered, kNotInstantiated);
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
