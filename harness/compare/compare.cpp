// compare_evidence (see compare.h).
#include "harness/compare/compare.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <cstdio>
#include <limits>
#include <map>
#include <set>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/evidence/evidence_store.h"
#include "harness/contract/step_rows.h"

namespace mih {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// In the order a step computes them: the activation stages (per module) between the
// parameters before the step and their gradients.
const std::vector<std::string> kStages = {"model_before",   "forward_output",  "output_grad",    "grad_before_clip",
                                          "grad_after_clip", "after_optimizer", "optimizer_state"};

bool activation_stage(const std::string& stage) { return stage == "forward_output" || stage == "output_grad"; }

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::vector<json> read_required(const EvidenceDir& dir, const std::string& file) {
  MIH_CHECK_CODE(fs::exists(dir.root() / file), Code::kFailedPrecondition, "evidence directory ", dir.root().string(),
                 " has no ", file, "; was it written by a runtime session (mih run) that finished?");
  return dir.read_jsonl(file);
}

}  // namespace

std::string Measurement::key() const { return kind + "|" + name + "|" + std::to_string(step) + "|" + stage; }

std::string Measurement::group() const { return kind + "|" + std::to_string(step) + "|" + stage; }

double dtype_epsilon(const std::string& dtype) {
  if (dtype == "float64") return std::ldexp(1.0, -52);
  if (dtype == "float32") return std::ldexp(1.0, -23);
  if (dtype == "bfloat16") return std::ldexp(1.0, -7);
  if (dtype == "float16") return std::ldexp(1.0, -10);
  MIH_THROW(Code::kInvalidSpec, "no machine epsilon for dtype '", dtype, "'; valid: float64, float32, bfloat16, float16");
}

bool Calibration::updated_parameter(const Measurement& m) {
  return m.kind == "tensor" && (m.stage == "after_optimizer" || (m.stage == "model_before" && m.step > 0));
}

bool Calibration::gradient_norm(const Measurement& m) {
  return m.kind == "metric" && (m.name == "grad_norm_pre_clip" || m.name == "grad_norm_post_clip");
}

double Calibration::noise_of(const Measurement& m) const {
  const auto own = noise.find(m.key());
  if (own == noise.end()) return -1;
  const auto& groups = updated_parameter(m) ? group_max : group_noise;
  const auto group = groups.find(m.group());
  double n = std::max(own->second, group == groups.end() ? 0.0 : group->second);
  if (gradient_norm(m)) {
    // | |a| - |b| | <= |a - b|: the norm's error is bounded by its gradients'.
    const auto grads = group_noise.find(Measurement{"tensor", "", m.step, "grad_before_clip", 0, 0}.group());
    if (grads != group_noise.end()) n = std::max(n, grads->second);
  }
  if (m.kind == "metric" && m.name == "loss") {
    // The loss is one number: one noise sample per step, and a later sample can be small by
    // chance while the runs' difference only compounds over the steps. Its noise at a step is
    // at least its noise at every earlier step (vlm, bfloat16, Tp2Sp: 5.8e-5 at step 0, 1.2e-5
    // at step 2, where the case was 21 of those noises off).
    for (int64_t s = 0; s < m.step; ++s) {
      const auto earlier = noise.find(Measurement{"metric", "loss", s, m.stage, 0, 0}.key());
      if (earlier != noise.end()) n = std::max(n, earlier->second);
    }
  }
  return n;
}

double Calibration::tolerance_of(const Measurement& m) const {
  const double multiple = updated_parameter(m) ? k_update : k;
  return factor * std::max(multiple * std::max(noise_of(m), 0.0), floor_eps * floor_epsilon(m));
}

Calibration calibrate(const Comparison& twin, const std::string& dtype, const Calibration& settings) {
  for (const auto& [name, value] : {std::pair{"k", settings.k}, std::pair{"k_update", settings.k_update},
                                    std::pair{"floor_eps", settings.floor_eps}}) {
    MIH_CHECK(std::isfinite(value) && value >= 0, "calibration: ", name, " must be a finite number >= 0, got ", value);
  }
  MIH_CHECK(std::isfinite(settings.factor) && settings.factor > 0, "calibration: the oracle factor must be a finite ",
            "number > 0, got ", settings.factor);
  Calibration c = settings;
  c.noise.clear();
  c.group_noise.clear();
  c.group_max.clear();
  c.dtype = dtype;
  c.epsilon = dtype_epsilon(dtype);
  c.master_epsilon = dtype == "bfloat16" || dtype == "float16" ? dtype_epsilon("float32") : c.epsilon;
  std::map<std::string, std::vector<double>> groups;
  for (const auto& m : twin.measurements) {
    // A quantity the twin cannot compare (not finite) has no noise to calibrate from.
    if (!std::isfinite(m.relative_error)) continue;
    c.noise[m.key()] = m.relative_error;
    if (m.relative_error > 0) groups[m.group()].push_back(m.relative_error);
  }
  for (auto& [group, values] : groups) {
    std::sort(values.begin(), values.end());
    const size_t n = values.size();
    c.group_noise[group] = n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
    c.group_max[group] = values.back();
  }
  return c;
}

json Comparison::to_json() const {
  json d = json::array();
  for (const auto& x : divergences) {
    d.push_back({{"kind", x.kind},
                 {"missing_from", x.missing_from.empty() ? json(nullptr) : json(x.missing_from)},
                 {"name", x.name},
                 {"step", x.step},
                 {"stage", x.stage},
                 {"max_abs_error", x.max_abs_error},
                 {"relative_error", x.relative_error},
                 {"tolerance", x.tolerance},
                 {"evidence", x.evidence},
                 {"message", x.message}});
    if (x.noise != 0) d.back()["noise"] = x.noise;
  }
  return {{"passed", passed()}, {"compared", compared}, {"divergences", d}};
}

std::string Comparison::summary() const {
  if (passed()) return "match: " + std::to_string(compared) + " quantities within tolerance";
  const Localization where = localize(*this);
  return "localized to '" + where.blamed + "': " + where.reason + "; first divergence: " + divergences[0].message + " (" +
         std::to_string(divergences.size()) + " of " + std::to_string(compared) + " quantities diverge)";
}

double record_norm(const json& r) {
  if (r.contains("values") && r["values"].is_array()) {
    double sq = 0;
    for (const auto& v : r["values"]) sq += v.is_number() ? v.get<double>() * v.get<double>() : 0.0;
    return std::sqrt(sq);
  }
  if (r.contains("sum_sq") && r["sum_sq"].is_number()) return std::sqrt(std::max(r["sum_sq"].get<double>(), 0.0));
  double norm = 0;
  for (const auto& v : r.value("sketch", json::array())) norm = std::max(norm, v.is_number() ? std::abs(v.get<double>()) : 0.0);
  return norm;
}

double cancellation_scale(const std::string& stage, const std::string& name, const json& reference_metrics,
                          const json& reference_record, double tolerance) {
  auto ends_with = [&](const std::string& tail) {
    return name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  const bool moment = stage == "optimizer_state" && ends_with("/exp_avg");
  const bool second_moment = stage == "optimizer_state" && ends_with("/exp_avg_sq");
  const char* metric = stage == "grad_before_clip"                             ? "grad_norm_pre_clip"
                       : stage == "grad_after_clip" || moment || second_moment ? "grad_norm_post_clip"
                                                                               : nullptr;
  // A measuring pass (tolerance 1 or more: every quantity measured, none diverges) compares
  // each against its own norm: what it measures is each quantity's noise.
  if (!(tolerance > 0 && tolerance < 1)) return 0;
  if (!metric || !reference_metrics.contains(metric) || !reference_metrics[metric].is_number()) return 0;
  double scale = reference_metrics[metric].get<double>();
  if (second_moment) scale *= scale;  // an average of squared gradients
  if (!(scale > 0) || !std::isfinite(scale)) return 0;
  return record_norm(reference_record) <= tolerance * scale ? scale : 0;
}

TensorError tensor_error(const json& x, const json& y, double scale_floor) {
  TensorError e;
  double& max_abs = e.max_abs;
  double& rel = e.relative;
  if (x.contains("values") && y.contains("values") && x["values"].size() == y["values"].size()) {
    double diff2 = 0, norm2 = 0;
    for (size_t i = 0; i < x["values"].size(); ++i) {
      const double u = x["values"][i].is_number() ? x["values"][i].get<double>() : NAN;
      const double v = y["values"][i].is_number() ? y["values"][i].get<double>() : NAN;
      max_abs = std::max(max_abs, std::abs(u - v));
      diff2 += (u - v) * (u - v);
      norm2 += v * v;
    }
    rel = std::sqrt(diff2) / std::max({std::sqrt(norm2), scale_floor, 1e-300});
  } else {
    // Statistics: each relative to the tensor's L2 norm (sum of squares relative to itself).
    // A partial-sum gradient records no sum of squares: the sketch scales by its sum of
    // absolute projections instead.
    double norm = 0;
    if (y.contains("sum_sq")) {
      norm = std::sqrt(std::max(y["sum_sq"].get<double>(), 0.0));
    } else {
      for (const auto& v : y["sketch"]) norm = std::max(norm, std::abs(v.get<double>()));
      norm = std::max(norm, std::abs(y["sum"].get<double>()));
    }
    norm = std::max(norm, scale_floor);
    auto cmp = [&](double u, double v, double scale) {
      max_abs = std::max(max_abs, std::abs(u - v));
      rel = std::max(rel, std::abs(u - v) / std::max(scale, 1e-300));
    };
    cmp(x["sum"].get<double>(), y["sum"].get<double>(), std::max(std::abs(y["sum"].get<double>()), norm));
    // A side whose gradient was a partial sum on each rank has no sum of squares: the
    // linear statistics (sum, sketch) are compared then.
    if (x.contains("sum_sq") && y.contains("sum_sq")) {
      cmp(x["sum_sq"].get<double>(), y["sum_sq"].get<double>(), std::max(y["sum_sq"].get<double>(), norm * norm));
    }
    if (x.value("numel", int64_t{-1}) != y.value("numel", int64_t{-1})) {
      rel = std::numeric_limits<double>::infinity();
      e.counts = "holds " + std::to_string(x.value("numel", int64_t{-1})) + " elements, the reference's " +
                 std::to_string(y.value("numel", int64_t{-1})) +
                 " (a piece recorded without its global layout, or a micro-batch it missed)";
    }
    if (x["sketch"].size() != y["sketch"].size()) rel = std::numeric_limits<double>::infinity();
    for (size_t j = 0; j < std::min(x["sketch"].size(), y["sketch"].size()); ++j) {
      cmp(x["sketch"][j].get<double>(), y["sketch"][j].get<double>(), norm);
    }
  }
  if (x.value("nonfinite", 0) != y.value("nonfinite", 0)) rel = std::numeric_limits<double>::infinity();
  return e;
}

std::string module_of_parameter(const std::string& fqn) {
  std::string name = fqn.substr(0, fqn.find('/'));
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

Localization localize(const Comparison& c, bool resumed) {
  if (c.divergences.empty()) return {};
  int64_t step = std::numeric_limits<int64_t>::max();
  for (const auto& d : c.divergences) step = std::min(step, d.step);
  std::vector<const Divergence*> at;
  for (const auto& d : c.divergences) {
    if (d.step == step) at.push_back(&d);
  }
  const std::string when = " at step " + std::to_string(step);
  // What the activation probes could not see. Nothing observed: every statement about module
  // outputs would be vacuous. Some modules unobserved: a fault in one shows first in a later
  // observed output, or in the loss.
  const bool blind = c.activation_order.empty();
  const std::string no_activations =
      "no module outputs were observed (the port never calls ParallelContext::observe)";
  const std::string how_to_observe =
      "add ctx.observe(module, output, layout) to each module's forward (as the scaffold's model.h does) to "
      "localize the first module that diverges";
  std::string partly;
  if (!blind && !c.unobserved_modules.empty()) {
    std::string names;
    for (size_t i = 0; i < c.unobserved_modules.size() && i < 3; ++i) {
      names += (i ? ", '" : "'") + c.unobserved_modules[i] + "'";
    }
    if (c.unobserved_modules.size() > 3) names += ", ...";
    partly = "; only some modules were observed: " + std::to_string(c.unobserved_modules.size()) + " of the " +
             std::to_string(c.parameter_modules) + " modules with parameters are under no observed module (" + names +
             "), so a fault in them shows first in a later observed output or the loss (observe them with "
             "ctx.observe to localize it)";
  }
  // "; its parameters whose gradients diverge: 'm.router', ..." for the module `m` blamed.
  auto diverging_parameters = [&](const std::string& module) {
    std::string names;
    int n = 0;
    for (const Divergence* d : at) {
      if (d->kind != "tensor" || d->stage != "grad_before_clip" || d->name.rfind(module + ".", 0) != 0) continue;
      if (++n > 3) {
        names += ", ...";
        break;
      }
      names += (names.empty() ? "'" : ", '") + d->name + "'";
    }
    return names.empty() ? std::string() : "; its parameters whose gradients diverge: " + names;
  };
  auto find = [&](const std::string& kind, const std::string& stage_or_name) -> const Divergence* {
    for (const Divergence* d : at) {
      if (d->kind == kind && (d->stage == stage_or_name || d->name == stage_or_name)) return d;
    }
    return nullptr;
  };
  if (const Divergence* d = find("input", "metrics")) {
    return {"data", "the global batch" + when + " differs from the reference's (" + d->name + ")"};
  }
  if (const Divergence* d = find("tensor", "model_before")) {
    if (resumed) return {"checkpoint", "the parameters loaded before step " + std::to_string(step) +
                                           " already differ ('" + d->name + "')"};
    return {module_of_parameter(d->name), "parameter '" + d->name + "' differs before step " + std::to_string(step) +
                                              " runs (its initialization or an earlier update)"};
  }
  // The modules of the step in forward order, as the activation divergences list them.
  if (const Divergence* d = find("activation", "forward_output")) {
    const bool first = !c.activation_order.empty() && c.activation_order.front() == d->name;
    return {d->name, "its forward output is the first to diverge" + when + " in forward order; " +
                         (first ? std::string("it is the first module observed")
                                : partly.empty() ? "every module before it matches"
                                                 : "every observed module before it matches") +
                         partly};
  }
  if (find("metric", "loss")) {
    if (blind) {
      return {"loss", no_activations + ": the blame cannot go below 'loss'; the loss differs" + when + "; " +
                          how_to_observe};
    }
    return {"loss", (partly.empty() ? "every module's" : "every observed module's") +
                        std::string(" forward output matches") + when + " and the loss differs" + partly};
  }
  const Divergence* grad = find("activation", "output_grad");
  if (grad) {
    // Backward order: the order of the output_grad stage reversed. The first divergent output
    // gradient in it was produced by the backward of the module before it.
    const std::vector<std::string>& order = c.activation_order;
    std::set<std::string> divergent;
    for (const Divergence* d : at) {
      if (d->kind == "activation" && d->stage == "output_grad") divergent.insert(d->name);
    }
    std::string previous;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      if (divergent.count(*it)) {
        if (previous.empty()) {
          return {"loss", "every forward output matches" + when + " up to the head, and the gradient of the loss "
                          "with respect to the head's output ('" + *it + "') differs: the loss or its normalization" +
                          partly};
        }
        return {previous, "the forward outputs match" + when + "; walking backward, its output gradient is the last "
                          "that matches and the next one, of '" + *it + "', is the first to diverge: the gradient its "
                          "backward passes on is wrong" + diverging_parameters(previous) + partly};
      }
      previous = *it;
    }
    return {grad->name, "its output gradient is the first to diverge" + when};
  }
  if (const Divergence* d = find("tensor", "grad_before_clip")) {
    return {module_of_parameter(d->name), (blind ? no_activations + "; the loss matches" + when
                                                 : "the activations and their gradients match" + when) +
                                              "; the gradient of parameter '" + d->name +
                                              "' is the first to diverge: its module's weight gradient or its "
                                              "reduction" + (blind ? "; " + how_to_observe : partly)};
  }
  if (find("metric", "grad_norm_pre_clip") || find("metric", "grad_norm_post_clip")) {
    return {"grad_norm", "every gradient matches" + when + " and the global grad norm differs"};
  }
  if (const Divergence* d = find("tensor", "grad_after_clip")) {
    return {"grad_norm", "the gradients match before clipping" + when + " and differ after it ('" + d->name + "')"};
  }
  const Divergence& d = *at.front();
  if (d.kind == "tensor" || d.kind == "metric") {
    return {"optimizer", "the gradients match" + when + " and the update does not ('" + d.name + "', " + d.stage + ")"};
  }
  return {d.name, d.message};
}

Comparison compare_evidence(const fs::path& reference, const fs::path& candidate, const CompareOptions& o) {
  MIH_CHECK(std::isfinite(o.tolerance) && o.tolerance >= 0, "compare: the tolerance must be a finite number >= 0, got ",
            o.tolerance);
  const EvidenceDir ref = EvidenceDir::open_existing(reference), cand = EvidenceDir::open_existing(candidate);
  // Evidence of two specs has nothing to compare: say so rather than a first "divergence".
  auto spec_of = [](const EvidenceDir& d) -> std::string {
    std::string text;
    if (!read_file(d.root() / layout::kSpecResolved, &text)) return "";
    const nlohmann::json j = parse_json_lenient(text);
    return j.is_object() ? j.value("name", "") : "";
  };
  const std::string ref_spec = spec_of(ref), cand_spec = spec_of(cand);
  MIH_CHECK_CODE(ref_spec.empty() || cand_spec.empty() || ref_spec == cand_spec, Code::kFailedPrecondition,
                 "compare: the reference ", reference.string(), " is evidence of spec '", ref_spec, "', the candidate ",
                 candidate.string(), " of spec '", cand_spec, "'; compare two cases of one spec");
  Comparison out;
  const std::string metrics_file = layout::kMetrics, probes_file = layout::kProbes;
  const auto ref_metrics = rows_by_step(read_required(ref, metrics_file), (reference / metrics_file).string());
  const auto cand_metrics = rows_by_step(read_required(cand, metrics_file), (candidate / metrics_file).string());
  std::vector<int64_t> steps;
  for (const auto& [step, row] : cand_metrics) {
    if (step >= o.first_step && ref_metrics.count(step)) steps.push_back(step);
  }
  MIH_CHECK_CODE(!steps.empty(), Code::kFailedPrecondition, "evidence ", candidate.string(), " and reference ",
                 reference.string(), " have no step in common at or after step ", o.first_step);

  // Both sides must hold the same quantities: what one side recorded and the other did not
  // is a divergence naming the side that lacks it, never a silent skip.
  auto missing_text = [](const std::string& side) {
    return "recorded by the " + std::string(side == "candidate" ? "reference" : "candidate") + ", missing from the " +
           side;
  };
  auto add = [&](Divergence d) {
    if (!o.calibration) d.tolerance = o.tolerance;
    const std::string what = d.kind == "input"    ? "input field '"
                             : d.kind == "metric" ? "metric '"
                             : d.kind == "activation" ? (d.stage == "forward_output" ? "forward output of module '"
                                                                                     : "output gradient of module '")
                                                      : "parameter '";
    std::string why;
    if (!d.message.empty()) {  // the caller's reason (element counts that differ)
      why = d.message;
    } else if (d.kind == "input") {
      why = "hash differs from the reference";
    } else if (!d.missing_from.empty()) {
      why = missing_text(d.missing_from);
    } else {
      why = "max abs error " + fmt(d.max_abs_error) + ", relative error " + fmt(d.relative_error) + " > tolerance " +
            fmt(d.tolerance);
      if (o.calibration) {
        const Calibration& cal = *o.calibration;
        const Measurement m{d.kind, d.name, d.step, d.stage, d.relative_error, d.max_abs_error};
        const std::string rule = "tolerance = " + (cal.factor != 1 ? fmt(cal.factor) + " x " : std::string()) + "max(" +
                                 fmt(Calibration::updated_parameter(m) ? cal.k_update : cal.k) + " x noise, " +
                                 fmt(cal.floor_eps) + " x " +
                                 (cal.floor_epsilon(m) == cal.epsilon ? cal.dtype : std::string("float32")) + " epsilon)";
        why += d.noise > 0 ? " (error / noise " + fmt(d.relative_error / d.noise) + ": noise " + fmt(d.noise) +
                                 " between the lane's reference and its noise twin; " + rule + ")"
               : d.noise == 0 ? " (the twin measured no noise here, so the floor decides; " + rule + ")"
                              : " (the noise twin did not record this quantity, so the floor decides; " + rule + ")";
      }
    }
    d.message = what + d.name + "' at step " + std::to_string(d.step) +
                (d.stage == "metrics" ? "" : ", stage " + d.stage) + ": " + why + " (open " + d.evidence + ")";
    out.divergences.push_back(std::move(d));
  };
  auto add_missing = [&](const std::string& kind, const std::string& name, int64_t step, const std::string& stage,
                         const std::string& side, const std::string& file) {
    Divergence d{kind, name, step, stage, 0, std::numeric_limits<double>::infinity(), 0, file, "", ""};
    d.missing_from = side;
    add(std::move(d));
  };
  // Records a measurement and, beyond its tolerance (the calibration's, or the one given), a
  // divergence.
  auto check = [&](Measurement m, const std::string& file, const std::string& counts) {
    double tolerance = o.tolerance, noise = 0;
    if (o.calibration) {
      noise = o.calibration->noise_of(m);
      tolerance = o.calibration->tolerance_of(m);
    }
    if (!(m.relative_error <= tolerance)) {
      Divergence d{m.kind, m.name, m.step, m.stage, m.max_abs_error, m.relative_error, tolerance, file, counts, ""};
      d.noise = noise;
      add(std::move(d));
    }
    out.measurements.push_back(std::move(m));
  };
  for (const auto& [step, row] : ref_metrics) {
    if (step >= o.first_step && !cand_metrics.count(step)) {
      add_missing("metric", "step", step, "metrics", "candidate", (candidate / metrics_file).string());
    }
  }
  for (const auto& [step, row] : cand_metrics) {
    if (step >= o.first_step && !ref_metrics.count(step)) {
      add_missing("metric", "step", step, "metrics", "reference", (reference / metrics_file).string());
    }
  }

  // The watchlists give forward order (the candidate's, then any the reference adds);
  // optimizer states follow their parameter.
  std::vector<std::string> order;
  for (const EvidenceDir* side : {&cand, &ref}) {
    for (const auto& w : side->read_json(layout::kParameterWatchlist)) {
      const std::string fqn = w.at("fqn").get<std::string>();
      if (std::find(order.begin(), order.end(), fqn) != order.end()) continue;
      order.push_back(fqn);
      order.push_back(fqn + "/exp_avg");
      order.push_back(fqn + "/exp_avg_sq");
    }
  }
  std::map<std::pair<int64_t, std::string>, json> ref_probes, cand_probes;
  for (auto [side, probes, dir] : {std::tuple{&ref, &ref_probes, &reference}, std::tuple{&cand, &cand_probes, &candidate}}) {
    *probes = rows_by_step_and(read_required(*side, probes_file), (*dir / probes_file).string(), "stage");
  }
  // A session probes the parameters before a step only at its first step: later, they are the
  // parameters after the previous step's optimizer.
  for (auto* side : {&ref_probes, &cand_probes}) {
    std::set<int64_t> steps_seen;
    for (const auto& [key, line] : *side) steps_seen.insert(key.first);
    for (int64_t s : steps_seen) {
      auto after = side->find({s - 1, "after_optimizer"});
      if (!side->count({s, "model_before"}) && after != side->end()) {
        json line = after->second;
        line["stage"] = "model_before";
        line["step"] = s;
        (*side)[{s, "model_before"}] = line;
      }
    }
  }
  const std::string metrics_path = (candidate / metrics_file).string(), probes_path = (candidate / probes_file).string();

  for (int64_t step : steps) {
    const json& a = cand_metrics.at(step);
    const json& b = ref_metrics.at(step);
    ++out.compared;
    if (a.value("input_hash", "") != b.value("input_hash", "")) {
      add({"input", "global batch", step, "metrics", 0, 0, 0, (candidate / layout::kInputIdentity).string(), "", ""});
    }
    for (const char* m : {"loss", "grad_norm_pre_clip", "grad_norm_post_clip", "lr"}) {
      ++out.compared;
      // A non-finite metric is written as null (JSON has no NaN): NaN here, which no tolerance
      // holds, so a divergence, never a crash.
      const double x = a.at(m).is_number() ? a.at(m).get<double>() : NAN;
      const double y = b.at(m).is_number() ? b.at(m).get<double>() : NAN;
      const double abs = std::abs(x - y), rel = abs / std::max(std::abs(y), 1e-300);
      check({"metric", m, step, "metrics", rel, abs}, metrics_path, "");
    }
    for (const auto& stage : kStages) {
      auto ia = cand_probes.find({step, stage});
      auto ib = ref_probes.find({step, stage});
      if (ia == cand_probes.end() && ib == ref_probes.end()) continue;  // a stage neither side records
      // Activations, clipped gradients and optimizer states are probed at a run's first two
      // steps and its last: a resumed run's first step is one its uninterrupted twin may not
      // probe.
      const bool scheduled = activation_stage(stage) || stage == "optimizer_state" || stage == "grad_after_clip";
      if ((ia == cand_probes.end() || ib == ref_probes.end()) && scheduled && o.first_step > 0) {
        continue;
      }
      if (ia == cand_probes.end() || ib == ref_probes.end()) {
        const bool cand_lacks = ia == cand_probes.end();
        add_missing("tensor", "(every watched tensor)", step, stage, cand_lacks ? "candidate" : "reference",
                    ((cand_lacks ? candidate : reference) / probes_file).string());
        continue;
      }
      const json& ta = ia->second["tensors"];
      const json& tb = ib->second["tensors"];
      // Modules in forward order: the candidate's, then any the reference adds.
      std::vector<std::string> modules;
      if (activation_stage(stage)) {
        for (const json* line : {&ia->second, &ib->second}) {
          for (const auto& m : line->value("order", json::array())) {
            if (std::find(modules.begin(), modules.end(), m.get<std::string>()) == modules.end()) {
              modules.push_back(m.get<std::string>());
            }
          }
        }
      }
      const std::string kind = activation_stage(stage) ? "activation" : "tensor";
      if (stage == "output_grad" && out.activation_order.empty()) out.activation_order = modules;
      for (const auto& name : activation_stage(stage) ? modules : order) {
        if (!ta.contains(name) && !tb.contains(name)) continue;  // an optimizer state of a frozen parameter
        ++out.compared;
        if (!ta.contains(name) || !tb.contains(name)) {
          const bool cand_lacks = !ta.contains(name);
          add_missing(kind, name, step, stage, cand_lacks ? "candidate" : "reference",
                      ((cand_lacks ? candidate : reference) / probes_file).string());
          continue;
        }
        // A gradient zero in exact arithmetic is rounding residue on both sides (CLIP's key
        // bias: softmax ignores a shift common to every key), and so are its AdamW moments:
        // measured against the step's gradient norm when the reference's is below the
        // tolerance of it (fixed-tolerance lanes; a calibrated lane's noise twin measures the
        // residue itself).
        const double floor = o.calibration ? 0 : cancellation_scale(stage, name, b, tb[name], o.tolerance);
        const TensorError e = tensor_error(ta[name], tb[name], floor);
        check({kind, name, step, stage, e.relative, e.max_abs}, probes_path, e.counts);
      }
    }
  }
  // The modules with parameters, and those no observed module is or contains.
  std::vector<std::string> parameters;
  std::string structure_text;
  if (read_file(cand.root() / layout::kStructure, &structure_text)) {
    const json structure = parse_json_lenient(structure_text);
    if (structure.is_object() && structure.contains("parameters") && structure["parameters"].is_array()) {
      for (const auto& p : structure["parameters"]) {
        if (p.is_object() && p.contains("fqn") && p["fqn"].is_string()) parameters.push_back(p["fqn"].get<std::string>());
      }
    }
  }
  if (parameters.empty()) {
    for (const auto& fqn : order) {
      if (fqn.find('/') == std::string::npos) parameters.push_back(fqn);
    }
  }
  std::set<std::string> modules;
  for (const auto& p : parameters) modules.insert(module_of_parameter(p));
  out.parameter_modules = static_cast<int64_t>(modules.size());
  for (const auto& m : modules) {
    const bool seen = std::any_of(out.activation_order.begin(), out.activation_order.end(), [&](const std::string& o) {
      return m == o || m.rfind(o + ".", 0) == 0;
    });
    if (!seen) out.unobserved_modules.push_back(m);
  }
  return out;
}

}  // namespace mih
