// The comparison's measures (see compare.h): the calibration of a lane, a tensor's error, the
// localization of a comparison's first divergence; compare_evidence is in compare_evidence.cpp.
#include "harness/compare/compare.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "harness/base/error.h"

namespace mih {

using nlohmann::json;

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

// "; not compared: ..." naming the module outputs a writer could not place, or "".
std::string unplaced_text(const Comparison& c) {
  if (c.unplaced_modules.empty()) return "";
  std::string names;
  for (size_t i = 0; i < c.unplaced_modules.size() && i < 4; ++i) {
    names += (i ? ", '" : "'") + c.unplaced_modules[i] + "'";
  }
  if (c.unplaced_modules.size() > 4) names += ", ...";
  return "; not compared: the outputs of " + std::to_string(c.unplaced_modules.size()) + " module(s) (" + names +
         ") whose layout on the mesh the writer could not see (plain tensors the ranks of a tp or cp group hold "
         "differently)";
}

std::string Comparison::summary() const {
  if (passed()) return "match: " + std::to_string(compared) + " quantities within tolerance" + unplaced_text(*this);
  const Localization where = localize(*this);
  return "localized to '" + where.blamed + "': " + where.reason + "; first divergence: " + divergences[0].message + " (" +
         std::to_string(divergences.size()) + " of " + std::to_string(compared) + " quantities diverge)" +
         unplaced_text(*this);
}

double record_norm(const json& r) {
  if (r.contains("values")) {
    double sq = 0;
    for (const auto& v : r["values"]) sq += v.is_number() ? v.get<double>() * v.get<double>() : 0.0;
    return std::sqrt(sq);
  }
  if (r.contains("sum_sq") && r["sum_sq"].is_number()) return std::sqrt(std::max(r["sum_sq"].get<double>(), 0.0));
  double norm = 0;
  for (const auto& v : r.at("sketch")) norm = std::max(norm, v.is_number() ? std::abs(v.get<double>()) : 0.0);
  return norm;
}

double cancellation_scale(const std::string& stage, const std::string& name,
                          const contract::MetricsRow& reference_metrics, const json& reference_record, double tolerance) {
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
  if (!metric) return 0;
  double scale = reference_metrics.metric(metric);  // NaN when not finite: no scale
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
    if (x.at("numel") != y.at("numel")) {
      rel = std::numeric_limits<double>::infinity();
      e.counts = "holds " + std::to_string(x.at("numel").get<int64_t>()) + " elements, the reference's " +
                 std::to_string(y.at("numel").get<int64_t>()) +
                 " (a piece recorded without its global layout, or a micro-batch it missed)";
    }
    if (x["sketch"].size() != y["sketch"].size()) rel = std::numeric_limits<double>::infinity();
    for (size_t j = 0; j < std::min(x["sketch"].size(), y["sketch"].size()); ++j) {
      cmp(x["sketch"][j].get<double>(), y["sketch"][j].get<double>(), norm);
    }
  }
  if (x.at("nonfinite") != y.at("nonfinite")) rel = std::numeric_limits<double>::infinity();
  return e;
}

std::string module_of_parameter(const std::string& fqn) {
  std::string name = fqn.substr(0, fqn.find('/'));
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

namespace {

const char kNoActivations[] = "no module outputs were observed (the port never calls ParallelContext::observe)";
const char kHowToObserve[] =
    "add ctx.observe(module, output, layout) to each module's forward (as the scaffold's model.h does) to "
    "localize the first module that diverges";

// The divergences of a comparison's first divergent step, and what its probes could see.
struct FirstStep {
  int64_t step = 0;
  std::vector<const Divergence*> at;
  std::string when;  // " at step <s>"
  // Nothing observed: every statement about module outputs would be vacuous.
  bool blind = false;
  // Some modules unobserved: a fault in one shows first in a later observed output, or in the
  // loss ("; only some modules were observed: ..."), else "".
  std::string partly;

  const Divergence* find(const std::string& kind, const std::string& stage_or_name) const {
    for (const Divergence* d : at) {
      if (d->kind == kind && (d->stage == stage_or_name || d->name == stage_or_name)) return d;
    }
    return nullptr;
  }
};

std::string partly_observed(const Comparison& c) {
  if (c.activation_order.empty() || c.unobserved_modules.empty()) return "";
  std::string names;
  for (size_t i = 0; i < c.unobserved_modules.size() && i < 3; ++i) {
    names += (i ? ", '" : "'") + c.unobserved_modules[i] + "'";
  }
  if (c.unobserved_modules.size() > 3) names += ", ...";
  return "; only some modules were observed: " + std::to_string(c.unobserved_modules.size()) + " of the " +
         std::to_string(c.parameter_modules) + " modules with parameters are under no observed module (" + names +
         "), so a fault in them shows first in a later observed output or the loss (observe them with "
         "ctx.observe to localize it)";
}

FirstStep first_step(const Comparison& c) {
  FirstStep f;
  f.step = std::numeric_limits<int64_t>::max();
  for (const auto& d : c.divergences) f.step = std::min(f.step, d.step);
  for (const auto& d : c.divergences) {
    if (d.step == f.step) f.at.push_back(&d);
  }
  f.when = " at step " + std::to_string(f.step);
  f.blind = c.activation_order.empty();
  f.partly = partly_observed(c);
  return f;
}

// "; its parameters whose gradients diverge: 'm.router', ..." for the module `module` blamed.
std::string diverging_parameters(const FirstStep& f, const std::string& module) {
  std::string names;
  int n = 0;
  for (const Divergence* d : f.at) {
    if (d->kind != "tensor" || d->stage != "grad_before_clip" || d->name.rfind(module + ".", 0) != 0) continue;
    if (++n > 3) {
      names += ", ...";
      break;
    }
    names += (names.empty() ? "'" : ", '") + d->name + "'";
  }
  return names.empty() ? std::string() : "; its parameters whose gradients diverge: " + names;
}

// The input, or the parameters before the step; nothing when neither diverges.
std::optional<Localization> before_the_step(const FirstStep& f, bool resumed) {
  if (const Divergence* d = f.find("input", "metrics")) {
    return Localization{"data", "the global batch" + f.when + " differs from the reference's (" + d->name + ")"};
  }
  if (const Divergence* d = f.find("tensor", "model_before")) {
    if (resumed) {
      return Localization{"checkpoint", "the parameters loaded before step " + std::to_string(f.step) +
                                            " already differ ('" + d->name + "')"};
    }
    return Localization{module_of_parameter(d->name), "parameter '" + d->name + "' differs before step " +
                                                          std::to_string(f.step) +
                                                          " runs (its initialization or an earlier update)"};
  }
  return std::nullopt;
}

// The forward: the first module whose output diverges in forward order, else the loss.
std::optional<Localization> in_the_forward(const Comparison& c, const FirstStep& f) {
  if (const Divergence* d = f.find("activation", "forward_output")) {
    const bool first = !c.activation_order.empty() && c.activation_order.front() == d->name;
    return Localization{d->name, "its forward output is the first to diverge" + f.when + " in forward order; " +
                                     (first ? std::string("it is the first module observed")
                                            : f.partly.empty() ? "every module before it matches"
                                                               : "every observed module before it matches") +
                                     f.partly};
  }
  if (!f.find("metric", "loss")) return std::nullopt;
  if (f.blind) {
    return Localization{"loss", std::string(kNoActivations) + ": the blame cannot go below 'loss'; the loss differs" +
                                    f.when + "; " + kHowToObserve};
  }
  return Localization{"loss", (f.partly.empty() ? "every module's" : "every observed module's") +
                                  std::string(" forward output matches") + f.when + " and the loss differs" + f.partly};
}

// The backward: in backward order (the output_grad stage's order reversed), the first divergent
// output gradient was produced by the backward of the module before it.
std::optional<Localization> in_the_backward(const Comparison& c, const FirstStep& f) {
  const Divergence* grad = f.find("activation", "output_grad");
  if (!grad) return std::nullopt;
  std::set<std::string> divergent;
  for (const Divergence* d : f.at) {
    if (d->kind == "activation" && d->stage == "output_grad") divergent.insert(d->name);
  }
  std::string previous;
  for (auto it = c.activation_order.rbegin(); it != c.activation_order.rend(); ++it) {
    if (!divergent.count(*it)) {
      previous = *it;
      continue;
    }
    if (previous.empty()) {
      return Localization{"loss", "every forward output matches" + f.when + " up to the head, and the gradient of the "
                                  "loss with respect to the head's output ('" + *it + "') differs: the loss or its "
                                  "normalization" + f.partly};
    }
    return Localization{previous, "the forward outputs match" + f.when + "; walking backward, its output gradient is "
                                  "the last that matches and the next one, of '" + *it + "', is the first to diverge: "
                                  "the gradient its backward passes on is wrong" + diverging_parameters(f, previous) +
                                  f.partly};
  }
  return Localization{grad->name, "its output gradient is the first to diverge" + f.when};
}

// After the activations: a parameter's gradient, the grad norm, clipping, the update.
Localization after_the_backward(const FirstStep& f) {
  if (const Divergence* d = f.find("tensor", "grad_before_clip")) {
    return {module_of_parameter(d->name), (f.blind ? std::string(kNoActivations) + "; the loss matches" + f.when
                                                   : "the activations and their gradients match" + f.when) +
                                              "; the gradient of parameter '" + d->name +
                                              "' is the first to diverge: its module's weight gradient or its "
                                              "reduction" + (f.blind ? "; " + std::string(kHowToObserve) : f.partly)};
  }
  if (f.find("metric", "grad_norm_pre_clip") || f.find("metric", "grad_norm_post_clip")) {
    return {"grad_norm", "every gradient matches" + f.when + " and the global grad norm differs"};
  }
  if (const Divergence* d = f.find("tensor", "grad_after_clip")) {
    return {"grad_norm", "the gradients match before clipping" + f.when + " and differ after it ('" + d->name + "')"};
  }
  const Divergence& d = *f.at.front();
  if (d.kind == "tensor" || d.kind == "metric") {
    return {"optimizer", "the gradients match" + f.when + " and the update does not ('" + d.name + "', " + d.stage + ")"};
  }
  return {d.name, d.message};
}

}  // namespace

Localization localize(const Comparison& c, bool resumed) {
  if (c.divergences.empty()) return {};
  const FirstStep f = first_step(c);
  if (auto l = before_the_step(f, resumed)) return *l;
  if (auto l = in_the_forward(c, f)) return *l;
  if (auto l = in_the_backward(c, f)) return *l;
  return after_the_backward(f);
}

}  // namespace mih
