// A case compared with the golden of the original model (see golden.h): the comparison of
// its hidden states, logits and gradients, and the MatchesOriginal verdict.
#include "harness/cases/golden.h"

#include <fnmatch.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

#include <ATen/ATen.h>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/contract/metrics_row.h"
#include "harness/contract/probe_row.h"
#include "harness/contract/row_schema.h"
#include "harness/base/json_fields.h"
#include "harness/cases/hf_interop.h"
#include "harness/cases/memo.h"
#include "harness/checkpoint/hf_checkpoint.h"
#include "harness/checkpoint/key_map.h"
#include "harness/checkpoint/safetensors.h"
#include "harness/evidence/evidence_store.h"
#include "harness/parallel/activations.h"
#include "harness/base/strings.h"

namespace mih::cases {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

bool matches_any(const std::vector<std::string>& globs, const std::string& name) {
  for (const auto& g : globs) {
    if (::fnmatch(g.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

// The probes' statistics of a golden tensor, in the same global coordinates (row-major
// element index: a world-size-1 reference's activation [B, S, F] and a parameter's global
// shape both flatten that way), with as many projections as the evidence's record `like`
// and its values when the record holds them (a small tensor, compared elementwise).
json golden_statistics(const at::Tensor& t, const json& like) {
  at::Tensor x = t.reshape({-1}).to(at::kDouble).contiguous();
  const at::Tensor finite = at::isfinite(x);
  const int64_t n = x.numel();
  const int64_t nonfinite = n - finite.sum().item<int64_t>();
  x = at::where(finite, x, at::zeros_like(x));
  json s = {{"sum", x.sum().item<double>()},
            {"sum_sq", at::dot(x, x).item<double>()},
            {"nonfinite", nonfinite},
            {"numel", n}};
  const at::Tensor index = at::arange(n, at::kLong);
  std::vector<double> sketch;
  const size_t k = like.contains("sketch") && like["sketch"].is_array() ? like["sketch"].size() : 0;
  // Summed in another order than the probes' (their rounding differs: summation_scale).
  for (size_t j = 0; j < k; ++j) sketch.push_back(at::dot(x, projection_signs(index, static_cast<int64_t>(j))).item<double>());
  s["sketch"] = sketch;
  if (like.contains("values") && like["values"].is_array() && static_cast<int64_t>(like["values"].size()) == n) {
    s["values"] = std::vector<double>(x.data_ptr<double>(), x.data_ptr<double>() + n);
  }
  return s;
}

// One quantity before its tolerance is known.
struct Entry {
  Measurement m;
  std::vector<std::string> golden;  // the golden tensors it came from
  std::string file;                 // the evidence file to open
  std::string counts;               // why the element counts differ
  std::string missing_from;         // "candidate" or "golden" when one side lacks it
  // sqrt(elements) when compared through the probes' statistics (sums and sketches over the
  // whole tensor, each summed in its own order on either side), 0 when elementwise.
  double summation = 0;
};

// How the statistics of two equal tensors can differ: a sum of n terms summed in another order
// rounds differently by about epsilon x sqrt(n) of the tensor's L2 norm (the probes' order and
// golden_statistics' are not the same, and neither is the original's).
double summation_scale(const json& record) {
  if (record.contains("values")) return 0;
  return std::sqrt(static_cast<double>(std::max<int64_t>(record.at("numel").get<int64_t>(), 1)));
}

// The kind of quantity a golden tensor name is, for the evidence's per-kind figures.
std::string kind_of(const std::string& golden_name) {
  if (golden_name == "loss") return "loss";
  if (golden_name == "logits") return "logits";
  if (golden_name.rfind("hidden_states.", 0) == 0) return "hidden_states";
  if (golden_name.rfind("grad.", 0) == 0) return "gradients";
  return "parameters_after_step";
}

// The golden's tensors, each read as the float64 it must be.
struct GoldenTensors {
  safetensors::Reader reader;
  at::Tensor load(const std::string& name) const {
    const safetensors::TensorInfo& info = reader.info(name);
    MIH_CHECK(info.dtype == "F64", reader.path().string(), ": tensor '", name, "' is ", info.dtype,
              "; a golden holds float64");
    at::Tensor t = at::empty(info.shape, at::TensorOptions().dtype(at::kDouble));
    reader.read(name, t.data_ptr());
    return t;
  }
};

// The loss at step 0.
Entry loss_entry(const verdicts::CaseEvidence& ev, const GoldenTensors& g) {
  Entry e{{"metric", "loss", 0, "metrics", 0, 0}, {"loss"}, (ev.dir() / layout::kMetrics).string(), "", ""};
  const std::map<int64_t, contract::MetricsRow> rows =
      contract::metrics_rows(ev.jsonl(layout::kMetrics), (ev.dir() / layout::kMetrics).string());
  const auto row = rows.find(0);
  if (row == rows.end()) {
    e.missing_from = "candidate";
  } else if (!g.reader.contains("loss")) {
    e.missing_from = "golden";
  } else {
    const double x = row->second.loss, y = g.load("loss").item<double>();
    e.m.max_abs_error = std::abs(x - y);
    e.m.relative_error = e.m.max_abs_error / std::max(std::abs(y), 1e-300);
  }
  return e;
}

// `e` measured from the probes' record against the golden tensor `t`.
void measure_tensor(Entry& e, const json& record, const at::Tensor& t) {
  const TensorError err = tensor_error(record, golden_statistics(t, record));
  e.m.relative_error = err.relative;
  e.m.max_abs_error = err.max_abs;
  e.counts = err.counts;
  e.summation = summation_scale(record);
}

// Forward outputs of the mapped modules, in the forward order the probes recorded (`order`).
void add_activations(const spec::ModelSpec& spec, const contract::ProbeRow* forward, const GoldenTensors& g,
                     const std::string& probes_file, std::vector<std::string>& order, std::vector<Entry>& entries) {
  std::map<std::string, std::string> mapped;  // module -> golden tensor
  for (const auto& [module, index] : spec.golden.layers) mapped[module] = "hidden_states." + std::to_string(index);
  if (!spec.golden.logits.empty()) mapped[spec.golden.logits] = "logits";
  if (forward) order.insert(order.end(), forward->order.begin(), forward->order.end());
  std::vector<std::string> modules;
  for (const auto& m : order) {
    if (mapped.count(m)) modules.push_back(m);
  }
  for (const auto& [m, name] : mapped) {
    if (std::find(modules.begin(), modules.end(), m) == modules.end()) modules.push_back(m);
  }
  const json& recorded = forward ? forward->tensors : json::object();
  for (const auto& module : modules) {
    Entry e{{"activation", module, 0, "forward_output", 0, 0}, {mapped[module]}, probes_file, "", ""};
    if (!recorded.contains(module)) {
      e.missing_from = "candidate";
    } else if (!g.reader.contains(mapped[module])) {
      e.missing_from = "golden";
    } else {
      measure_tensor(e, recorded[module], g.load(mapped[module]));
    }
    entries.push_back(e);
  }
}

// Every watched parameter's tensor at `stage_name` (its gradient, or its value after the
// step), rebuilt from the golden's external tensors `prefix`<key> through the key map.
void add_parameters(const spec::ModelSpec& spec, const verdicts::CaseEvidence& ev, const std::string& stage_name,
                    const std::string& prefix, const json& tensors, const GoldenTensors& g, std::vector<Entry>& entries) {
  const KeyMap map(spec.checkpoint.key_map);
  const json& watchlist = ev.json(layout::kParameterWatchlist);
  contract::require_schema(layout::kParameterWatchlist, watchlist, (ev.dir() / layout::kParameterWatchlist).string());
  const std::string probes_file = (ev.dir() / layout::kProbes).string();
  bool whole_model = false;
  for (const auto& w : watchlist) whole_model = whole_model || w.at("reason").get<std::string>().rfind("whole model", 0) == 0;
  std::set<std::string> consumed;
  for (const auto& w : watchlist) {
    const std::string fqn = w.at("fqn").get<std::string>();
    if (matches_any(spec.checkpoint.training_only, fqn)) continue;
    std::vector<std::string> keys = map.external_keys(fqn), names, absent;
    for (const auto& k : keys) {
      names.push_back(prefix + k);
      consumed.insert(prefix + k);
      if (!g.reader.contains(prefix + k)) absent.push_back(prefix + k);
    }
    // defined_ranks: absent when every rank defined the tensor (the schema's optional field).
    const bool recorded_here = tensors.contains(fqn) && (!tensors[fqn].contains("defined_ranks") ||
                                                         tensors[fqn]["defined_ranks"].get<int64_t>() > 0);
    // A frozen parameter: no gradient on either side.
    if (!recorded_here && absent.size() == names.size() && stage_name == "grad_before_clip") continue;
    Entry e{{"tensor", fqn, 0, stage_name, 0, 0}, names, probes_file, "", ""};
    if (!recorded_here) {
      e.missing_from = "candidate";
    } else if (!absent.empty()) {
      e.missing_from = "golden";
      e.golden = absent;
    } else {
      std::map<std::string, at::Tensor> external;
      for (const auto& k : keys) external[k] = g.load(prefix + k);
      measure_tensor(e, tensors[fqn], map.from_external(fqn, external));
    }
    entries.push_back(e);
  }
  // A golden parameter no parameter of the port maps to (a whole-model watchlist covers
  // every parameter): the port lacks a weight of the original.
  if (whole_model) {
    for (const auto& name : g.reader.names()) {
      if (name.rfind(prefix, 0) != 0 || consumed.count(name)) continue;
      entries.push_back({{"tensor", name, 0, stage_name, 0, 0}, {name}, g.reader.path().string(), "", "candidate"});
    }
  }
}

// Tolerances: the lane's calibration, or the golden's own noise.
Calibration golden_calibration(const spec::ModelSpec& spec, const Golden& golden, const std::vector<Entry>& entries,
                               const Calibration* lane) {
  if (lane) return *lane;
  Comparison twin;
  for (const auto& e : entries) {
    double noise = -1;
    std::vector<std::string> sources = e.golden;
    // The loss is computed from the logits: its rounding noise is at least theirs (one
    // number gives one sample, and a twin's can agree to the last bit by chance).
    if (e.golden == std::vector<std::string>{"loss"}) sources.push_back("logits");
    for (const auto& n : sources) {
      const auto it = golden.noise.find(n);
      if (it != golden.noise.end()) noise = std::max(noise, it->second);
    }
    // Compared through statistics: at least their own rounding in another summation order,
    // which is float64's on both sides whatever precision the original computed in (that one
    // is the twin's noise: a float32 epsilon here would loosen a 4096-element tensor's
    // tolerance 64-fold past what transformers' float32 rounding moves it).
    if (noise >= 0 && e.summation > 0) noise = std::max(noise, dtype_epsilon("float64") * e.summation);
    if (noise >= 0) twin.measurements.push_back({e.m.kind, e.m.name, 0, e.m.stage, noise, 0});
  }
  Calibration settings;
  settings.k = spec.tolerances.noise_k;
  settings.k_update = spec.tolerances.noise_k_update;
  settings.floor_eps = spec.tolerances.noise_floor_eps;
  Calibration cal = calibrate(twin, "float64", settings);
  cal.epsilon = cal.master_epsilon = golden.compute_epsilon;
  if (golden.compute_epsilon > dtype_epsilon("float64")) cal.dtype = "float32";
  return cal;
}

// The entries judged: compare/golden.json's quantity rows, the largest error / tolerance and
// where, per kind the largest relative error.
struct Judged {
  json rows = json::array();
  double worst = 0;
  std::string worst_at;
  std::map<std::string, double> largest;  // kind -> largest relative error
};

// What an entry is and where, as its divergence's message begins and ends.
struct Wording {
  std::string what, where, open;
  Wording(const Entry& e, const std::string& golden_file)
      : what(e.m.kind == "metric" ? "metric '" : e.m.kind == "activation" ? "forward output of module '" : "parameter '"),
        where(e.m.stage == "metrics" ? "" : ", stage " + e.m.stage),
        open(" (open " + e.file + " and " + golden_file + ")") {}
};

// A quantity one side lacks: a divergence, and the worst of all.
void judge_missing(const Entry& e, const std::string& golden_names, const Wording& w, Comparison& c, Judged& j) {
  Divergence d{e.m.kind, e.m.name, 0, e.m.stage, 0, std::numeric_limits<double>::infinity(), 0, e.file, "", ""};
  d.missing_from = e.missing_from == "golden" ? "reference" : "candidate";
  d.message = w.what + e.m.name + "' at step 0" + w.where + ": " +
              (e.missing_from == "golden" ? "recorded by the port, missing from the golden (no " + golden_names + ")"
                                          : "in the golden (" + golden_names + "), not recorded by the port") +
              w.open;
  j.rows.push_back({{"kind", e.m.kind}, {"name", e.m.name}, {"golden", golden_names}, {"stage", e.m.stage},
                    {"missing_from", e.missing_from == "golden" ? "golden" : "port"}, {"passed", false}});
  c.divergences.push_back(std::move(d));
  j.worst = std::numeric_limits<double>::infinity();
  j.worst_at = e.m.kind + " '" + e.m.name + "' (missing)";
}

// Why a measured quantity is beyond its tolerance: the counts, or its error, noise and rule.
std::string beyond_tolerance(const Entry& e, const Calibration& cal, bool lane, double noise, double tolerance) {
  if (!e.counts.empty()) return e.counts;
  std::string rule = "tolerance = max(" + fmt(Calibration::updated_parameter(e.m) ? cal.k_update : cal.k) +
                     " x noise, " + fmt(cal.floor_eps) + " x " + fmt(cal.floor_epsilon(e.m)) + ")";
  if (lane) rule += ", the lane's calibration x " + fmt(cal.factor);
  return "max abs error " + fmt(e.m.max_abs_error) + ", relative error " + fmt(e.m.relative_error) + " > tolerance " +
         fmt(tolerance) +
         (noise > 0 ? " (error / noise " + fmt(e.m.relative_error / noise) + ": noise " + fmt(noise) +
                          (lane ? " between the lane's reference and its noise twin; "
                                : " between the golden's run and its noise twin; ") +
                          rule + ")"
                    : " (" + rule + ")");
}

// A measured quantity against its tolerance: its row, and a divergence when beyond it.
void judge_measured(const Entry& e, const std::string& golden_names, const Wording& w, const Calibration& cal, bool lane,
                    Comparison& c, Judged& j) {
  const double noise = cal.noise_of(e.m), tolerance = cal.tolerance_of(e.m);
  const double margin = tolerance > 0 ? e.m.relative_error / tolerance : (e.m.relative_error > 0 ? INFINITY : 0);
  const std::string kind = kind_of(e.golden.front());
  j.largest[kind] = std::max(j.largest[kind], e.m.relative_error);
  j.rows.push_back({{"kind", e.m.kind},
                    {"name", e.m.name},
                    {"golden", golden_names},
                    {"stage", e.m.stage},
                    {"error", std::isfinite(e.m.relative_error) ? json(e.m.relative_error) : json("inf")},
                    {"max_abs_error", e.m.max_abs_error},
                    {"noise", noise < 0 ? json() : json(noise)},
                    {"tolerance", tolerance},
                    {"error_over_tolerance", std::isfinite(margin) ? json(margin) : json("inf")},
                    {"passed", e.m.relative_error <= tolerance}});
  if (!(margin <= j.worst)) {
    j.worst = margin;
    j.worst_at = e.m.kind + " '" + e.m.name + "' (" + golden_names + ")";
  }
  if (!(e.m.relative_error <= tolerance)) {
    Divergence d{e.m.kind, e.m.name, 0, e.m.stage, e.m.max_abs_error, e.m.relative_error, tolerance, e.file, "", ""};
    d.noise = noise;
    d.message = w.what + e.m.name + "' at step 0" + w.where + " against the golden's " + golden_names + ": " +
                beyond_tolerance(e, cal, lane, noise, tolerance) + w.open;
    c.divergences.push_back(std::move(d));
  }
  c.measurements.push_back(e.m);
}

// compare/golden.json: the golden, the rule, the judged quantities and the worst of them.
json golden_evidence(const Golden& golden, const verdicts::CaseEvidence& ev, bool lane, const Calibration& cal,
                     const Judged& j, bool passed) {
  json per_kind = json::object();
  for (const auto& [k, v] : j.largest) per_kind[k] = std::isfinite(v) ? json(v) : json("inf");
  return {{"golden",
           {{"dir", golden.dir.string()},
            {"implementation", golden.implementation},
            {"format", kGoldenFormat},
            {"version", kGoldenVersion},
            {"checkpoint_sha256", golden.checkpoint_sha256},
            {"batch_sha256", golden.batch_sha256},
            {"training_sha256", golden.training_sha256}}},
          {"case", ev.dir().filename().string()},
          {"lane", lane},
          {"k", cal.k},
          {"k_update", cal.k_update},
          {"floor_eps", cal.floor_eps},
          {"epsilon", cal.epsilon},
          {"factor", cal.factor},
          {"rule", lane ? "the lane's calibrated tolerance (docs/precision.md): factor x max(k x noise, floor_eps "
                          "x epsilon), noise between the lane's reference and its noise twin"
                        : "tolerance = max(k x noise, floor_eps x epsilon) (k_update for a parameter after the "
                          "step), noise = max(the quantity's relative error between the golden's run and its "
                          "noise twin, the median of its kind; the loss's at least the logits'; a quantity compared "
                          "through the probes' sums and sketches at least epsilon x sqrt(elements), their own "
                          "rounding in another summation order), epsilon the golden's compute_epsilon"},
          {"quantities", j.rows},
          {"largest_relative_error", per_kind},
          {"max_error_over_tolerance", std::isfinite(j.worst) ? json(j.worst) : json("inf")},
          {"worst", j.worst_at},
          {"passed", passed}};
}

}  // namespace

GoldenComparison compare_with_golden(const spec::ModelSpec& spec, const Golden& golden,
                                     const verdicts::CaseEvidence& ev, const Calibration* lane) {
  const GoldenTensors g{safetensors::Reader(golden.tensors_file())};
  const std::string golden_file = golden.tensors_file().string();
  std::vector<Entry> entries = {loss_entry(ev, g)};
  // The probes of step 0, by stage.
  const std::string probes_file = (ev.dir() / layout::kProbes).string();
  std::map<std::string, contract::ProbeRow> stage;
  for (auto& [key, row] : contract::probe_rows(ev.jsonl(layout::kProbes), probes_file)) {
    if (key.first == 0) stage[key.second] = std::move(row);
  }
  std::vector<std::string> order;
  add_activations(spec, stage.count("forward_output") ? &stage["forward_output"] : nullptr, g, probes_file, order,
                  entries);
  for (const auto& [stage_name, prefix] : {std::pair{std::string("grad_before_clip"), std::string("grad.")},
                                           std::pair{std::string("after_optimizer"), std::string("param_after_step.")}}) {
    const json& tensors = stage.count(stage_name) ? stage[stage_name].tensors : json::object();
    add_parameters(spec, ev, stage_name, prefix, tensors, g, entries);
  }
  const Calibration cal = golden_calibration(spec, golden, entries, lane);
  GoldenComparison out;
  Comparison& c = out.comparison;
  c.activation_order = order;
  Judged judged;
  for (auto& e : entries) {
    ++c.compared;
    const std::string golden_names = join(e.golden, ", ");
    out.golden_names[e.m.key()] = golden_names;
    const Wording w(e, golden_file);
    if (!e.missing_from.empty()) {
      judge_missing(e, golden_names, w, c, judged);
    } else {
      judge_measured(e, golden_names, w, cal, lane != nullptr, c, judged);
    }
  }
  out.evidence = golden_evidence(golden, ev, lane != nullptr, cal, judged, c.passed());
  return out;
}

verdicts::Verdict golden_verdict(const GoldenComparison& gc, GoldenQuantity quantity, const Golden& golden,
                                 const verdicts::CaseEvidence& ev) {
  const Comparison& c = gc.comparison;
  auto names_of = [&](const std::string& kind, const std::string& name, const std::string& stage) {
    const auto it = gc.golden_names.find(Measurement{kind, name, 0, stage, 0, 0}.key());
    return it == gc.golden_names.end() ? std::string() : it->second;
  };
  auto wanted = [&](const std::string& kind, const std::string& name, const std::string& stage) {
    const std::string g = names_of(kind, name, stage);
    switch (quantity) {
      case GoldenQuantity::kLossAndLogits: return g == "loss" || g == "logits";
      case GoldenQuantity::kHiddenStates: return g.rfind("hidden_states.", 0) == 0;
      case GoldenQuantity::kGradients: return stage == "grad_before_clip";
      case GoldenQuantity::kStep: return stage == "after_optimizer";
    }
    return false;
  };
  const std::string from = "the golden (" + golden.implementation + ", " + golden.dir.string() + ")";
  std::vector<const Divergence*> hits;
  for (const auto& d : c.divergences) {
    if (wanted(d.kind, d.name, d.stage)) hits.push_back(&d);
  }
  if (!hits.empty()) {
    const Localization where = localize(c);
    std::string msg = "localized to '" + where.blamed + "': " + where.reason + "\n  first divergence from " + from +
                      ": " + hits[0]->message;
    if (hits.size() > 1) {
      msg += "\n  (" + std::to_string(hits.size() - 1) + " more of this kind; the next: " + hits[1]->name + ")";
    }
    return verdicts::Verdict::fail(msg);
  }
  int64_t n = 0;
  double worst = 0;
  std::string worst_at;
  for (const auto& row : gc.evidence["quantities"]) {
    if (!wanted(row["kind"].get<std::string>(), row["name"].get<std::string>(), row["stage"].get<std::string>())) continue;
    ++n;
    const double margin = row["error_over_tolerance"].is_number() ? row["error_over_tolerance"].get<double>() : 0;
    if (margin >= worst) {
      worst = margin;
      worst_at = row["name"].get<std::string>() + " (" + row["golden"].get<std::string>() + "): relative error " +
                 fmt(row["error"].is_number() ? row["error"].get<double>() : 0) + ", tolerance " +
                 fmt(row["tolerance"].get<double>());
    }
  }
  if (n == 0) {
    return verdicts::Verdict::fail("nothing of this kind compared with " + from + " on " + ev.dir().string() +
                                   ": the spec's golden.layers / golden.logits map no module the port recorded");
  }
  return verdicts::Verdict::pass(std::to_string(n) + " quantities against " + from + ": largest error / tolerance " +
                                 fmt(worst) + " (" + worst_at + "); every quantity in " +
                                 (ev.dir() / layout::kGoldenComparison).string());
}

}  // namespace mih::cases
