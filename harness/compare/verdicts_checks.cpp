// The conformance verdicts of one feature each (verdicts.h): FSDP units, input identity,
// checkpoint round trip and resume, modality gradients, state invariants, module parity,
// activation checkpointing.
#include "harness/compare/verdicts.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/base/reduction_paths.h"
#include "harness/base/strings.h"
#include "harness/compare/verdicts_internal.h"
#include "harness/contract/activation_checkpoint_record.h"
#include "harness/contract/fsdp_unit_table.h"
#include "harness/contract/input_identity_row.h"
#include "harness/contract/invariant_results.h"
#include "harness/contract/metrics_row.h"
#include "harness/contract/module_parity_results.h"
#include "harness/contract/resolved_spec.h"
#include "harness/contract/roundtrip_capture.h"
#include "harness/contract/structure_table.h"
#include "harness/findings/codes.h"

namespace mih::verdicts {
namespace fs = std::filesystem;
using nlohmann::json;

Verdict fsdp_units_cover_parameters(const CaseEvidence& ev) {
  if (ev.config().dp_shard <= 1) return Verdict::skip("dp_shard is 1: no FSDP units");
  const std::vector<contract::ParameterRow> structure =
      contract::structure_parameters(ev.json(layout::kStructure), rel_path(ev, layout::kStructure));
  const std::map<std::string, contract::FsdpUnit> units =
      contract::fsdp_unit_table(ev.json(layout::kFsdpUnits), rel_path(ev, layout::kFsdpUnits));
  // A parameter pp stages share (a tied embedding on the first and the last, placement pp
  // Replicate()) is in the same-named unit of each stage that holds it.
  std::map<std::string, int> stages_holding, listed;
  for (const auto& p : structure) ++stages_holding[p.fqn];
  std::map<std::string, std::string> unit_of;
  std::vector<std::string> problems;
  for (const auto& [unit, u] : units) {
    if (u.dtypes.size() != 1) problems.push_back("unit '" + unit + "' holds " + short_json(u.dtypes) + " (one dtype and mesh expected)");
    for (const std::string& fqn : u.parameters) {
      const bool another_stage = unit_of.count(fqn) && unit_of[fqn] == unit && ++listed[fqn] < stages_holding[fqn];
      if (unit_of.count(fqn) && !another_stage) {
        problems.push_back("parameter '" + fqn + "' in units '" + unit_of[fqn] + "' and '" + unit + "'");
      }
      unit_of[fqn] = unit;
    }
  }
  for (const auto& p : structure) {
    // FSDP-sharded: over dp_shard, or over edp for routed experts under ep.
    const auto dp_shard = p.placements.find("dp_shard");
    const bool sharded = p.fsdp_rows || (dp_shard != p.placements.end() && dp_shard->second != "Replicate()");
    if (sharded && !unit_of.count(p.fqn)) problems.push_back("sharded parameter '" + p.fqn + "' is in no FSDP unit");
  }
  for (const auto& [fqn, held] : stages_holding) unit_of.erase(fqn);
  for (const auto& [fqn, unit] : unit_of) problems.push_back("unit '" + unit + "' lists '" + fqn + "', which is no parameter");
  if (problems.empty()) {
    return Verdict::pass("examined " + std::to_string(units.size()) + " FSDP units against " +
                         std::to_string(structure.size()) + " parameters");
  }
  std::string msg = problems[0];
  for (size_t i = 1; i < std::min<size_t>(problems.size(), 5); ++i) msg += "\n  " + problems[i];
  return Verdict::fail(msg + "\n  (open " + rel_path(ev, layout::kFsdpUnits) + ")");
}

std::string fsdp_units_examinable(const CaseEvidence& ev) {
  return ev.config().dp_shard > 1 ? "" : "dp_shard is 1: no FSDP units";
}

namespace {

// The rows of data/input_identity.jsonl of `ev` into `*out`; the refusal (a row the schema
// refuses, two rows for one step) as text, "" when read.
std::string input_rows(const CaseEvidence& ev, std::map<int64_t, contract::InputIdentityRow>* out) {
  try {
    *out = contract::input_identity_rows(ev.jsonl(layout::kInputIdentity), rel_path(ev, layout::kInputIdentity));
  } catch (const Error& e) {
    if (e.code() != Code::kFailedPrecondition) throw;
    return e.message();
  }
  return "";
}

// The fields whose hash differs between two rows of one step, "x, y (not seen)".
std::string differing_fields(const contract::InputIdentityRow& mine, const contract::InputIdentityRow& theirs) {
  std::string fields;
  for (const auto& [name, hash] : mine.fields) {
    const auto other = theirs.fields.find(name);
    if (other == theirs.fields.end() || other->second != hash) fields += (fields.empty() ? "" : ", ") + name;
  }
  for (const auto& [name, hash] : theirs.fields) {
    if (!mine.fields.count(name)) fields += (fields.empty() ? "" : ", ") + name + " (not seen)";
  }
  return fields;
}

}  // namespace

Verdict same_inputs_as_reference(const CaseEvidence& reference, const CaseEvidence& candidate) {
  std::map<int64_t, contract::InputIdentityRow> ref_rows, rows_seen;
  for (auto [ev, rows] : {std::pair{&reference, &ref_rows}, std::pair{&candidate, &rows_seen}}) {
    const std::string refusal = input_rows(*ev, rows);
    if (!refusal.empty()) return Verdict::fail(refusal);
  }
  int compared = 0;
  for (const auto& [step, row] : rows_seen) {
    const auto found = ref_rows.find(step);
    if (found == ref_rows.end()) continue;
    ++compared;
    // Every part: the global hash, each field's and the row count (a field changed under an
    // unchanged global hash is not the same batch).
    const contract::InputIdentityRow& other = found->second;
    if (row.global == other.global && row.fields == other.fields && row.rows == other.rows) continue;
    const std::string fields = differing_fields(row, found->second);
    return Verdict::fail("the global batch of step " + std::to_string(step) + " differs from the reference's in " +
                         (fields.empty() ? "its row count" : "field(s) " + fields) +
                         ": rows were dropped, repeated or changed by the data split (rows " + std::to_string(row.rows) +
                         " vs " + std::to_string(found->second.rows) + ") (open " +
                         rel_path(candidate, layout::kInputIdentity) + " and " +
                         rel_path(reference, layout::kInputIdentity) + ")");
  }
  if (compared == 0) {
    return Verdict::fail("no step in common with the reference in data/input_identity.jsonl (open " +
                         rel_path(candidate, layout::kInputIdentity) + ")");
  }
  return Verdict::pass("examined the global batch of " + std::to_string(compared) + " step(s), field by field, against " +
                       reference.dir().filename().string());
}

Verdict checkpoint_round_trip(const CaseEvidence& ev) {
  if (!ev.resolved_case().save_config) {
    return Verdict::skip("the case does not save and load a checkpoint");
  }
  return restored_what_was_saved(ev);
}

namespace {

// The differences between what a save captured and what the load restored, one line each.
std::vector<std::string> round_trip_problems(const contract::RoundtripCapture& saved,
                                             const contract::RoundtripCapture& loaded) {
  std::vector<std::string> problems;
  if (saved.next_step != loaded.next_step) {
    problems.push_back("the step counter is " + std::to_string(loaded.next_step) + " after the load, " +
                       std::to_string(saved.next_step) + " at the save");
  }
  for (const auto& [name, hash] : saved.tensors) {
    const auto after = loaded.tensors.find(name);
    if (after == loaded.tensors.end()) {
      problems.push_back("'" + name + "' was saved and is absent after the load");
    } else if (after->second.sha256 != hash.sha256 || after->second.shape != hash.shape) {
      problems.push_back("'" + name + "' is not bit-exact after the load: sha256 " + hash.sha256.substr(0, 12) +
                         " saved, " + after->second.sha256.substr(0, 12) + " loaded (shape " + json(hash.shape).dump() +
                         (hash.shape == after->second.shape ? "" : " saved, " + json(after->second.shape).dump() + " loaded") +
                         ")");
    }
  }
  for (const auto& [name, hash] : loaded.tensors) {
    if (!saved.tensors.count(name)) problems.push_back("'" + name + "' exists after the load and was not saved");
  }
  return problems;
}

}  // namespace

Verdict restored_what_was_saved(const CaseEvidence& ev) {
  const std::string saved_file = layout::before_save(layout::kRoundtripSave), loaded_file = layout::kRoundtripLoad;
  const contract::RoundtripCapture saved =
      contract::roundtrip_capture(saved_file, ev.json(saved_file), rel_path(ev, saved_file));
  const contract::RoundtripCapture loaded =
      contract::roundtrip_capture(loaded_file, ev.json(loaded_file), rel_path(ev, loaded_file));
  const std::vector<std::string> problems = round_trip_problems(saved, loaded);
  if (problems.empty()) {
    int64_t states = 0;
    for (const auto& [name, hash] : saved.tensors) states += name.find('/') != std::string::npos ? 1 : 0;
    if (saved.tensors.empty()) return Verdict::fail("the save captured no tensor (open " + rel_path(ev, saved_file) + ")");
    return Verdict::pass("examined " + std::to_string(saved.tensors.size()) + " tensor(s) saved and restored (" +
                         (states ? std::to_string(states) + " of them optimizer state"
                                 : std::string("parameters only: the writer captured no optimizer state")) +
                         "), resuming at step " + std::to_string(saved.next_step));
  }
  std::string msg = problems[0];
  for (size_t i = 1; i < std::min<size_t>(problems.size(), 5); ++i) msg += "\n  " + problems[i];
  if (problems.size() > 5) msg += "\n  ... and " + std::to_string(problems.size() - 5) + " more";
  return Verdict::fail(msg + "\n  (open " + rel_path(ev, loaded_file) + " and " + rel_path(ev, saved_file) + ")");
}

Verdict resume_continues_step_count(const CaseEvidence& ev) {
  const spec::Case& c = ev.resolved_case();
  if (!c.save_config) return Verdict::skip("not a resume case");
  const int64_t at = c.resume_at, steps = c.steps;
  const auto& rows = ev.jsonl(layout::kMetrics);
  contract::metrics_rows(rows, rel_path(ev, layout::kMetrics));  // every row typed, one per step
  std::vector<int64_t> seen;  // in the file's order
  for (const auto& r : rows) seen.push_back(r["step"].get<int64_t>());
  std::vector<int64_t> expected(static_cast<size_t>(std::max<int64_t>(steps - at, 0)));
  std::iota(expected.begin(), expected.end(), at);
  if (seen == expected) return Verdict::pass();
  return Verdict::fail("after loading the checkpoint saved at step " + std::to_string(at) + " the run trained steps " +
                       json(seen).dump() + ", expected " + json(expected).dump() + " (open " +
                       rel_path(ev, layout::kMetrics) + ")");
}

namespace {

// spec.resolved.json of the case, read typed (what the spec declares to be checked).
contract::ResolvedSpec declared(const CaseEvidence& ev) {
  return contract::resolved_spec(ev.json(layout::kSpecResolved), rel_path(ev, layout::kSpecResolved));
}

}  // namespace

Verdict modality_gradients(const CaseEvidence& ev) {
  if (declared(ev).modalities.empty()) return Verdict::skip("the spec declares no modality");
  Verdict v = no_error_findings(ev, {codes::kModalNoGradient});
  if (!v.passed()) return v;
  for (const auto& [step, row] : contract::metrics_rows(ev.jsonl(layout::kMetrics), rel_path(ev, layout::kMetrics))) {
    const std::string file = layout::modality_gradients_step(step);
    if (!ev.has(file)) {
      return Verdict::fail("no modality gradient evidence for step " + std::to_string(step) + ": " + rel_path(ev, file) +
                           " is missing");
    }
  }
  return Verdict::pass();
}

Verdict state_invariants(const CaseEvidence& ev) {
  if (declared(ev).invariants.empty()) return Verdict::skip("the spec declares no state invariant");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(ev.dir() / layout::kCheckDir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(layout::kInvariantsPrefix, 0) == 0) files.push_back(std::string(layout::kCheckDir) + "/" + n);
  }
  if (fs::is_directory(ev.dir() / layout::kRuntimeDir)) {
    for (const auto& e : fs::directory_iterator(ev.dir() / layout::kRuntimeDir)) {
      const std::string n = e.path().filename().string();
      if (n.rfind(layout::kInvariantsPrefix, 0) == 0) files.push_back(std::string(layout::kRuntimeDir) + "/" + n);
    }
  }
  if (ev.has(layout::kInvariantsAfterLoad)) files.push_back(layout::kInvariantsAfterLoad);
  std::sort(files.begin(), files.end());
  if (files.empty()) return Verdict::fail("the spec declares invariants and the case recorded none (no check/invariants_*.json in " + ev.dir().string() + ")");
  int checked = 0;
  for (const auto& file : files) {
    for (const auto& [name, result] : contract::invariant_results(file, ev.json(file), rel_path(ev, file))) {
      ++checked;
      if (result.passed) continue;
      // A materialization invariant names the weights it examined (the build's or a loaded checkpoint's).
      const std::string weights = result.weights ? " on the weights of " + *result.weights : "";
      return Verdict::fail("invariant '" + name + "' failed" + weights + ": " + short_json(result.facts, 500) +
                           " (open " + rel_path(ev, file) + ")");
    }
  }
  Verdict v = no_error_findings(ev, {codes::kInvarFailed, codes::kInvarThrew});
  if (!v.passed()) return v;
  return Verdict::pass(std::to_string(checked) + " invariant results");
}

namespace {

// An error of the evidence as %.3g; absent: written as null, not finite.
std::string number_or_not_finite(const std::optional<double>& v) { return v ? number(*v) : number(json()); }

// Each observation is judged at the spec's declared tolerance (output and aux_loss at
// tolerance, the gradients at grad_tolerance; the runner has checked it against the compiled
// one), never at the one the file carries: a file that records another, or a passed that
// contradicts its error, is refused.
void require_declared_tolerance(const contract::ParityObservation& o, const contract::DeclaredParityCase& c,
                                const std::string& where, const std::string& file) {
  const double want = o.name == "output" || o.name == "aux_loss" ? c.tolerance : c.grad_tolerance;
  MIH_CHECK_CODE(o.tolerance == want, Code::kFailedPrecondition, where, ": observation '", o.name,
                 "' was judged at tolerance ", number(o.tolerance), ", and the spec declares ", number(want), ": ", file,
                 " is not what this spec's run writes; rerun the case");
  const bool within = o.relative_error && std::isfinite(*o.relative_error) && *o.relative_error <= want;
  MIH_CHECK_CODE(within == o.passed, Code::kFailedPrecondition, where, ": observation '", o.name, "' says passed ",
                 o.passed ? "true" : "false", " at relative error ", number_or_not_finite(o.relative_error),
                 " and tolerance ", number(want), ": ", file, " contradicts itself; rerun the case");
}

// The verdict on one declared parity case's result (`file` names module_parity.json); its
// observations are counted into *observed.
Verdict parity_case(const contract::DeclaredParityCase& c, const std::map<std::string, contract::ParityCaseResult>& results,
                    const std::string& file, int64_t* observed) {
  const std::string where = "module parity case '" + c.name + "'", open = " (open " + file + ")";
  const auto found = results.find(c.name);
  if (found == results.end()) return Verdict::fail("parity case '" + c.name + "' has no result" + open);
  const contract::ParityCaseResult& r = found->second;
  if (r.error) return Verdict::fail(where + " raised: " + *r.error + open);
  if (!r.unmapped.empty()) {
    return Verdict::fail(where + ": the weight adapter maps no reference weight from the candidate's trainable " +
                         "parameter(s) " + short_json(r.unmapped) + open);
  }
  if (r.observations.empty()) return Verdict::fail(where + " recorded no observation" + open);
  for (const auto& o : r.observations) {
    ++*observed;
    require_declared_tolerance(o, c, where, file);
    if (o.passed) continue;
    return Verdict::fail(where + ": observation '" + o.name + "' relative error " +
                         number_or_not_finite(o.relative_error) + " > tolerance " + number(o.tolerance) +
                         " (max abs error " + number_or_not_finite(o.max_abs_error) + (o.note ? "; " + *o.note : "") +
                         ")" + open);
  }
  if (!r.passed) return Verdict::fail(where + " did not pass" + (r.failure ? ": " + *r.failure : "") + open);
  return Verdict::pass();
}

}  // namespace

Verdict module_parity(const CaseEvidence& ev) {
  const std::vector<contract::DeclaredParityCase> cases = declared(ev).module_parity_cases;
  if (cases.empty()) return Verdict::skip("the spec declares no module parity case");
  if (ev.resolved_case().kind != spec::CaseKind::kReference) return Verdict::skip("module parity runs with the reference case");
  const std::string file = rel_path(ev, layout::kModuleParity);
  const std::map<std::string, contract::ParityCaseResult> results =
      contract::module_parity_results(ev.json(layout::kModuleParity), file);
  int64_t observed = 0;
  for (const auto& c : cases) {
    Verdict v = parity_case(c, results, file, &observed);
    if (!v.passed()) return v;
  }
  return Verdict::pass(std::to_string(observed) + " observations of " + std::to_string(cases.size()) +
                       " module parity cases");
}

Verdict activation_checkpoint_enabled(const CaseEvidence& ev) {
  if (!ev.config().activation_checkpointing) return Verdict::skip("activation checkpointing is off");
  const std::string file = layout::kActivationCheckpoint;
  const contract::ActivationCheckpointRecord ac = contract::activation_checkpoint_record(ev.json(file), rel_path(ev, file));
  if (!ac.enabled) {
    return Verdict::fail("the case asked for activation checkpointing and the model ran without it (enabled: false; open " +
                         rel_path(ev, file) + ")");
  }
  if (ac.regions.empty()) {
    return Verdict::fail("activation checkpointing is on and the model declares no region to recompute (open " +
                         rel_path(ev, file) + ")");
  }
  // The runtime's count, not the config's claim: every forward that ran under checkpointing
  // with an output that needs a gradient was recomputed once in backward.
  const std::vector<contract::CheckpointedStep>& steps = ac.steps;
  if (steps.empty()) {
    return Verdict::fail("activation checkpointing is on and " + rel_path(ev, file) +
                         " records no step of what the runtime recomputed, so nothing shows a region was recomputed "
                         "in backward (evidence of a runtime that does not count recomputes: rerun the case)");
  }
  int64_t checkpointed = 0, recomputed = 0;
  std::set<std::string> regions;
  std::vector<std::string> problems;
  for (const auto& s : steps) {
    for (const auto& [region, c] : s.regions) {
      const int64_t ran = c.checkpointed, again = c.recomputed;
      checkpointed += ran;
      recomputed += again;
      if (again > 0) regions.insert(region);
      if (ran != again) {
        problems.push_back("step " + std::to_string(s.step) + ": region '" + region + "' ran " +
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

}  // namespace mih::verdicts
