// compare_evidence (see compare.h): two case directories' evidence, read typed
// (harness/contract: metrics, probes, the watchlist, the parameter table, the resolved spec),
// compared quantity by quantity in step, stage and forward order.
#include "harness/compare/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/contract/metrics_row.h"
#include "harness/contract/probe_row.h"
#include "harness/contract/resolved_spec.h"
#include "harness/contract/row_schema.h"
#include "harness/contract/structure_table.h"
#include "harness/evidence/evidence_store.h"

namespace mih {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using contract::MetricsRow;
using contract::ProbeRow;

// In the order a step computes them: the activation stages (per module) between the
// parameters before the step and their gradients.
const std::vector<std::string> kStages = {"model_before",   "forward_output",  "output_grad",    "grad_before_clip",
                                          "grad_after_clip", "after_optimizer", "optimizer_state"};
const char* const kMetricNames[] = {"loss", "grad_norm_pre_clip", "grad_norm_post_clip", "lr"};

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

// The spec the evidence is of; none when it has no spec.resolved.json (a writer that declares
// no spec: then nothing to check).
std::optional<std::string> spec_of(const EvidenceDir& d) {
  if (!fs::exists(d.root() / layout::kSpecResolved)) return std::nullopt;
  return contract::resolved_spec(d.read_json(layout::kSpecResolved), (d.root() / layout::kSpecResolved).string()).name;
}

// One side of a comparison: its directory and its rows.
struct Side {
  EvidenceDir dir;
  std::map<int64_t, MetricsRow> metrics;
  std::map<StepKey, ProbeRow> probes;
  std::string path(const std::string& relative) const { return (dir.root() / relative).string(); }
};

Side read_side(const fs::path& root) {
  Side s{EvidenceDir::open_existing(root), {}, {}};
  s.metrics = contract::metrics_rows(read_required(s.dir, layout::kMetrics), s.path(layout::kMetrics));
  return s;
}

// A session probes the parameters before a step only at its first step: later, they are the
// parameters after the previous step's optimizer.
void read_probes(Side& s) {
  s.probes = contract::probe_rows(read_required(s.dir, layout::kProbes), s.path(layout::kProbes));
  std::set<int64_t> steps;
  for (const auto& [key, row] : s.probes) steps.insert(key.first);
  for (int64_t step : steps) {
    auto after = s.probes.find({step - 1, "after_optimizer"});
    if (s.probes.count({step, "model_before"}) || after == s.probes.end()) continue;
    ProbeRow before = after->second;
    before.stage = "model_before";
    before.step = step;
    s.probes[{step, "model_before"}] = std::move(before);
  }
}

// The watched parameters in forward order (the candidate's watchlist, then any the reference
// adds), each followed by its optimizer states.
std::vector<std::string> watch_order(const Side& candidate, const Side& reference) {
  std::vector<std::string> order;
  for (const Side* side : {&candidate, &reference}) {
    const json watchlist = side->dir.read_json(layout::kParameterWatchlist);
    contract::require_schema(layout::kParameterWatchlist, watchlist, side->path(layout::kParameterWatchlist));
    for (const auto& w : watchlist) {
      const std::string fqn = w["fqn"].get<std::string>();
      if (std::find(order.begin(), order.end(), fqn) != order.end()) continue;
      order.insert(order.end(), {fqn, fqn + "/exp_avg", fqn + "/exp_avg_sq"});
    }
  }
  return order;
}

// The modules of a probe stage in forward order: the candidate's, then any the reference adds.
std::vector<std::string> stage_modules(const ProbeRow& candidate, const ProbeRow& reference) {
  std::vector<std::string> modules;
  for (const ProbeRow* row : {&candidate, &reference}) {
    for (const auto& m : row->order) {
      if (std::find(modules.begin(), modules.end(), m) == modules.end()) modules.push_back(m);
    }
  }
  return modules;
}

// The comparison of one candidate with its reference: the quantities in order, each
// divergence with its message.
class Comparer {
 public:
  Comparer(Side& reference, Side& candidate, const CompareOptions& o) : ref_(reference), cand_(candidate), o_(o) {}

  Comparison run();

 private:
  std::vector<int64_t> steps_in_common() const;
  void add(Divergence d);
  std::string why(const Divergence& d) const;
  std::string calibrated_why(const Divergence& d) const;
  void add_missing(const std::string& kind, const std::string& name, int64_t step, const std::string& stage,
                   const std::string& side, const std::string& file);
  void check(Measurement m, const std::string& file, const std::string& counts);
  void missing_steps();
  void compare_metrics(int64_t step);
  void compare_stage(int64_t step, const std::string& stage, const std::vector<std::string>& order);
  bool unplaced(const std::string& name, const json& tensors, const ProbeRow& row);
  void compare_tensors(int64_t step, const std::string& stage, const ProbeRow& a, const ProbeRow& b,
                       const std::vector<std::string>& names);
  void find_unobserved(const std::vector<std::string>& order);

  Side& ref_;
  Side& cand_;
  const CompareOptions& o_;
  Comparison out_;
};

std::vector<int64_t> Comparer::steps_in_common() const {
  std::vector<int64_t> steps;
  for (const auto& [step, row] : cand_.metrics) {
    if (step >= o_.first_step && ref_.metrics.count(step)) steps.push_back(step);
  }
  MIH_CHECK_CODE(!steps.empty(), Code::kFailedPrecondition, "evidence ", cand_.dir.root().string(), " and reference ",
                 ref_.dir.root().string(), " have no step in common at or after step ", o_.first_step);
  return steps;
}

// Why the quantity of `d` diverges (before its "(open <file>)").
std::string Comparer::why(const Divergence& d) const {
  if (!d.message.empty()) return d.message;  // the caller's reason (element counts that differ)
  if (d.kind == "input") return "hash differs from the reference";
  if (!d.missing_from.empty()) {
    return "recorded by the " + std::string(d.missing_from == "candidate" ? "reference" : "candidate") +
           ", missing from the " + d.missing_from;
  }
  std::string text = "max abs error " + fmt(d.max_abs_error) + ", relative error " + fmt(d.relative_error) +
                     " > tolerance " + fmt(d.tolerance);
  return o_.calibration ? text + calibrated_why(d) : text;
}

// A calibrated lane's error / noise and the rule its tolerance comes from.
std::string Comparer::calibrated_why(const Divergence& d) const {
  const Calibration& cal = *o_.calibration;
  const Measurement m{d.kind, d.name, d.step, d.stage, d.relative_error, d.max_abs_error};
  const std::string rule = "tolerance = " + (cal.factor != 1 ? fmt(cal.factor) + " x " : std::string()) + "max(" +
                           fmt(Calibration::updated_parameter(m) ? cal.k_update : cal.k) + " x noise, " +
                           fmt(cal.floor_eps) + " x " +
                           (cal.floor_epsilon(m) == cal.epsilon ? cal.dtype : std::string("float32")) + " epsilon)";
  if (d.noise > 0) {
    return " (error / noise " + fmt(d.relative_error / d.noise) + ": noise " + fmt(d.noise) +
           " between the lane's reference and its noise twin; " + rule + ")";
  }
  if (d.noise == 0) return " (the twin measured no noise here, so the floor decides; " + rule + ")";
  return " (the noise twin did not record this quantity, so the floor decides; " + rule + ")";
}

void Comparer::add(Divergence d) {
  if (!o_.calibration) d.tolerance = o_.tolerance;
  const std::string what = d.kind == "input"        ? "input field '"
                           : d.kind == "metric"     ? "metric '"
                           : d.kind == "activation" ? (d.stage == "forward_output" ? "forward output of module '"
                                                                                   : "output gradient of module '")
                                                    : "parameter '";
  d.message = what + d.name + "' at step " + std::to_string(d.step) +
              (d.stage == "metrics" ? "" : ", stage " + d.stage) + ": " + why(d) + " (open " + d.evidence + ")";
  out_.divergences.push_back(std::move(d));
}

// Both sides must hold the same quantities: what one side recorded and the other did not is a
// divergence naming the side that lacks it, never a silent skip.
void Comparer::add_missing(const std::string& kind, const std::string& name, int64_t step, const std::string& stage,
                           const std::string& side, const std::string& file) {
  Divergence d{kind, name, step, stage, 0, std::numeric_limits<double>::infinity(), 0, file, "", ""};
  d.missing_from = side;
  add(std::move(d));
}

// Records a measurement and, beyond its tolerance (the calibration's, or the one given), a
// divergence.
void Comparer::check(Measurement m, const std::string& file, const std::string& counts) {
  double tolerance = o_.tolerance, noise = 0;
  if (o_.calibration) {
    noise = o_.calibration->noise_of(m);
    tolerance = o_.calibration->tolerance_of(m);
  }
  if (!(m.relative_error <= tolerance)) {
    Divergence d{m.kind, m.name, m.step, m.stage, m.max_abs_error, m.relative_error, tolerance, file, counts, ""};
    d.noise = noise;
    add(std::move(d));
  }
  out_.measurements.push_back(std::move(m));
}

void Comparer::missing_steps() {
  for (const auto& [step, row] : ref_.metrics) {
    if (step >= o_.first_step && !cand_.metrics.count(step)) {
      add_missing("metric", "step", step, "metrics", "candidate", cand_.path(layout::kMetrics));
    }
  }
  for (const auto& [step, row] : cand_.metrics) {
    if (step >= o_.first_step && !ref_.metrics.count(step)) {
      add_missing("metric", "step", step, "metrics", "reference", ref_.path(layout::kMetrics));
    }
  }
}

void Comparer::compare_metrics(int64_t step) {
  const MetricsRow& a = cand_.metrics.at(step);
  const MetricsRow& b = ref_.metrics.at(step);
  ++out_.compared;
  if (a.input_hash != b.input_hash) {
    add({"input", "global batch", step, "metrics", 0, 0, 0, cand_.path(layout::kInputIdentity), "", ""});
  }
  for (const char* m : kMetricNames) {
    ++out_.compared;
    // A non-finite metric (written as null) reads as NaN, which no tolerance holds: a
    // divergence, never a crash.
    const double x = a.metric(m), y = b.metric(m);
    const double abs = std::abs(x - y), rel = abs / std::max(std::abs(y), 1e-300);
    check({"metric", m, step, "metrics", rel, abs}, cand_.path(layout::kMetrics), "");
  }
}

void Comparer::compare_stage(int64_t step, const std::string& stage, const std::vector<std::string>& order) {
  auto ia = cand_.probes.find({step, stage});
  auto ib = ref_.probes.find({step, stage});
  if (ia == cand_.probes.end() && ib == ref_.probes.end()) return;  // a stage neither side records
  if (ia == cand_.probes.end() || ib == ref_.probes.end()) {
    // Activations, clipped gradients and optimizer states are probed at a run's first two
    // steps and its last: a resumed run's first step is one its uninterrupted twin may not
    // probe.
    const bool scheduled = activation_stage(stage) || stage == "optimizer_state" || stage == "grad_after_clip";
    if (scheduled && o_.first_step > 0) return;
    const bool cand_lacks = ia == cand_.probes.end();
    add_missing("tensor", "(every watched tensor)", step, stage, cand_lacks ? "candidate" : "reference",
                (cand_lacks ? cand_ : ref_).path(layout::kProbes));
    return;
  }
  if (!activation_stage(stage)) return compare_tensors(step, stage, ia->second, ib->second, order);
  const std::vector<std::string> modules = stage_modules(ia->second, ib->second);
  if (stage == "output_grad" && out_.activation_order.empty()) out_.activation_order = modules;
  compare_tensors(step, stage, ia->second, ib->second, modules);
}

// Whether module `name` is missing from `tensors` because the writer of `row` could not place
// its output on the mesh (ProbeRow::unplaced): noted once, never compared.
bool Comparer::unplaced(const std::string& name, const json& tensors, const ProbeRow& row) {
  if (tensors.contains(name) || std::find(row.unplaced.begin(), row.unplaced.end(), name) == row.unplaced.end()) {
    return false;
  }
  auto& listed = out_.unplaced_modules;
  if (std::find(listed.begin(), listed.end(), name) == listed.end()) listed.push_back(name);
  return true;
}

void Comparer::compare_tensors(int64_t step, const std::string& stage, const ProbeRow& a, const ProbeRow& b,
                               const std::vector<std::string>& names) {
  const std::string kind = activation_stage(stage) ? "activation" : "tensor";
  const json& ta = a.tensors;
  const json& tb = b.tensors;
  for (const auto& name : names) {
    if (!ta.contains(name) && !tb.contains(name)) continue;  // an optimizer state of a frozen parameter
    if (unplaced(name, ta, a) || unplaced(name, tb, b)) continue;
    ++out_.compared;
    if (!ta.contains(name) || !tb.contains(name)) {
      const bool cand_lacks = !ta.contains(name);
      add_missing(kind, name, step, stage, cand_lacks ? "candidate" : "reference",
                  (cand_lacks ? cand_ : ref_).path(layout::kProbes));
      continue;
    }
    // A gradient zero in exact arithmetic is rounding residue on both sides (CLIP's key bias:
    // softmax ignores a shift common to every key), and so are its AdamW moments: measured
    // against the step's gradient norm when the reference's is below the tolerance of it
    // (fixed-tolerance lanes; a calibrated lane's noise twin measures the residue itself).
    const double floor =
        o_.calibration ? 0 : cancellation_scale(stage, name, ref_.metrics.at(step), tb[name], o_.tolerance);
    const TensorError e = tensor_error(ta[name], tb[name], floor);
    check({kind, name, step, stage, e.relative, e.max_abs}, cand_.path(layout::kProbes), e.counts);
  }
}

// The modules with parameters (the candidate's parameter table, else the watchlist), and
// those no observed module is or contains.
void Comparer::find_unobserved(const std::vector<std::string>& order) {
  std::vector<std::string> parameters;
  if (fs::exists(cand_.dir.root() / layout::kStructure)) {
    for (const auto& p : contract::structure_parameters(cand_.dir.read_json(layout::kStructure),
                                                        cand_.path(layout::kStructure))) {
      parameters.push_back(p.fqn);
    }
  }
  if (parameters.empty()) {
    for (const auto& fqn : order) {
      if (fqn.find('/') == std::string::npos) parameters.push_back(fqn);
    }
  }
  std::set<std::string> modules;
  for (const auto& p : parameters) modules.insert(module_of_parameter(p));
  out_.parameter_modules = static_cast<int64_t>(modules.size());
  for (const auto& m : modules) {
    const bool seen = std::any_of(out_.activation_order.begin(), out_.activation_order.end(),
                                  [&](const std::string& o) { return m == o || m.rfind(o + ".", 0) == 0; });
    if (!seen) out_.unobserved_modules.push_back(m);
  }
}

Comparison Comparer::run() {
  const std::vector<int64_t> steps = steps_in_common();
  missing_steps();
  const std::vector<std::string> order = watch_order(cand_, ref_);
  read_probes(ref_);
  read_probes(cand_);
  for (int64_t step : steps) {
    compare_metrics(step);
    for (const auto& stage : kStages) compare_stage(step, stage, order);
  }
  find_unobserved(order);
  return std::move(out_);
}

}  // namespace

Comparison compare_evidence(const fs::path& reference, const fs::path& candidate, const CompareOptions& o) {
  MIH_CHECK(std::isfinite(o.tolerance) && o.tolerance >= 0, "compare: the tolerance must be a finite number >= 0, got ",
            o.tolerance);
  {
    // Evidence of two specs has nothing to compare: say so rather than a first "divergence".
    const auto ref_spec = spec_of(EvidenceDir::open_existing(reference));
    const auto cand_spec = spec_of(EvidenceDir::open_existing(candidate));
    MIH_CHECK_CODE(!ref_spec || !cand_spec || *ref_spec == *cand_spec, Code::kFailedPrecondition, "compare: the reference ",
                   reference.string(), " is evidence of spec '", ref_spec.value_or(""), "', the candidate ",
                   candidate.string(), " of spec '", cand_spec.value_or(""), "'; compare two cases of one spec");
  }
  Side ref = read_side(reference);
  Side cand = read_side(candidate);
  return Comparer(ref, cand, o).run();
}

}  // namespace mih
