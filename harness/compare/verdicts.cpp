// The conformance suites' verdicts over evidence (see verdicts.h).
#include "harness/compare/verdicts.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>

#include "harness/findings/codes.h"
#include "harness/base/error.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/base/reduction_paths.h"
#include "harness/evidence/evidence_store.h"

namespace mih::verdicts {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string rel_path(const CaseEvidence& ev, const std::string& relative) { return (ev.dir() / relative).string(); }

std::string short_json(const json& j, size_t max = 300) {
  std::string s = j.dump();
  if (s.size() > max) s = s.substr(0, max) + "...";
  return s;
}

// A number of the evidence as %.3g; JSON has no NaN or infinity, so those were written as null.
std::string number(const json& v) {
  if (!v.is_number()) return "not finite";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v.get<double>());
  return buf;
}

int64_t numel(const json& shape) {
  int64_t n = 1;
  for (const auto& d : shape) n *= d.get<int64_t>();
  return n;
}

int64_t element_size(const std::string& dtype) {
  if (dtype == "float64" || dtype == "int64") return 8;
  if (dtype == "bfloat16" || dtype == "float16") return 2;
  return 4;
}

}  // namespace

CaseEvidence::CaseEvidence(fs::path dir) : dir_(std::move(dir)) {
  if (!fs::is_directory(dir_)) {
    MIH_THROW(Code::kFailedPrecondition, "evidence directory ", dir_.string(),
              " does not exist: run the case first (mih run, or the conformance binary without --verify-only), or "
              "point --evidence-root at the run that produced it");
  }
}

bool CaseEvidence::has(const std::string& relative) const { return fs::exists(dir_ / relative); }

const json& CaseEvidence::json(const std::string& relative) const {
  auto it = json_.find(relative);
  if (it != json_.end()) return it->second;
  const fs::path file = dir_ / relative;
  std::string text;
  if (!read_file(file, &text)) {
    MIH_THROW(Code::kFailedPrecondition, "evidence file ", file.string(), " is missing from ", dir_.string(),
              ": the case did not finish (see its integration_state.json and run/*/logs), or this directory "
              "belongs to another run or version of mih; rerun the case");
  }
  nlohmann::json j;
  try {
    j = parse_json_strict(text, "evidence file " + file.string());
  } catch (const Error& e) {
    MIH_THROW(Code::kFailedPrecondition, e.message(), ": it was truncated or edited; rerun the case");
  }
  return json_.emplace(relative, std::move(j)).first->second;
}

const std::vector<json>& CaseEvidence::jsonl(const std::string& relative) const {
  auto it = jsonl_.find(relative);
  if (it != jsonl_.end()) return it->second;
  const fs::path file = dir_ / relative;
  std::string text;
  if (!read_file(file, &text)) {
    MIH_THROW(Code::kFailedPrecondition, "evidence file ", file.string(), " is missing from ", dir_.string(),
              ": the case did not finish, or this directory belongs to another run; rerun the case");
  }
  // mih writes whole lines: a last line without its newline is a damaged file, not data.
  MIH_CHECK_CODE(text.empty() || text.back() == '\n', Code::kFailedPrecondition, "evidence file ", file.string(),
                 " ends in the middle of a line: it was truncated or edited; rerun the case");
  std::vector<nlohmann::json> rows;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    nlohmann::json row;
    std::string problem;
    MIH_CHECK_CODE(parse_json_bounded(line, &row, &problem), Code::kFailedPrecondition, "evidence file ",
                   file.string(), " line ", n, " is not JSON (", problem, "): it was truncated or edited; rerun the case");
    rows.push_back(std::move(row));
  }
  return jsonl_.emplace(relative, std::move(rows)).first->second;
}

const ParallelConfig& CaseEvidence::config() const {
  if (!config_) {
    // config.resolved.json is the ParallelConfig's fields plus the trainer's options.
    nlohmann::json parallel = nlohmann::json::object();
    const nlohmann::json empty = ParallelConfig{};
    for (const auto& [key, value] : json("config.resolved.json").items()) {
      if (empty.contains(key)) parallel[key] = value;
    }
    config_ = with_context("config.resolved.json of " + dir_.string(), [&] { return parallel.get<ParallelConfig>(); });
  }
  return *config_;
}

const spec::Case& CaseEvidence::resolved_case() const {
  if (!case_) {
    const auto& env = json("environment.json");
    MIH_CHECK(env.contains("case"), "evidence ", rel_path(*this, "environment.json"),
              " has no \"case\": it was not written by the conformance case runner (mih run)");
    try {
      case_ = env["case"].get<spec::Case>();
    } catch (const Error& e) {
      MIH_THROW(Code::kFailedPrecondition, "evidence ", rel_path(*this, "environment.json"), ": its \"case\" is not ",
                "the one mih writes (", e.message(), "): the file was edited or is of another tool; rerun the case");
    }
  }
  return *case_;
}


Verdict no_error_findings(const CaseEvidence& ev, const std::vector<std::string>& codes) {
  // The error findings of these codes first (of the case, and of the save phase of a resume
  // case, whose checks ran in another process); then, with none, the proof that the checks
  // emitting them ran: no finding from a check that never looked is not a pass.
  std::ostringstream out;
  int n = 0;
  std::vector<std::string> files = {"check/findings.json"};
  if (ev.has("before_save/check/findings.json")) files.push_back("before_save/check/findings.json");
  for (const auto& file : files) {
    for (const auto& f : ev.json(file).value("findings", json::array())) {
      if (f.value("severity", "error") != "error") continue;
      if (std::find(codes.begin(), codes.end(), f.value("code", "")) == codes.end()) continue;
      if (++n > 5) continue;
      out << "\n  " << f.value("code", "") << " " << f.value("owner", "") << ": " << f.value("message", "")
          << (file == files[0] ? "" : " (in the save phase)");
      if (f.contains("facts") && !f["facts"].empty()) out << "\n    facts: " << short_json(f["facts"]);
      if (!f.value("remediation", "").empty()) out << "\n    fix: " << f.value("remediation", "");
    }
  }
  if (n > 0) {
    return Verdict::fail(std::to_string(n) + " error finding(s):" + out.str() +
                         (n > 5 ? "\n  ... and " + std::to_string(n - 5) + " more" : "") + "\n  (open " +
                         rel_path(ev, "check/findings.json") + ")");
  }
  const json runs = ev.json("check/findings.json").value("checks", json::object());
  std::vector<std::string> examined;
  for (const auto& code : codes) {
    const std::string check(codes::check_of(code));
    MIH_INTERNAL_ASSERT(!check.empty(), "finding code ", code, " has no emitting check in codes::kAllCodes");
    if (std::find(examined.begin(), examined.end(), check) != examined.end()) continue;
    if (!runs.contains(check)) {
      return Verdict::fail("check " + check + " did not run on this case (" + code +
                           " is its finding): check/findings.json records no run of it, so the absence of findings "
                           "proves nothing; the session never reached it, the training backend skips the hook that "
                           "feeds it, or the evidence predates check records; rerun the case (open " +
                           rel_path(ev, "check/findings.json") + ")");
    }
    const json& r = runs[check];
    if (r.value("examined", int64_t{0}) <= 0) {
      return Verdict::fail("check " + check + " ran " + std::to_string(r.value("runs", int64_t{0})) +
                           " time(s) and examined no " + r.value("unit", std::string("item")) +
                           ": it checked nothing on this case (open " + rel_path(ev, "check/findings.json") + ")");
    }
    examined.push_back(check);
  }
  std::string what;
  for (const auto& check : examined) {
    what += (what.empty() ? "" : "; ") + check + " examined " + std::to_string(runs[check].value("examined", int64_t{0})) +
            " " + runs[check].value("unit", std::string()) + " in " + std::to_string(runs[check].value("runs", int64_t{0})) +
            " run(s)";
  }
  return Verdict::pass(what);
}

double case_tolerance(const CaseEvidence& ev) {
  const auto& tol = ev.json("spec.resolved.json").at("tolerances");
  const std::string dtype = dtype_name(ev.config().dtype);
  std::string profile = ev.resolved_case().kind == spec::CaseKind::kResume ? "same_topology" : "cross_topology";
  if (ev.config().micro_batches > 1 && tol.contains("grad_accumulation")) profile = "grad_accumulation";
  MIH_CHECK(tol.contains(profile) && tol[profile].contains(dtype), "spec.resolved.json of ", ev.dir().string(),
            " declares no ", profile, " tolerance for dtype ", dtype, ": add it to the spec's Tolerances");
  return tol[profile][dtype].get<double>();
}

std::string not_comparable_reason(const CaseEvidence& ev) {
  const auto& tol = ev.json("spec.resolved.json").at("tolerances");
  if (ev.config().micro_batches <= 1 || tol.contains("grad_accumulation")) return "";
  return tol.value("grad_accumulation_reason", "");
}

bool calibrated_lane(const CaseEvidence& candidate) { return candidate.config().dtype != DType::kFloat64; }

Calibration lane_calibration(const CaseEvidence& lane_reference, const CaseEvidence& noise_twin,
                             const CaseEvidence& candidate, double k_override) {
  const std::string dtype = dtype_name(candidate.config().dtype);
  for (const CaseEvidence* side : {&lane_reference, &noise_twin}) {
    MIH_CHECK(side->config().dtype == candidate.config().dtype, "calibration of ", candidate.dir().string(), ": ",
              side->dir().string(), " is a ", dtype_name(side->config().dtype), " case, the candidate ", dtype,
              ": calibrate from the lane reference and noise twin of the candidate's own matrix");
  }
  const auto& tol = candidate.json("spec.resolved.json").at("tolerances");
  Calibration settings;
  for (const auto& [key, field] : {std::pair{"noise_k", &Calibration::k}, std::pair{"noise_k_update", &Calibration::k_update},
                                   std::pair{"noise_floor_eps", &Calibration::floor_eps}}) {
    MIH_CHECK(tol.contains(key) && tol[key].is_number(), "spec.resolved.json of ", candidate.dir().string(),
              " declares no tolerances.", key, ": the evidence predates calibrated lanes; rerun the case");
    settings.*field = tol[key].get<double>();
  }
  if (k_override >= 0) settings.k = settings.k_update = k_override;
  // The lane's own reference and twin are compared with the float64 oracle.
  if (candidate.resolved_case().compare_to == "Reference") {
    MIH_CHECK(tol.contains("noise_oracle_factor") && tol["noise_oracle_factor"].is_number(), "spec.resolved.json of ",
              candidate.dir().string(), " declares no tolerances.noise_oracle_factor; rerun the case");
    settings.factor = tol["noise_oracle_factor"].get<double>();
  }
  CompareOptions o;
  o.tolerance = std::numeric_limits<double>::max();  // every quantity measured, none diverges
  const Comparison twin = compare_evidence(lane_reference.dir(), noise_twin.dir(), o);
  return calibrate(twin, dtype, settings);
}

json calibration_evidence(const Calibration& cal, const Comparison& c) {
  json rows = json::array();
  double worst = 0;
  std::string worst_at;
  for (const auto& m : c.measurements) {
    const double noise = cal.noise_of(m), tolerance = cal.tolerance_of(m);
    const double margin = tolerance > 0 ? m.relative_error / tolerance : (m.relative_error > 0 ? INFINITY : 0);
    json row = {{"kind", m.kind},
                {"name", m.name},
                {"step", m.step},
                {"stage", m.stage},
                {"error", m.relative_error},
                {"noise", noise < 0 ? json() : json(noise)},
                {"own_noise", cal.noise.count(m.key()) ? json(cal.noise.at(m.key())) : json()},
                {"tolerance", tolerance},
                {"error_over_noise", noise > 0 ? json(m.relative_error / noise) : json()},
                {"error_over_tolerance", std::isfinite(margin) ? json(margin) : json()},
                {"passed", m.relative_error <= tolerance}};
    rows.push_back(std::move(row));
    if (!(margin <= worst)) {
      worst = margin;
      worst_at = m.kind + " '" + m.name + "' at step " + std::to_string(m.step) + ", " + m.stage;
    }
  }
  return {{"dtype", cal.dtype},
          {"epsilon", cal.epsilon},
          {"k", cal.k},
          {"k_update", cal.k_update},
          {"floor_eps", cal.floor_eps},
          {"master_epsilon", cal.master_epsilon},
          {"floor", cal.floor_eps * cal.epsilon},
          {"master_floor", cal.floor_eps * cal.master_epsilon},
          {"factor", cal.factor},
          {"rule", "tolerance = factor x max(k x noise, floor_eps x epsilon); epsilon: the lane dtype's for activations, "
                   "master_epsilon (float32 in the autocast lanes) for the rest; noise = max(the quantity's own noise "
                   "between the lane's reference and its noise twin, the median noise of its kind at that step and "
                   "stage); a parameter after an update (after_optimizer, model_before from step 1): k_update and the "
                   "stage's largest noise; errors and noise relative to the reference's scale"},
          {"passed", c.passed()},
          {"quantities", rows},
          {"max_error_over_tolerance", std::isfinite(worst) ? json(worst) : json()},
          {"worst", worst_at}};
}

Verdict parity(const CaseEvidence& reference, const CaseEvidence& candidate, Quantity quantity, double tolerance,
               int64_t first_step, const Calibration* calibration, bool record) {
  CompareOptions o;
  o.tolerance = tolerance;
  o.first_step = first_step;
  o.calibration = calibration;
  const std::string reason = not_comparable_reason(candidate);
  if (!reason.empty()) return Verdict::skip("the spec declares gradient accumulation not comparable: " + reason);
  const Comparison c = compare_evidence(reference.dir(), candidate.dir(), o);
  if (calibration && record) {
    json j = calibration_evidence(*calibration, c);
    j["reference"] = reference.dir().filename().string();
    EvidenceDir(candidate.dir()).write_json("compare/calibration.json", j);
  }
  auto wanted = [&](const Divergence& d) {
    // A step one side lacks is missing from every quantity of that step.
    if (d.kind == "metric" && d.name == "step" && quantity != Quantity::kTensors) return true;
    switch (quantity) {
      case Quantity::kInput: return d.kind == "input";
      case Quantity::kLoss: return d.kind == "metric" && d.name == "loss";
      case Quantity::kGradNorms: return d.kind == "metric" && d.name.rfind("grad_norm", 0) == 0;
      case Quantity::kLr: return d.kind == "metric" && d.name == "lr";
      case Quantity::kTensors: return d.kind == "tensor" || d.kind == "activation";
    }
    return false;
  };
  std::vector<const Divergence*> hits;
  for (const auto& d : c.divergences) {
    if (wanted(d)) hits.push_back(&d);
  }
  if (hits.empty()) return Verdict::pass();
  // Where the fault is, from every quantity of the comparison (the loss verdict of a forward
  // bug names the module whose output diverged first).
  const Localization where = localize(c, first_step > 0);
  std::string msg = "localized to '" + where.blamed + "': " + where.reason + "\n  first divergence from " +
                    reference.dir().filename().string() + ": " + hits[0]->message;
  // The first offender in forward order is where to start; the largest error at that step and
  // stage is often the cause (a gradient that flows back into every earlier layer).
  const Divergence* largest = hits[0];
  for (const Divergence* d : hits) {
    if (d->step == hits[0]->step && d->stage == hits[0]->stage && d->missing_from.empty() &&
        (largest->missing_from.size() > 0 || d->relative_error > largest->relative_error)) {
      largest = d;
    }
  }
  if (largest != hits[0]) {
    std::ostringstream rel;
    rel << largest->relative_error;
    msg += "\n  largest at that step and stage: " + largest->name + " (relative error " + rel.str() + ")";
  }
  if (hits.size() > 1) {
    msg += "\n  (" + std::to_string(hits.size() - 1) + " more of this kind; the next: " + hits[1]->name + " at step " +
           std::to_string(hits[1]->step) + (hits[1]->stage == "metrics" ? "" : ", " + hits[1]->stage) + ")";
  }
  return Verdict::fail(msg);
}

Localization blame(const CaseEvidence& ev, const std::string& suite, const std::string& message) {
  const std::string opening = "localized to '";
  if (message.rfind(opening, 0) == 0) {
    const auto end = message.find("': ", opening.size());
    if (end != std::string::npos) {
      const auto line = message.find('\n');
      return {message.substr(opening.size(), end - opening.size()), message.substr(end + 3, line - end - 3)};
    }
  }
  static const std::map<std::string, std::string> kPlaces = {
      {"InputIdentity", "data"},         {"DataContract", "data"},
      {"CpReplicatedInputs", "data"},    {"TensorParallelInputs", "data"},
      {"PipelineOutputs", "data"},
      {"CheckpointCoverage", "checkpoint"}, {"CheckpointRoundTrip", "checkpoint"},
      {"Resume", "checkpoint"},          {"SourceCheckpoint", "checkpoint"},
      {"OptimizerLayout", "optimizer"},  {"FrozenParameters", "optimizer"},
      // GradientSync names the parameter reduced over the wrong axes: its finding's owner.
      {"TensorParallelGradients", "grad_sync"},
      {"CommVolume", "grad_sync"}};
  auto it = kPlaces.find(suite);
  if (it != kPlaces.end()) return {it->second, "the place " + suite + " examines"};
  if (ev.has("check/findings.json")) {
    std::set<std::string> parameters;
    if (ev.has("check/structure.json")) {
      for (const auto& p : ev.json("check/structure.json").value("parameters", json::array())) {
        if (p.is_object()) parameters.insert(p.value("fqn", ""));
      }
    }
    for (const auto& f : ev.findings()) {
      if (f.value("severity", "") != "error") continue;
      if (f.value("phase", "") == "checkpoint") return {"checkpoint", "finding " + f.value("code", "") + " at a checkpoint load"};
      const std::string owner = f.value("owner", ""), code = f.value("code", "");
      if (owner.empty()) continue;
      const json& facts = f.value("facts", json::object());
      // A declared tie that does not hold: the alias (the second of the pair) is the
      // parameter that lost the first's storage.
      if (facts.contains("tied") && facts["tied"].is_array() && facts["tied"].size() == 2 && facts["tied"][1].is_string()) {
        const std::string alias = facts["tied"][1].get<std::string>();
        return {module_of_parameter(alias), "finding " + code + ": the tied alias '" + alias + "' is not the parameter it "
                                            "is declared tied to"};
      }
      // Shared state: the module that published it.
      if (facts.contains("publishes") && facts["publishes"].is_array() && !facts["publishes"].empty() &&
          facts["publishes"][0].is_object() && facts["publishes"][0].contains("source")) {
        const std::string source = facts["publishes"][0].value("source", "");
        return {source, "finding " + code + ": shared state '" + owner + "' published by '" + source + "'"};
      }
      return {parameters.count(owner) ? module_of_parameter(owner) : owner, "the owner of finding " + code + " ('" + owner + "')"};
    }
  }
  return {"", "the failure names no place"};
}

Verdict fsdp_units_cover_parameters(const CaseEvidence& ev) {
  if (ev.config().dp_shard <= 1) return Verdict::skip("dp_shard is 1: no FSDP units");
  const auto& structure = ev.json("check/structure.json");
  const auto& units = ev.json("check/fsdp_units.json");
  std::map<std::string, std::string> unit_of;
  std::vector<std::string> problems;
  for (const auto& [unit, u] : units.items()) {
    const auto& dtypes = u.value("dtypes", json::array());
    if (dtypes.size() != 1) problems.push_back("unit '" + unit + "' holds " + short_json(dtypes) + " (one dtype and mesh expected)");
    for (const auto& p : u.value("parameters", json::array())) {
      const std::string fqn = p.get<std::string>();
      if (unit_of.count(fqn)) problems.push_back("parameter '" + fqn + "' in units '" + unit_of[fqn] + "' and '" + unit + "'");
      unit_of[fqn] = unit;
    }
  }
  for (const auto& p : structure.at("parameters")) {
    const std::string fqn = p.value("fqn", "");
    // FSDP-sharded: over dp_shard, or over edp for routed experts under ep.
    const bool sharded = p.contains("fsdp_rows") ||
                         (p.contains("placements") && p["placements"].contains("dp_shard") &&
                          p["placements"]["dp_shard"] != "Replicate()");
    if (sharded && !unit_of.count(fqn)) problems.push_back("sharded parameter '" + fqn + "' is in no FSDP unit");
    unit_of.erase(fqn);
  }
  for (const auto& [fqn, unit] : unit_of) problems.push_back("unit '" + unit + "' lists '" + fqn + "', which is no parameter");
  if (problems.empty()) return Verdict::pass();
  std::string msg = problems[0];
  for (size_t i = 1; i < std::min<size_t>(problems.size(), 5); ++i) msg += "\n  " + problems[i];
  return Verdict::fail(msg + "\n  (open " + rel_path(ev, "check/fsdp_units.json") + ")");
}

Verdict same_inputs_as_reference(const CaseEvidence& reference, const CaseEvidence& candidate) {
  const auto& a = candidate.jsonl("data/input_identity.jsonl");
  std::map<int64_t, const json*> ref;
  for (const auto& row : reference.jsonl("data/input_identity.jsonl")) ref[row.value("step", int64_t{-1})] = &row;
  int compared = 0;
  for (const auto& row : a) {
    const int64_t step = row.value("step", int64_t{-1});
    auto it = ref.find(step);
    if (it == ref.end()) continue;
    ++compared;
    if (row.value("global", "") == it->second->value("global", "")) continue;
    std::string fields;
    const json mine = row.value("fields", json::object()), theirs = it->second->value("fields", json::object());
    for (const auto& [name, hash] : mine.items()) {
      if (theirs.value(name, "") != hash.get<std::string>()) fields += (fields.empty() ? "" : ", ") + name;
    }
    for (const auto& [name, hash] : theirs.items()) {
      if (!mine.contains(name)) fields += (fields.empty() ? "" : ", ") + name + " (not seen)";
    }
    return Verdict::fail("the global batch of step " + std::to_string(step) + " differs from the reference's in field(s) " +
                         fields + ": rows were dropped, repeated or changed by the data split (rows " +
                         std::to_string(row.value("rows", 0)) + " vs " + std::to_string(it->second->value("rows", 0)) +
                         ") (open " + rel_path(candidate, "data/input_identity.jsonl") + ")");
  }
  if (compared == 0) {
    return Verdict::fail("no step in common with the reference in data/input_identity.jsonl (open " +
                         rel_path(candidate, "data/input_identity.jsonl") + ")");
  }
  return Verdict::pass();
}

Verdict checkpoint_round_trip(const CaseEvidence& ev) {
  if (!ev.resolved_case().save_config) {
    return Verdict::skip("the case does not save and load a checkpoint");
  }
  const std::string saved_file = "before_save/checkpoint/roundtrip_save.json", loaded_file = "checkpoint/roundtrip_load.json";
  const auto& saved = ev.json(saved_file);
  const auto& loaded = ev.json(loaded_file);
  std::vector<std::string> problems;
  if (saved.value("next_step", -1) != loaded.value("next_step", -2)) {
    problems.push_back("the step counter is " + std::to_string(loaded.value("next_step", -1)) + " after the load, " +
                       std::to_string(saved.value("next_step", -1)) + " at the save");
  }
  for (const auto& [name, hash] : saved.at("tensors").items()) {
    if (!loaded["tensors"].contains(name)) {
      problems.push_back("'" + name + "' was saved and is absent after the load");
    } else if (loaded["tensors"][name] != hash) {
      problems.push_back("'" + name + "' is not bit-exact after the load: sha256 " + hash.value("sha256", "").substr(0, 12) +
                         " saved, " + loaded["tensors"][name].value("sha256", "").substr(0, 12) + " loaded (shape " +
                         short_json(hash.value("shape", json::array())) + ")");
    }
  }
  for (const auto& [name, hash] : loaded.at("tensors").items()) {
    if (!saved["tensors"].contains(name)) problems.push_back("'" + name + "' exists after the load and was not saved");
  }
  if (problems.empty()) return Verdict::pass();
  std::string msg = problems[0];
  for (size_t i = 1; i < std::min<size_t>(problems.size(), 5); ++i) msg += "\n  " + problems[i];
  if (problems.size() > 5) msg += "\n  ... and " + std::to_string(problems.size() - 5) + " more";
  return Verdict::fail(msg + "\n  (open " + rel_path(ev, loaded_file) + " and " + rel_path(ev, saved_file) + ")");
}

Verdict resume_continues_step_count(const CaseEvidence& ev) {
  const spec::Case& c = ev.resolved_case();
  if (!c.save_config) return Verdict::skip("not a resume case");
  const int64_t at = c.resume_at, steps = c.steps;
  const auto& rows = ev.jsonl("cases/runtime/metrics.jsonl");
  std::vector<int64_t> seen;
  for (const auto& r : rows) seen.push_back(r.value("step", int64_t{-1}));
  std::vector<int64_t> expected(static_cast<size_t>(std::max<int64_t>(steps - at, 0)));
  std::iota(expected.begin(), expected.end(), at);
  if (seen == expected) return Verdict::pass();
  return Verdict::fail("after loading the checkpoint saved at step " + std::to_string(at) + " the run trained steps " +
                       json(seen).dump() + ", expected " + json(expected).dump() + " (open " +
                       rel_path(ev, "cases/runtime/metrics.jsonl") + ")");
}

Verdict modality_gradients(const CaseEvidence& ev) {
  const auto& modalities = ev.json("spec.resolved.json").value("modalities", json::array());
  if (modalities.empty()) return Verdict::skip("the spec declares no modality");
  Verdict v = no_error_findings(ev, {codes::kModalNoGradient});
  if (!v.passed()) return v;
  for (const auto& r : ev.jsonl("cases/runtime/metrics.jsonl")) {
    const std::string file = "cases/runtime/modality_gradients_step" + std::to_string(r.value("step", 0)) + ".json";
    if (!ev.has(file)) return Verdict::fail("no modality gradient evidence for step " + std::to_string(r.value("step", 0)) + ": " + rel_path(ev, file) + " is missing");
  }
  return Verdict::pass();
}

Verdict state_invariants(const CaseEvidence& ev) {
  const auto& declared = ev.json("spec.resolved.json").value("invariants", json::array());
  if (declared.empty()) return Verdict::skip("the spec declares no state invariant");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(ev.dir() / "check")) {
    const std::string n = e.path().filename().string();
    if (n.rfind("invariants_", 0) == 0) files.push_back("check/" + n);
  }
  if (fs::is_directory(ev.dir() / "cases/runtime")) {
    for (const auto& e : fs::directory_iterator(ev.dir() / "cases/runtime")) {
      const std::string n = e.path().filename().string();
      if (n.rfind("invariants_", 0) == 0) files.push_back("cases/runtime/" + n);
    }
  }
  if (ev.has("checkpoint/invariants_after_load.json")) files.push_back("checkpoint/invariants_after_load.json");
  std::sort(files.begin(), files.end());
  if (files.empty()) return Verdict::fail("the spec declares invariants and the case recorded none (no check/invariants_*.json in " + ev.dir().string() + ")");
  int checked = 0;
  for (const auto& file : files) {
    for (const auto& [name, result] : ev.json(file).items()) {
      ++checked;
      if (result.value("passed", false)) continue;
      // A materialization invariant names the weights it examined (the build's or a loaded checkpoint's).
      const std::string weights = result.contains("weights") && result["weights"].is_string()
                                      ? " on the weights of " + result["weights"].get<std::string>()
                                      : "";
      return Verdict::fail("invariant '" + name + "' failed" + weights + ": " +
                           short_json(result.value("facts", json::object()), 500) + " (open " + rel_path(ev, file) + ")");
    }
  }
  Verdict v = no_error_findings(ev, {codes::kInvarFailed, codes::kInvarThrew});
  if (!v.passed()) return v;
  return Verdict::pass(std::to_string(checked) + " invariant results");
}

Verdict module_parity(const CaseEvidence& ev) {
  const auto& declared = ev.json("spec.resolved.json").value("module_parity_cases", json::array());
  if (declared.empty()) return Verdict::skip("the spec declares no module parity case");
  if (ev.resolved_case().kind != spec::CaseKind::kReference) return Verdict::skip("module parity runs with the reference case");
  const std::string file = "check/module_parity.json";
  const std::string open = " (open " + rel_path(ev, file) + ")";
  const auto& results = ev.json(file);
  int64_t observed = 0;
  for (const auto& name : declared) {
    const std::string n = name.is_string() ? name.get<std::string>() : name.value("name", "");
    const std::string where = "module parity case '" + n + "'";
    if (!results.contains(n)) return Verdict::fail("parity case '" + n + "' has no result" + open);
    const json& r = results[n];
    if (r.contains("error")) return Verdict::fail(where + " raised: " + r.value("error", std::string()) + open);
    const json unmapped = r.value("unmapped", json::array());
    if (!unmapped.empty()) {
      return Verdict::fail(where + ": the weight adapter maps no reference weight from the candidate's trainable " +
                           "parameter(s) " + short_json(unmapped) + open);
    }
    const json observations = r.value("observations", json::array());
    if (observations.empty()) return Verdict::fail(where + " recorded no observation" + open);
    // Each observation is judged at the declared tolerance (the spec's, which the runner has
    // checked against the compiled one), never at the one the file carries.
    const json declared_tolerance = name.is_object() ? name.value("tolerance", json()) : json();
    const json declared_grad = name.is_object() ? name.value("grad_tolerance", declared_tolerance) : json();
    for (const auto& o : observations) {
      ++observed;
      const std::string observation = o.value("name", "?");
      const json& want = observation == "output" || observation == "aux_loss" ? declared_tolerance : declared_grad;
      const json recorded = o.value("tolerance", json());
      const json error = o.value("relative_error", json());
      if (want.is_number()) {
        MIH_CHECK_CODE(recorded.is_number() && recorded.get<double>() == want.get<double>(), Code::kFailedPrecondition,
                       where, ": observation '", observation, "' was judged at tolerance ", number(recorded),
                       ", and the spec declares ", number(want), ": ", rel_path(ev, file),
                       " is not what this spec's run writes; rerun the case");
        const bool within = error.is_number() && std::isfinite(error.get<double>()) && error.get<double>() <= want.get<double>();
        MIH_CHECK_CODE(within == o.value("passed", false), Code::kFailedPrecondition, where, ": observation '",
                       observation, "' says passed ", o.value("passed", false) ? "true" : "false", " at relative error ",
                       number(error), " and tolerance ", number(want), ": ", rel_path(ev, file),
                       " contradicts itself; rerun the case");
      }
      if (o.value("passed", false)) continue;
      return Verdict::fail(where + ": observation '" + o.value("name", "?") + "' relative error " +
                           number(o.value("relative_error", json())) + " > tolerance " + number(o.value("tolerance", json())) +
                           " (max abs error " + number(o.value("max_abs_error", json())) +
                           (o.contains("note") ? "; " + o["note"].get<std::string>() : "") + ")" + open);
    }
    if (!r.value("passed", false)) return Verdict::fail(where + " did not pass: " + short_json(r, 500) + open);
  }
  return Verdict::pass(std::to_string(observed) + " observations of " + std::to_string(declared.size()) +
                       " module parity cases");
}

Verdict activation_checkpoint_enabled(const CaseEvidence& ev) {
  if (!ev.config().activation_checkpointing) return Verdict::skip("activation checkpointing is off");
  const std::string file = "check/activation_checkpoint.json";
  const auto& ac = ev.json(file);
  if (!ac.value("enabled", false)) {
    return Verdict::fail("the case asked for activation checkpointing and the model ran without it (enabled: false; open " +
                         rel_path(ev, file) + ")");
  }
  if (ac.value("regions", json::array()).empty()) {
    return Verdict::fail("activation checkpointing is on and the model declares no region to recompute (open " +
                         rel_path(ev, file) + ")");
  }
  // The runtime's count, not the config's claim: every forward that ran under checkpointing
  // with an output that needs a gradient was recomputed once in backward.
  const json steps = ac.value("steps", json());
  if (!steps.is_array() || steps.empty()) {
    return Verdict::fail("activation checkpointing is on and " + rel_path(ev, file) +
                         " records no step of what the runtime recomputed, so nothing shows a region was recomputed "
                         "in backward (evidence of a runtime that does not count recomputes: rerun the case)");
  }
  int64_t checkpointed = 0, recomputed = 0;
  std::set<std::string> regions;
  std::vector<std::string> problems;
  for (const auto& s : steps) {
    for (const auto& [region, c] : s.at("regions").items()) {
      const int64_t ran = c.at("checkpointed").get<int64_t>(), again = c.at("recomputed").get<int64_t>();
      checkpointed += ran;
      recomputed += again;
      if (again > 0) regions.insert(region);
      if (ran != again) {
        problems.push_back("step " + std::to_string(s.at("step").get<int64_t>()) + ": region '" + region + "' ran " +
                           std::to_string(ran) + " time(s) under checkpointing and backward recomputed it " +
                           std::to_string(again) + " time(s)");
      }
    }
  }
  if (checkpointed == 0) {
    return Verdict::fail("activation checkpointing is on, yet over " + std::to_string(steps.size()) +
                         " step(s) no region ran under it and backward recomputed nothing: the regions ran plainly and "
                         "backward read stored activations (open " + rel_path(ev, file) + ")");
  }
  if (!problems.empty()) {
    std::string msg = problems[0];
    for (size_t i = 1; i < std::min<size_t>(problems.size(), 5); ++i) msg += "\n  " + problems[i];
    return Verdict::fail("a checkpointed forward without its recompute (backward read stored activations, or skipped "
                         "the region): " + msg + "\n  (open " + rel_path(ev, file) + ")");
  }
  return Verdict::pass(std::to_string(recomputed) + " recomputes of " + std::to_string(regions.size()) +
                       " region(s) over " + std::to_string(steps.size()) + " step(s), one per checkpointed forward");
}

namespace {

// The gradient synchronization of one step per axis and call site, from the parameter table
// (structure.json, rank 0's pieces): the tp-partial gradients (grad domain "tp") all-reduced
// over tp once, and every gradient over each data-parallel axis that is not dp_shard's FSDP
// (dp_replicate, cp).
std::map<std::string, std::map<std::string, double>> grad_sync_bytes(const CaseEvidence& ev) {
  std::map<std::string, std::map<std::string, double>> out;
  const auto& cfg = ev.config();
  for (const auto& p : ev.json("check/structure.json").at("parameters")) {
    if (!p.value("requires_grad", true)) continue;
    const double bytes = static_cast<double>(numel(p.at("local_shape")) * element_size(p.value("dtype", "float32")));
    const auto& domain = p.value("grad_domain", json::array());
    // Each bucket is labelled with its reduction path (reduction_paths.h): what the parameter
    // is (dense or expert) and whether FSDP shards it.
    const GradientKind kind = p.value("gradient_kind", "DENSE") == "EXPERT" ? GradientKind::kExpert : GradientKind::kDense;
    const GradientLayout layout = p.contains("fsdp_rows") ? GradientLayout::kFsdp : GradientLayout::kUnsharded;
    auto site = [&](std::string_view axis) { return std::string(gradient_path(kind, layout, axis).site); };
    if (cfg.tp > 1 && std::find(domain.begin(), domain.end(), "tp") != domain.end()) out["tp"][site("tp")] += bytes;
    if (cfg.dp_replicate > 1) out["dp_replicate"][site("dp_replicate")] += bytes;
    // Experts under ep are reduced over edp (and dp_replicate), not cp.
    if (cfg.cp > 1 && kind == GradientKind::kDense) out["cp"][site("cp")] += bytes;
  }
  return out;
}

// tp, cp and dp_replicate: every call site's bytes in a step equal what the layers declared
// (metrics comm_expected, from the layers' contracts) plus the gradient synchronization of
// the parameter table; a mismatch names the axis, the site and the declaring layers.
Verdict sites_as_declared(const CaseEvidence& ev, const json& row,
                          const std::map<std::string, std::map<std::string, double>>& grad_sync) {
  const auto& cfg = ev.config();
  const int64_t step = row.value("step", int64_t{-1});
  const std::string file = rel_path(ev, "cases/runtime/metrics.jsonl");
  if (!row.contains("comm_sites") || !row.contains("comm_expected")) {
    return Verdict::fail("metrics of step " + std::to_string(step) +
                         " have no comm_sites/comm_expected: the evidence predates per-site accounting; rerun the case "
                         "(open " + file + ")");
  }
  const std::map<std::string, int> degree = {
      {"tp", cfg.tp}, {"cp", cfg.cp}, {"dp_replicate", cfg.dp_replicate}, {"ep", cfg.ep}};
  for (const auto& [axis, d] : degree) {
    if (d <= 1) continue;
    std::map<std::string, double> want, got;
    const json declared = row["comm_expected"].value(axis, json::object());
    const json moved = row["comm_sites"].value(axis, json::object());
    for (const auto& [site, b] : declared.items()) want[site] += b.get<double>();
    if (auto it = grad_sync.find(axis); it != grad_sync.end()) {
      for (const auto& [site, b] : it->second) want[site] += b;
    }
    for (const auto& [site, b] : moved.items()) got[site] += b.get<double>();
    std::set<std::string> all;
    for (const auto& [s, b] : want) all.insert(s);
    for (const auto& [s, b] : got) all.insert(s);
    for (const auto& site : all) {
      const double w = want.count(site) ? want[site] : 0, g = got.count(site) ? got[site] : 0;
      if (std::abs(w - g) <= 0.5) continue;
      const std::string layers_file = "cases/runtime/comm_expected_step" + std::to_string(step) + ".json";
      std::string who;
      if (ev.has(layers_file)) {
        const json& by_layer = ev.json(layers_file);
        if (by_layer.contains(axis) && by_layer[axis].contains(site)) {
          int n = 0;
          for (const auto& [layer, b] : by_layer[axis][site].items()) {
            if (++n > 4) {
              who += ", ...";
              break;
            }
            who += (who.empty() ? "" : ", ") + layer + " " + std::to_string(b.get<int64_t>());
          }
        }
      }
      if (site.rfind("grad_sync.", 0) == 0) who = "the gradient synchronization of the parameter table";
      return Verdict::fail("axis " + axis + ", call site " + site + ": moved " + std::to_string(static_cast<int64_t>(g)) +
                           " bytes at step " + std::to_string(step) + ", " +
                           (w > 0 ? "the model declares " + std::to_string(static_cast<int64_t>(w)) + " (" +
                                        (who.empty() ? "no layer named" : who) + ")"
                                  : "no layer or gradient synchronization declares any") +
                           ": a collective is missing, repeated or moves the wrong size (open " + file + " and " +
                           rel_path(ev, layers_file) + ", and the comm ledgers under run/)");
    }
  }
  return Verdict::pass();
}

}  // namespace

Verdict comm_volume(const CaseEvidence& ev) {
  const auto& cfg = ev.config();
  const auto grad_sync = grad_sync_bytes(ev);
  const auto& rows = ev.jsonl("cases/runtime/metrics.jsonl");
  if (rows.empty()) return Verdict::fail("no metrics rows (open " + rel_path(ev, "cases/runtime/metrics.jsonl") + ")");
  const std::string file = rel_path(ev, "cases/runtime/metrics.jsonl");
  const int dp_shard = cfg.dp_shard, dp_cp = cfg.dp_replicate * cfg.dp_shard * cfg.cp, world = cfg.world_size();
  std::map<std::string, int> degree = {{"dp_cp", dp_cp}, {"world", world}};
  for (const auto& d : kMeshDims) degree[std::string(d.name)] = cfg.*d.degree;
  std::map<std::string, double> expected;
  if (dp_cp > 1) expected["dp_cp"] = 16;
  if (world > 1) expected["world"] = 16;
  // The FSDP count (verdicts.h) per forward that uses each parameter, from this rank's
  // parameter table (rank 0 writes it). The element size of each parameter as recorded (the
  // master weights: float32 in the autocast lanes, whose FSDP gathers move float32).
  std::map<std::string, double> fsdp_bytes;
  if (dp_shard > 1) {
    for (const auto& p : ev.json("check/structure.json").at("parameters")) {
      if (!p.contains("fsdp_rows") || p.value("fsdp_unit", "").empty()) continue;
      if (p.value("fsdp_axis", "dp_shard") != "dp_shard") continue;  // experts under ep: over edp
      const int64_t e = element_size(p.value("dtype", dtype_name(cfg.dtype)));
      const int64_t chunk = p["fsdp_rows"].value("chunk", int64_t{0});
      const auto& shape = p.at("tp_local_shape");
      const int64_t cols = shape.size() > 1 ? numel(shape) / shape[0].get<int64_t>() : 1;
      // One forward gather of each rank's padded shard; the reduce-scatter of the padded full
      // gradient only for a parameter that has one (a frozen one has none).
      double& bytes = fsdp_bytes[p.value("fqn", "")];
      bytes += static_cast<double>(chunk * cols * e);
      if (p.value("requires_grad", true)) bytes += static_cast<double>(dp_shard * chunk * cols * e);
    }
    // Once a step, the all-reduce of every trainable dense gradient FSDP left whole (a 0-d
    // parameter, one outside every unit: reduction path dense.unsharded.dp_shard).
    double unsharded = 0;
    for (const auto& p : ev.json("check/structure.json").at("parameters")) {
      if (p.contains("fsdp_rows") || !p.value("requires_grad", true) || p.value("gradient_kind", "DENSE") == "EXPERT") continue;
      unsharded += static_cast<double>(numel(p.at("local_shape")) * element_size(p.value("dtype", dtype_name(cfg.dtype))));
    }
    if (unsharded > 0) expected["dp_shard"] = unsharded;
  }
  std::optional<json> first;
  json first_gathers;
  for (const auto& r : rows) {
    const json bytes = r.value("comm_bytes", json::object());
    const int64_t step = r.value("step", int64_t{-1});
    std::map<std::string, double> expected_here = expected;
    // Each parameter in every forward (micro-batch) that used it: a step that never uses one
    // (a vision tower on a text-only batch) moves nothing for it. The runtime records which
    // parameters its forwards gathered (metrics fsdp_gather_forwards); without that record,
    // every parameter in every micro-batch.
    const json gathers = r.value("fsdp_gather_forwards", json());
    if (dp_shard > 1) {
      double& fsdp = expected_here["dp_shard"];
      for (const auto& [fqn, b] : fsdp_bytes) {
        const int64_t forwards = gathers.is_object() ? gathers.value(fqn, int64_t{0}) : cfg.micro_batches;
        fsdp += b * static_cast<double>(forwards);
      }
      // The gathers for backward of the units whose output needed a gradient, as the runtime
      // declared them (ParallelContext::fsdp_forward).
      const json declared = r.value("comm_expected", json::object()).value("dp_shard", json::object());
      for (const auto& [site, b] : declared.items()) fsdp += b.get<double>();
    }
    for (const auto& [axis, b] : bytes.items()) {
      const double got = b.get<double>();
      auto d = degree.find(axis);
      if (got > 0 && d != degree.end() && d->second == 1) {
        return Verdict::fail("axis " + axis + " has degree 1 and moved " + std::to_string(static_cast<int64_t>(got)) +
                             " bytes at step " + std::to_string(step) + ": a collective runs on a trivial group (open " + file + ")");
      }
      auto x = expected_here.find(axis);
      // dp_shard is exact; dp_cp and world carry the trainer's scalars and may carry the
      // model's own (an MoE's global expert counts), so they are a floor.
      const bool exact = axis == "dp_shard";
      if (x != expected_here.end() && (exact ? std::abs(got - x->second) > 0.5 : got < x->second - 0.5)) {
        return Verdict::fail("axis " + axis + " moved " + std::to_string(static_cast<int64_t>(got)) + " bytes at step " +
                             std::to_string(step) + ", the config implies " + (exact ? "" : "at least ") +
                             std::to_string(static_cast<int64_t>(x->second)) +
                             " (" + (axis == "dp_shard" ? "FSDP all-gathers and reduce-scatters of the parameter table, and the "
                                                          "gathers for backward the units declared"
                                                        : "two float64 scalars") +
                             "); a collective is missing, repeated or moves the wrong size (open " + file +
                             " and the comm ledgers under run/)");
      }
    }
    for (const auto& [axis, want] : expected) {
      if (!bytes.contains(axis)) {
        return Verdict::fail("axis " + axis + " moved nothing at step " + std::to_string(step) + ", the config implies " +
                             std::to_string(static_cast<int64_t>(want)) + " bytes (open " + file + ")");
      }
    }
    if (Verdict v = sites_as_declared(ev, r, grad_sync); !v.passed()) return v;
    // The expert all-to-alls move what the routing sends, which changes from step to step;
    // dp_shard changes with the parameters a step uses (checked exactly above).
    json steady = bytes;
    steady.erase("ep");
    if (first && gathers != first_gathers) steady.erase("dp_shard");
    json earlier = first ? *first : json();
    if (first && gathers != first_gathers) earlier.erase("dp_shard");
    if (first && earlier != steady) {
      return Verdict::fail("the bytes per axis change between steps: " + earlier.dump() + " then " + steady.dump() +
                           " at step " + std::to_string(step) + " (open " + file + ")");
    }
    if (!first) {
      first = steady;
      first_gathers = gathers;
    }
  }
  return Verdict::pass();
}

}  // namespace mih::verdicts
