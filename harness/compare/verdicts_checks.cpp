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
#include "harness/contract/step_rows.h"
#include "harness/findings/codes.h"

namespace mih::verdicts {
namespace fs = std::filesystem;
using nlohmann::json;

Verdict fsdp_units_cover_parameters(const CaseEvidence& ev) {
  if (ev.config().dp_shard <= 1) return Verdict::skip("dp_shard is 1: no FSDP units");
  const auto& structure = ev.json(layout::kStructure);
  const auto& units = ev.json(layout::kFsdpUnits);
  // A parameter pp stages share (a tied embedding on the first and the last, placement pp
  // Replicate()) is in the same-named unit of each stage that holds it.
  std::map<std::string, int> stages_holding, listed;
  for (const auto& p : structure.at("parameters")) ++stages_holding[p.value("fqn", "")];
  std::map<std::string, std::string> unit_of;
  std::vector<std::string> problems;
  for (const auto& [unit, u] : units.items()) {
    const auto& dtypes = u.value("dtypes", json::array());
    if (dtypes.size() != 1) problems.push_back("unit '" + unit + "' holds " + short_json(dtypes) + " (one dtype and mesh expected)");
    for (const auto& p : u.value("parameters", json::array())) {
      const std::string fqn = p.get<std::string>();
      const bool another_stage = unit_of.count(fqn) && unit_of[fqn] == unit && ++listed[fqn] < stages_holding[fqn];
      if (unit_of.count(fqn) && !another_stage) {
        problems.push_back("parameter '" + fqn + "' in units '" + unit_of[fqn] + "' and '" + unit + "'");
      }
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
  }
  for (const auto& [fqn, held] : stages_holding) unit_of.erase(fqn);
  for (const auto& [fqn, unit] : unit_of) problems.push_back("unit '" + unit + "' lists '" + fqn + "', which is no parameter");
  if (problems.empty()) return Verdict::pass();
  std::string msg = problems[0];
  for (size_t i = 1; i < std::min<size_t>(problems.size(), 5); ++i) msg += "\n  " + problems[i];
  return Verdict::fail(msg + "\n  (open " + rel_path(ev, layout::kFsdpUnits) + ")");
}

Verdict same_inputs_as_reference(const CaseEvidence& reference, const CaseEvidence& candidate) {
  std::map<StepKey, json> ref_rows, rows_seen;
  for (auto [ev, rows] : {std::pair{&reference, &ref_rows}, std::pair{&candidate, &rows_seen}}) {
    const std::string refusal =
        index_rows_by_step(ev->jsonl(layout::kInputIdentity), rel_path(*ev, layout::kInputIdentity), "", rows);
    if (!refusal.empty()) return Verdict::fail(refusal);
  }
  int compared = 0;
  for (const auto& [key, row] : rows_seen) {
    const int64_t step = key.first;
    const auto found = ref_rows.find(key);
    if (found == ref_rows.end()) continue;
    const json& other = found->second;
    ++compared;
    // Every part: the global hash, each field's and the row count (a field changed under an
    // unchanged global hash is not the same batch).
    if (row.value("global", "") == other.value("global", "") &&
        row.value("fields", json::object()) == other.value("fields", json::object()) &&
        row.value("rows", 0) == other.value("rows", 0)) {
      continue;
    }
    std::string fields;
    const json mine = row.value("fields", json::object()), theirs = other.value("fields", json::object());
    for (const auto& [name, hash] : mine.items()) {
      if (theirs.value(name, "") != hash.get<std::string>()) fields += (fields.empty() ? "" : ", ") + name;
    }
    for (const auto& [name, hash] : theirs.items()) {
      if (!mine.contains(name)) fields += (fields.empty() ? "" : ", ") + name + " (not seen)";
    }
    return Verdict::fail("the global batch of step " + std::to_string(step) + " differs from the reference's in field(s) " +
                         fields + ": rows were dropped, repeated or changed by the data split (rows " +
                         std::to_string(row.value("rows", 0)) + " vs " + std::to_string(other.value("rows", 0)) +
                         ") (open " + rel_path(candidate, layout::kInputIdentity) + ")");
  }
  if (compared == 0) {
    return Verdict::fail("no step in common with the reference in data/input_identity.jsonl (open " +
                         rel_path(candidate, layout::kInputIdentity) + ")");
  }
  return Verdict::pass("examined the global batch of " + std::to_string(compared) + " step(s), field by field");
}

Verdict checkpoint_round_trip(const CaseEvidence& ev) {
  if (!ev.resolved_case().save_config) {
    return Verdict::skip("the case does not save and load a checkpoint");
  }
  const std::string saved_file = layout::before_save(layout::kRoundtripSave), loaded_file = layout::kRoundtripLoad;
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
  const auto& rows = ev.jsonl(layout::kMetrics);
  std::vector<int64_t> seen;
  for (const auto& r : rows) seen.push_back(r.value("step", int64_t{-1}));
  std::vector<int64_t> expected(static_cast<size_t>(std::max<int64_t>(steps - at, 0)));
  std::iota(expected.begin(), expected.end(), at);
  if (seen == expected) return Verdict::pass();
  return Verdict::fail("after loading the checkpoint saved at step " + std::to_string(at) + " the run trained steps " +
                       json(seen).dump() + ", expected " + json(expected).dump() + " (open " +
                       rel_path(ev, layout::kMetrics) + ")");
}

Verdict modality_gradients(const CaseEvidence& ev) {
  const auto& modalities = ev.json(layout::kSpecResolved).value("modalities", json::array());
  if (modalities.empty()) return Verdict::skip("the spec declares no modality");
  Verdict v = no_error_findings(ev, {codes::kModalNoGradient});
  if (!v.passed()) return v;
  for (const auto& r : ev.jsonl(layout::kMetrics)) {
    const std::string file = layout::modality_gradients_step(r.value("step", 0));
    if (!ev.has(file)) return Verdict::fail("no modality gradient evidence for step " + std::to_string(r.value("step", 0)) + ": " + rel_path(ev, file) + " is missing");
  }
  return Verdict::pass();
}

Verdict state_invariants(const CaseEvidence& ev) {
  const auto& declared = ev.json(layout::kSpecResolved).value("invariants", json::array());
  if (declared.empty()) return Verdict::skip("the spec declares no state invariant");
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
  const auto& declared = ev.json(layout::kSpecResolved).value("module_parity_cases", json::array());
  if (declared.empty()) return Verdict::skip("the spec declares no module parity case");
  if (ev.resolved_case().kind != spec::CaseKind::kReference) return Verdict::skip("module parity runs with the reference case");
  const std::string file = layout::kModuleParity;
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
  const std::string file = layout::kActivationCheckpoint;
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

}  // namespace mih::verdicts
