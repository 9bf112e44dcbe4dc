// The conformance suites' verdicts over evidence (see verdicts.h): the evidence view, findings,
// tolerances and calibration, parity and localization; the per-feature checks are in
// verdicts_checks.cpp, the communication volume in verdicts_comm.cpp.
#include "harness/compare/verdicts.h"
#include "harness/compare/verdicts_internal.h"

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

#include "harness/contract/evidence_layout.h"
#include "harness/contract/findings_file.h"
#include "harness/contract/resolved_spec.h"
#include "harness/contract/structure_table.h"
#include "harness/findings/codes.h"
#include "harness/base/error.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/base/reduction_paths.h"
#include "harness/evidence/evidence_store.h"

namespace mih::verdicts {
namespace fs = std::filesystem;
using nlohmann::json;


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
    for (const auto& [key, value] : json(layout::kConfigResolved).items()) {
      if (empty.contains(key)) parallel[key] = value;
    }
    config_ = with_context("config.resolved.json of " + dir_.string(), [&] { return parallel.get<ParallelConfig>(); });
  }
  return *config_;
}

const spec::Case& CaseEvidence::resolved_case() const {
  if (!case_) {
    const auto& env = json(layout::kEnvironment);
    MIH_CHECK_CODE(env.is_object() && env.contains("case"), Code::kFailedPrecondition, "evidence ",
                   rel_path(*this, layout::kEnvironment), " has no \"case\": it was not written by the conformance "
                   "case runner (mih run), or was edited; rerun the case");
    try {
      case_ = env["case"].get<spec::Case>();
    } catch (const Error& e) {
      MIH_THROW(Code::kFailedPrecondition, "evidence ", rel_path(*this, layout::kEnvironment), ": its \"case\" is not ",
                "the one mih writes (", e.message(), "): the file was edited or is of another tool; rerun the case");
    }
  }
  return *case_;
}

std::string CaseEvidence::spec_name() const {
  const auto& spec = json(layout::kSpecResolved);
  MIH_CHECK_CODE(spec.is_object() && spec.contains("name") && spec["name"].is_string(), Code::kFailedPrecondition,
                 "evidence ", rel_path(*this, layout::kSpecResolved), " has no string \"name\" (",
                 json_summary(spec.is_object() && spec.contains("name") ? spec["name"] : spec), "): it is not the "
                 "resolved spec mih writes (edited or of another tool); rerun the case");
  return spec["name"].get<std::string>();
}


namespace {

// findings.json of the case, or of its save phase (before_save/), read typed.
contract::FindingsFile findings_of(const CaseEvidence& ev, const std::string& file) {
  return contract::findings_file(ev.json(file), file, rel_path(ev, file));
}

// The error findings of `codes` (at most 5 shown) in `files`; "" for none.
std::string error_findings(const CaseEvidence& ev, const std::vector<std::string>& files,
                           const std::vector<std::string>& codes, int* n) {
  std::ostringstream out;
  for (const auto& file : files) {
    for (const auto& f : findings_of(ev, file).findings) {
      if (!f.error() || std::find(codes.begin(), codes.end(), f.code) == codes.end()) continue;
      if (++*n > 5) continue;
      out << "\n  " << f.code << " " << f.owner << ": " << f.message << (file == files[0] ? "" : " (in the save phase)");
      if (!f.facts.empty()) out << "\n    facts: " << short_json(f.facts);
      if (!f.remediation.empty()) out << "\n    fix: " << f.remediation;
    }
  }
  return out.str();
}

}  // namespace

Verdict no_error_findings(const CaseEvidence& ev, const std::vector<std::string>& codes) {
  // The error findings of these codes first (of the case, and of the save phase of a resume
  // case, whose checks ran in another process); then, with none, the proof that the checks
  // emitting them ran: no finding from a check that never looked is not a pass.
  int n = 0;
  std::vector<std::string> files = {layout::kFindings};
  if (ev.has(layout::before_save(layout::kFindings))) files.push_back(layout::before_save(layout::kFindings));
  const std::string shown = error_findings(ev, files, codes, &n);
  if (n > 0) {
    return Verdict::fail(std::to_string(n) + " error finding(s):" + shown +
                         (n > 5 ? "\n  ... and " + std::to_string(n - 5) + " more" : "") + "\n  (open " +
                         rel_path(ev, layout::kFindings) + ")");
  }
  const std::map<std::string, contract::CheckRun> runs = findings_of(ev, layout::kFindings).checks;
  std::vector<std::string> examined;
  for (const auto& code : codes) {
    const std::string check(codes::check_of(code));
    MIH_INTERNAL_ASSERT(!check.empty(), "finding code ", code, " has no emitting check in codes::kAllCodes");
    if (std::find(examined.begin(), examined.end(), check) != examined.end()) continue;
    if (!runs.count(check)) {
      return Verdict::fail("check " + check + " did not run on this case (" + code +
                           " is its finding): check/findings.json records no run of it, so the absence of findings "
                           "proves nothing; the session never reached it, the training backend skips the hook that "
                           "feeds it, or the evidence predates check records; rerun the case (open " +
                           rel_path(ev, layout::kFindings) + ")");
    }
    const contract::CheckRun& r = runs.at(check);
    if (r.examined <= 0) {
      return Verdict::fail("check " + check + " ran " + std::to_string(r.runs) + " time(s) and examined no " + r.unit +
                           ": it checked nothing on this case (open " + rel_path(ev, layout::kFindings) + ")");
    }
    examined.push_back(check);
  }
  std::string what;
  for (const auto& check : examined) {
    const contract::CheckRun& r = runs.at(check);
    what += (what.empty() ? "" : "; ") + check + " examined " + std::to_string(r.examined) + " " + r.unit + " in " +
            std::to_string(r.runs) + " run(s)";
  }
  return Verdict::pass(what);
}

namespace {

contract::ResolvedSpec resolved_spec_of(const CaseEvidence& ev) {
  return contract::resolved_spec(ev.json(layout::kSpecResolved), rel_path(ev, layout::kSpecResolved));
}

}  // namespace

double case_tolerance(const CaseEvidence& ev) {
  const contract::ResolvedTolerances tol = resolved_spec_of(ev).tolerances;
  const std::string dtype = dtype_name(ev.config().dtype);
  std::string profile = ev.resolved_case().kind == spec::CaseKind::kResume ? "same_topology" : "cross_topology";
  if (ev.config().micro_batches > 1 && tol.grad_accumulation) profile = "grad_accumulation";
  const std::map<std::string, double>* by_dtype = tol.profile(profile);
  MIH_CHECK(by_dtype && by_dtype->count(dtype), "spec.resolved.json of ", ev.dir().string(), " declares no ", profile,
            " tolerance for dtype ", dtype, ": add it to the spec's Tolerances");
  return by_dtype->at(dtype);
}

std::string not_comparable_reason(const CaseEvidence& ev) {
  const contract::ResolvedTolerances tol = resolved_spec_of(ev).tolerances;
  if (ev.config().micro_batches <= 1 || tol.grad_accumulation) return "";
  // No reason declared: gradient accumulation is comparable.
  return tol.grad_accumulation_reason.value_or("");
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
  const contract::ResolvedTolerances tol = resolved_spec_of(candidate).tolerances;
  Calibration settings;
  settings.k = tol.noise_k;
  settings.k_update = tol.noise_k_update;
  settings.floor_eps = tol.noise_floor_eps;
  if (k_override >= 0) settings.k = settings.k_update = k_override;
  // The lane's own reference and twin are compared with the float64 oracle.
  if (candidate.resolved_case().compare_to == "Reference") settings.factor = tol.noise_oracle_factor;
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
  // Runs with the same micro-batching optimize the same objective (a case with activation
  // checkpointing and its twin without): only a different split is not comparable.
  // Evidence of another writer declares no spec, so nothing declared not comparable.
  const std::string reason = candidate.has(layout::kSpecResolved) ? not_comparable_reason(candidate) : "";
  if (!reason.empty() && reference.config().micro_batches != candidate.config().micro_batches) {
    return Verdict::skip("the spec declares gradient accumulation not comparable: " + reason);
  }
  const Comparison c = compare_evidence(reference.dir(), candidate.dir(), o);
  if (calibration && record) {
    json j = calibration_evidence(*calibration, c);
    j["reference"] = reference.dir().filename().string();
    EvidenceDir(candidate.dir()).write_json(layout::kCalibration, j);
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

namespace {

// The deepest module holding the owners of every error finding of `code` (dot-separated FQN
// components they all start with, the parameter's own name dropped); "" for fewer than two.
std::string common_module(const std::vector<contract::Finding>& findings, const std::string& code) {
  std::vector<std::string> common;
  int owners = 0;
  for (const auto& f : findings) {
    if (!f.error() || f.code != code || f.owner.empty()) continue;
    std::vector<std::string> parts;
    std::stringstream in(module_of_parameter(f.owner));
    for (std::string part; std::getline(in, part, '.');) parts.push_back(part);
    if (owners++ == 0) {
      common = parts;
      continue;
    }
    size_t n = 0;
    while (n < common.size() && n < parts.size() && common[n] == parts[n]) ++n;
    common.resize(n);
  }
  std::string out;
  for (const auto& part : common) out += (out.empty() ? "" : ".") + part;
  return owners >= 2 ? out : "";
}

// Where an error finding with an owner puts the fault: a broken tie's alias, shared state's
// publisher, the module holding a modality's parameters, else its owner's module.
Localization finding_place(const contract::Finding& f, const std::vector<contract::Finding>& all,
                           const std::set<std::string>& parameters) {
  const json& facts = f.facts;
  // A declared tie that does not hold: the alias (the second of the pair) is the parameter
  // that lost the first's storage.
  if (facts.contains("tied") && facts["tied"].is_array() && facts["tied"].size() == 2 && facts["tied"][1].is_string()) {
    const std::string alias = facts["tied"][1].get<std::string>();
    return {module_of_parameter(alias), "finding " + f.code + ": the tied alias '" + alias + "' is not the parameter it "
                                        "is declared tied to"};
  }
  // Shared state: the module that published it.
  if (facts.contains("publishes") && facts["publishes"].is_array() && !facts["publishes"].empty() &&
      facts["publishes"][0].is_object() && facts["publishes"][0].contains("source") &&
      facts["publishes"][0]["source"].is_string()) {
    const std::string source = facts["publishes"][0]["source"].get<std::string>();
    return {source, "finding " + f.code + ": shared state '" + f.owner + "' published by '" + source + "'"};
  }
  // A modality whose parameters train nowhere: the module that holds all of them (the vision
  // tower), not the first one's (its embeddings).
  if (f.code == codes::kModalNoGradient) {
    const std::string shared = common_module(all, f.code);
    if (!shared.empty()) return {shared, "the module holding every parameter finding " + f.code + " names"};
  }
  return {parameters.count(f.owner) ? module_of_parameter(f.owner) : f.owner,
          "the owner of finding " + f.code + " ('" + f.owner + "')"};
}

// The place of the first error finding (a checkpoint load's, or one with an owner).
Localization findings_place(const CaseEvidence& ev) {
  std::set<std::string> parameters;
  if (ev.has(layout::kStructure)) {
    for (const auto& p : contract::structure_parameters(ev.json(layout::kStructure), rel_path(ev, layout::kStructure))) {
      parameters.insert(p.fqn);
    }
  }
  const std::vector<contract::Finding> all = findings_of(ev, layout::kFindings).findings;
  for (const auto& f : all) {
    if (!f.error()) continue;
    if (f.phase == "checkpoint") return {"checkpoint", "finding " + f.code + " at a checkpoint load"};
    if (!f.owner.empty()) return finding_place(f, all, parameters);
  }
  return {"", "the failure names no place"};
}

}  // namespace

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
      {"PipelineOutputs", "data"},      {"DataLoaderState", "data"},
      {"CheckpointCoverage", "checkpoint"}, {"CheckpointRoundTrip", "checkpoint"},
      {"Resume", "checkpoint"},          {"SourceCheckpoint", "checkpoint"},
      {"OptimizerLayout", "optimizer"},  {"FrozenParameters", "optimizer"},
      // GradientSync names the parameter reduced over the wrong axes: its finding's owner.
      {"TensorParallelGradients", "grad_sync"},
      {"CommVolume", "grad_sync"}};
  auto it = kPlaces.find(suite);
  if (it != kPlaces.end()) return {it->second, "the place " + suite + " examines"};
  if (ev.has(layout::kFindings)) return findings_place(ev);
  return {"", "the failure names no place"};
}

}  // namespace mih::verdicts
