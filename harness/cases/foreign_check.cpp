// `mih check` of another writer's evidence: the contract first, then the suites of measured
// evidence registered at run time (GoogleTest's RegisterTest), one per case and reference.
#include "harness/cases/foreign_check.h"

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
#include "harness/base/evidence_layout.h"
#include "harness/base/json_fields.h"
#include "harness/base/strings.h"
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
  // A resumed run (its load phase captured the checkpoint) starts at the step it resumed at.
  std::error_code ec;
  if (fs::exists(c.dir / layout::kRoundtripLoad, ec)) {
    const json loaded = read_json_file(c.dir / layout::kRoundtripLoad);
    if (loaded.contains("next_step") && loaded["next_step"].is_number_integer()) o.first_step = loaded["next_step"].get<int64_t>();
  }
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

// The cases/runtime/<prefix><k>.json files of `dir` (replicas_step, gradient_replicas_step)
// whose records carry digests, by step.
std::map<int64_t, fs::path> replica_files(const fs::path& dir, const std::string& prefix) {
  std::map<int64_t, fs::path> out;
  std::error_code ec;
  const std::string example =
      fs::path(prefix == "replicas_step" ? layout::replicas_step(0) : layout::gradient_replicas_step(0)).filename().string();
  const std::string head = example.substr(0, example.find('0'));  // "replicas_step"
  for (const auto& f : fs::directory_iterator(dir / layout::kRuntimeDir, ec)) {
    const std::string name = f.path().filename().string();
    if (name.rfind(head, 0) != 0 || name.size() <= head.size() || !std::isdigit(static_cast<unsigned char>(name[head.size()]))) continue;
    const json j = read_json_file(f.path());
    if (j.contains("step") && j["step"].is_number_integer()) out[j["step"].get<int64_t>()] = f.path();
  }
  return out;
}

// The ranks holding each piece of a replica record, by box ("" when the writer recorded no
// boxes: every rank holds the whole tensor), in rank order.
std::map<std::string, std::vector<size_t>> holders(const json& record) {
  std::map<std::string, std::vector<size_t>> out;
  if (!record.is_object() || !record.contains("digests") || !record["digests"].is_array()) return out;
  const json& d = record["digests"];
  const bool boxed = record.contains("boxes") && record["boxes"].is_array();
  MIH_CHECK_CODE(!boxed || record["boxes"].size() == d.size(), Code::kFailedPrecondition,
                 "a replica record has ", d.size(), " digests and ", record["boxes"].size(), " boxes: one of each per rank");
  for (size_t r = 0; r < d.size(); ++r) out[boxed ? record["boxes"][r].get<std::string>() : ""].push_back(r);
  return out;
}

// Whether some piece of some record of `files` is held by two ranks or more.
bool any_compared(const std::map<int64_t, fs::path>& files) {
  for (const auto& [step, file] : files) {
    const json j = read_json_file(file);
    if (!j.contains("parameters") || !j["parameters"].is_object()) continue;
    for (const auto& [fqn, record] : j["parameters"].items()) {
      for (const auto& [box, ranks] : holders(record)) {
        if (ranks.size() > 1) return true;
      }
    }
  }
  return false;
}

// The ranks among `ranks` whose digest differs from the first one's, as text ("1, 3").
std::string differing(const json& digests, const std::vector<size_t>& ranks) {
  std::string out;
  for (size_t i = 1; i < ranks.size(); ++i) {
    if (digests[ranks[i]] != digests[ranks[0]]) out += (out.empty() ? "" : ", ") + std::to_string(ranks[i]);
  }
  return out;
}

// One failure per step of a check over many tensors: the first few, and how many more.
void fail_step(const ForeignCase& c, int64_t step, const std::vector<std::string>& items, const std::string& what,
               const fs::path& file) {
  if (items.empty()) return;
  std::string text;
  for (size_t i = 0; i < items.size() && i < 6; ++i) text += "\n    " + items[i];
  if (items.size() > 6) text += "\n    and " + std::to_string(items.size() - 6) + " more";
  ADD_FAILURE() << c.spec << "/" << c.name << " step " << step << ": " << what << " (" << items.size() << "):" << text
                << "\n  (open " << file.string() << ")";
}

// ReplicaConsistency on a foreign case: after every step's optimizer, every rank holding a
// piece of a parameter (the same box; every rank when the writer records no boxes) holds the
// same bytes (the digests each rank computed of its own copy).
void replicas_agree(const ForeignCase& c) {
  int64_t compared = 0, steps = 0;
  for (const auto& [step, file] : replica_files(c.dir, "replicas_step")) {
    ++steps;
    const json j = read_json_file(file);
    if (!j.contains("parameters") || !j["parameters"].is_object()) continue;
    std::vector<std::string> bad;
    for (const auto& [fqn, record] : j["parameters"].items()) {
      for (const auto& [box, ranks] : holders(record)) {
        if (ranks.size() < 2) continue;
        ++compared;
        const std::string differ = differing(record["digests"], ranks);
        if (!differ.empty()) {
          bad.push_back("'" + fqn + "'" + (box.empty() ? "" : " piece " + box) + ": rank(s) " + differ +
                        " hold other bytes than rank " + std::to_string(ranks[0]));
        }
      }
    }
    fail_step(c, step, bad, "parameter copies differ after the optimizer", file);
  }
  ASSERT_GT(compared, 0) << c.spec << "/" << c.name << ": no parameter piece was held by two ranks or more in the replica "
                         << "records under " << (c.dir / layout::kRuntimeDir).string();
  std::printf("  examined %lld replicated parameter piece(s) over %lld step(s)\n", static_cast<long long>(compared),
              static_cast<long long>(steps));
}

// GradientSync on a foreign case: after the trainer's synchronization, every rank holding a
// piece of a gradient holds the same bytes (a gradient left unreduced over an axis whose ranks
// saw other rows differs between them), and every axis a gradient must be reduced over moved
// bytes in that step (the metrics' comm_bytes, from the trainer's ledgered collectives).
void gradients_agree(const ForeignCase& c) {
  std::map<int64_t, json> comm;
  for (const json& row : EvidenceDir::open_existing(c.dir).read_jsonl(layout::kMetrics)) {
    comm[row.at("step").get<int64_t>()] = row.value("comm_bytes", json::object());
  }
  // The degree of each axis (config.resolved.json): a reduction over a 1-rank axis moves nothing.
  std::error_code ec;
  ASSERT_TRUE(fs::exists(c.dir / layout::kConfigResolved, ec))
      << c.spec << "/" << c.name << ": " << (c.dir / layout::kConfigResolved).string()
      << " is missing: GradientSync reads each axis's degree from it";
  const json config = read_json_file(c.dir / layout::kConfigResolved);
  auto degree = [&](const std::string& axis) {
    return config.is_object() && config.contains(axis) && config[axis].is_number_integer() ? config[axis].get<int64_t>() : 1;
  };
  int64_t compared = 0, steps = 0, reductions = 0;
  std::set<std::string> domains;
  for (const auto& [step, file] : replica_files(c.dir, "gradient_replicas_step")) {
    ++steps;
    const json j = read_json_file(file);
    std::vector<std::string> bad;
    for (const auto& [fqn, record] : j.at("parameters").items()) {
      std::string domain;
      for (const json& axis : record.at("grad_domain")) {
        domain += (domain.empty() ? "" : ", ") + axis.get<std::string>();
        if (degree(axis.get<std::string>()) < 2) continue;
        domains.insert(axis.get<std::string>());
        const auto it = comm.find(step);
        const bool moved = it != comm.end() && it->second.value(axis.get<std::string>(), int64_t{0}) > 0;
        ++reductions;
        EXPECT_TRUE(moved)
            << c.spec << "/" << c.name << ": parameter '" << fqn << "' must have its gradient reduced over "
            << axis.get<std::string>() << ", and no collective on " << axis.get<std::string>() << " moved a byte at step "
            << step << " (" << (c.dir / layout::kMetrics).string() << " comm_bytes)";
      }
      for (const auto& [box, ranks] : holders(record)) {
        if (ranks.size() < 2) continue;
        ++compared;
        const std::string differ = differing(record["digests"], ranks);
        if (!differ.empty()) {
          bad.push_back("the gradient of '" + fqn + "'" + (box.empty() ? "" : " piece " + box) + ": rank(s) " + differ +
                        " hold another than rank " + std::to_string(ranks[0]) + " (declared reduced over: " +
                        (domain.empty() ? "no axis" : domain) + ")");
        }
      }
    }
    fail_step(c, step, bad, "gradient copies differ after the trainer's synchronization (a reduction skipped, or over "
              "the wrong group)", file);
  }
  ASSERT_GT(compared + reductions, 0)
      << c.spec << "/" << c.name << ": no gradient piece held by two ranks and no declared reduction to check";
  std::printf("  examined %lld replicated gradient piece(s) over %lld step(s), and %lld declared reduction(s) of a "
              "gradient over an axis whose collectives moved bytes that step (axes: %s)\n",
              static_cast<long long>(compared), static_cast<long long>(steps), static_cast<long long>(reductions),
              domains.empty() ? "none" : mih::join(std::vector<std::string>(domains.begin(), domains.end()), ", ").c_str());
}

// CheckpointRoundTrip on a foreign case: what the load restored equals what the save saved,
// tensor by tensor (full tensors' SHA-256 and shapes), and the step it resumes at.
void checkpoint_round_trip(const ForeignCase& c) {
  const fs::path saved = c.dir / layout::before_save(layout::kRoundtripSave), loaded = c.dir / layout::kRoundtripLoad;
  std::error_code ec;
  ASSERT_TRUE(fs::exists(saved, ec) && fs::exists(loaded, ec))
      << c.spec << "/" << c.name << ": " << saved.string() << " and " << loaded.string()
      << " must both exist (the save phase's capture_checkpoint_payload(\"save\") and the load phase's \"load\")";
  const json a = read_json_file(saved), b = read_json_file(loaded);
  EXPECT_EQ(a.at("next_step"), b.at("next_step")) << c.spec << "/" << c.name << ": the load resumes at another step";
  int64_t same = 0;
  for (const auto& [name, t] : a.at("tensors").items()) {
    if (!b.at("tensors").contains(name)) {
      ADD_FAILURE() << c.spec << "/" << c.name << ": '" << name << "' was saved and not restored (" << loaded.string() << ")";
      continue;
    }
    const json& u = b.at("tensors")[name];
    if (u == t) {
      ++same;
      continue;
    }
    ADD_FAILURE() << c.spec << "/" << c.name << ": '" << name << "' restored " << (u.at("shape") == t.at("shape") ? "other values" : "another shape")
                  << " than were saved (" << saved.string() << " against " << loaded.string() << ")";
  }
  for (const auto& [name, t] : b.at("tensors").items()) {
    if (!a.at("tensors").contains(name)) ADD_FAILURE() << c.spec << "/" << c.name << ": '" << name << "' was restored, never saved";
  }
  ASSERT_GT(same, 0) << c.spec << "/" << c.name << ": no tensor was saved";
  std::printf("  examined %lld tensor(s) saved and restored, resuming at step %s\n", static_cast<long long>(same),
              a.at("next_step").dump().c_str());
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
  std::set<std::string> suites;  // the Foreign suites registered for some case
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
