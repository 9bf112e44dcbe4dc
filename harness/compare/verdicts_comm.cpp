// The CommVolume verdict (verdicts.h): each step's collective bytes per axis and call site,
// recomputed from the parameter table and the config, against the comm ledger. The evidence
// is read typed (harness/contract: metrics.jsonl, structure.json's parameter table,
// input_identity.jsonl, performance_rank<r>.jsonl, comm_expected_step<k>.json).
#include "harness/compare/verdicts.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "harness/base/error.h"
#include "harness/base/pipeline_schedule.h"
#include "harness/base/reduction_paths.h"
#include "harness/compare/verdicts_internal.h"
#include "harness/contract/comm_expected_step.h"
#include "harness/contract/evidence_layout.h"
#include "harness/contract/input_identity_row.h"
#include "harness/contract/metrics_row.h"
#include "harness/contract/performance_row.h"
#include "harness/contract/structure_table.h"

namespace mih::verdicts {
using contract::MetricsRow;
using contract::ParameterRow;

namespace {

using Bytes = std::map<std::string, std::map<std::string, double>>;  // axis -> site -> bytes

std::map<int64_t, MetricsRow> metrics_of(const CaseEvidence& ev) {
  return contract::metrics_rows(ev.jsonl(layout::kMetrics), rel_path(ev, layout::kMetrics));
}

std::vector<ParameterRow> parameters_of(const CaseEvidence& ev) {
  return contract::structure_parameters(ev.json(layout::kStructure), rel_path(ev, layout::kStructure));
}

int64_t elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? "," : "") + std::to_string(shape[i]);
  return out + "]";
}

// The bytes of rank 0's piece of parameter `p`.
double local_bytes(const ParameterRow& p) { return static_cast<double>(elements(p.local_shape) * element_size(p.dtype)); }

// The gradient synchronization of one step per axis and call site, from the parameter table
// (structure.json, rank 0's pieces): the tp-partial gradients (grad domain "tp") all-reduced
// over tp once, and every gradient over each data-parallel axis that is not dp_shard's FSDP
// (dp_replicate, cp).
Bytes grad_sync_bytes(const std::vector<ParameterRow>& parameters, const ParallelConfig& cfg) {
  Bytes out;
  for (const auto& p : parameters) {
    if (!p.requires_grad || !p.on_rank0()) continue;
    const double bytes = local_bytes(p);
    // An entry without grad_domain records no axis its gradient is summed over.
    const std::vector<std::string> domain = p.grad_domain.value_or(std::vector<std::string>{});
    // Each bucket is labelled with its reduction path (reduction_paths.h): what the parameter
    // is (dense or expert) and whether FSDP shards it.
    const GradientKind kind = p.expert() ? GradientKind::kExpert : GradientKind::kDense;
    const GradientLayout layout = p.fsdp_rows ? GradientLayout::kFsdp : GradientLayout::kUnsharded;
    auto site = [&](std::string_view axis) { return std::string(gradient_path(kind, layout, axis).site); };
    if (cfg.tp > 1 && std::find(domain.begin(), domain.end(), "tp") != domain.end()) out["tp"][site("tp")] += bytes;
    if (cfg.dp_replicate > 1) out["dp_replicate"][site("dp_replicate")] += bytes;
    // Experts under ep are reduced over edp (and dp_replicate), not cp.
    if (cfg.cp > 1 && kind == GradientKind::kDense) out["cp"][site("cp")] += bytes;
  }
  return out;
}

// "layers.0.o_proj 64, layers.1.o_proj 64" for the layers that declared `site` on `axis` at
// `step` (comm_expected_step<k>.json), at most 4 named; "" when the file names none.
std::string declaring_layers(const CaseEvidence& ev, int64_t step, const std::string& axis, const std::string& site) {
  const std::string file = layout::comm_expected_step(step);
  if (!ev.has(file)) return "";
  const contract::LayerBytes by_layer = contract::comm_expected_by_layer(ev.json(file), step, rel_path(ev, file));
  std::string who;
  if (!by_layer.count(axis) || !by_layer.at(axis).count(site)) return who;
  int n = 0;
  for (const auto& [layer, b] : by_layer.at(axis).at(site)) {
    if (++n > 4) return who + ", ...";
    who += (who.empty() ? "" : ", ") + layer + " " + std::to_string(b);
  }
  return who;
}

// want[site] += bytes of `declared`'s axis (absent: nothing declared on it).
void add_sites(std::map<std::string, double>& to, const contract::SiteBytes& from, const std::string& axis) {
  if (auto it = from.find(axis); it != from.end()) {
    for (const auto& [site, b] : it->second) to[site] += static_cast<double>(b);
  }
}

// tp, cp and dp_replicate: every call site's bytes in a step equal what the layers declared
// (metrics comm_expected, from the layers' contracts) plus the gradient synchronization of
// the parameter table; a mismatch names the axis, the site and the declaring layers.
Verdict sites_as_declared(const CaseEvidence& ev, const MetricsRow& row, const Bytes& grad_sync) {
  const auto& cfg = ev.config();
  const std::string file = rel_path(ev, layout::kMetrics);
  if (!row.comm_sites || !row.comm_expected) {
    return Verdict::fail("metrics of step " + std::to_string(row.step) +
                         " have no comm_sites/comm_expected: the evidence predates per-site accounting; rerun the case "
                         "(open " + file + ")");
  }
  const std::map<std::string, int> degree = {
      {"tp", cfg.tp}, {"cp", cfg.cp}, {"dp_replicate", cfg.dp_replicate}, {"ep", cfg.ep}};
  for (const auto& [axis, d] : degree) {
    if (d <= 1) continue;
    std::map<std::string, double> want, got;
    add_sites(want, *row.comm_expected, axis);
    if (auto it = grad_sync.find(axis); it != grad_sync.end()) {
      for (const auto& [site, b] : it->second) want[site] += b;
    }
    add_sites(got, *row.comm_sites, axis);
    std::set<std::string> all;
    for (const auto& [s, b] : want) all.insert(s);
    for (const auto& [s, b] : got) all.insert(s);
    for (const auto& site : all) {
      const double w = want.count(site) ? want[site] : 0, g = got.count(site) ? got[site] : 0;
      if (std::abs(w - g) <= 0.5) continue;
      const std::string who = site.rfind("grad_sync.", 0) == 0 ? "the gradient synchronization of the parameter table"
                                                               : declaring_layers(ev, row.step, axis, site);
      return Verdict::fail("axis " + axis + ", call site " + site + ": moved " + std::to_string(static_cast<int64_t>(g)) +
                           " bytes at step " + std::to_string(row.step) + ", " +
                           (w > 0 ? "the model declares " + std::to_string(static_cast<int64_t>(w)) + " (" +
                                        (who.empty() ? "no layer named" : who) + ")"
                                  : "no layer or gradient synchronization declares any") +
                           ": a collective is missing, repeated or moves the wrong size (open " + file + " and " +
                           rel_path(ev, layout::comm_expected_step(row.step)) + ", and the comm ledgers under run/)");
    }
  }
  return Verdict::pass();
}

// The bytes of one pipeline message of `row`'s step: rows of one micro-batch on one
// data-parallel rank (from the step's global batch, input_identity.jsonl) x the rest of the
// message's shape x its element size; a failed verdict when the message's rows are not those.
Verdict pp_message_bytes(const CaseEvidence& ev, const MetricsRow& row, int64_t* per_message) {
  const auto& cfg = ev.config();
  const contract::PipelineRecord& pipe = *row.pipeline;
  const std::string file = rel_path(ev, layout::kMetrics);
  const auto identity = contract::input_identity_rows(ev.jsonl(layout::kInputIdentity), rel_path(ev, layout::kInputIdentity));
  if (!identity.count(row.step)) {
    return Verdict::fail("axis pp at step " + std::to_string(row.step) + ": " + layout::kInputIdentity +
                         " records no global batch of the step, so the rows of a message are unknown; rerun the case "
                         "(open " + rel_path(ev, layout::kInputIdentity) + ")");
  }
  const int64_t global_rows = identity.at(row.step).rows;
  const int64_t rows = global_rows / (cfg.dp_replicate * cfg.dp_shard) / cfg.micro_batches;
  if (pipe.message_shape[0] != rows) {
    return Verdict::fail("axis pp at step " + std::to_string(row.step) + ": the pipeline's messages have shape " +
                         shape_text(pipe.message_shape) + ", " + std::to_string(pipe.message_shape[0]) +
                         " rows where one micro-batch of one data-parallel rank has " + std::to_string(rows) + " (" +
                         std::to_string(global_rows) + " global rows / dp " +
                         std::to_string(cfg.dp_replicate * cfg.dp_shard) + " / micro_batches " +
                         std::to_string(cfg.micro_batches) + "): a stage sends another batch than it ran (open " + file + ")");
  }
  *per_message = elements(pipe.message_shape) * element_size(pipe.message_dtype);
  return Verdict::pass();
}

// The gradient of a parameter tied across stages, summed over pp once a step (rank 0's copy:
// the first stage's), against what grad_sync.tied.pp moved.
Verdict tied_over_pp(const CaseEvidence& ev, const MetricsRow& row, const std::map<std::string, int64_t>& moved) {
  double tied = 0;
  for (const auto& p : parameters_of(ev)) {
    if (p.pp_ranks && p.pp_ranks->size() > 1 && p.requires_grad && p.on_rank0()) tied += local_bytes(p);
  }
  // A site the ledger does not show moved nothing.
  const double tied_moved = moved.count("grad_sync.tied.pp") ? static_cast<double>(moved.at("grad_sync.tied.pp")) : 0.0;
  if (std::abs(tied_moved - tied) <= 0.5) return Verdict::pass();
  return Verdict::fail("axis pp, call site grad_sync.tied.pp: moved " + std::to_string(static_cast<int64_t>(tied_moved)) +
                       " bytes at step " + std::to_string(row.step) + ", the parameters tied across stages that rank 0 " +
                       "holds (structure.json pp_ranks) imply " + std::to_string(static_cast<int64_t>(tied)) +
                       ": a tie's gradients are not summed over pp, or summed twice (open " +
                       rel_path(ev, layout::kMetrics) + ")");
}

// pp: every activation and activation gradient rank 0 sent or received, counted from the
// order it ran (metrics "pipeline": each forward of a stage after the first receives the
// previous stage's activation, each forward before the last sends its own; each backward
// the reverse), times the bytes of one message (pp_message_bytes).
Verdict pipeline_sites(const CaseEvidence& ev, const MetricsRow& row) {
  const std::string file = rel_path(ev, layout::kMetrics);
  if (!row.pipeline) {
    return Verdict::fail("metrics of step " + std::to_string(row.step) + " of a pp case have no pipeline record (order, "
                         "message_shape, message_dtype): the evidence predates it or was edited; rerun the case (open " +
                         file + ")");
  }
  const contract::PipelineRecord& pipe = *row.pipeline;
  const int last = ev.config().pipeline_shape().stages() - 1;
  int64_t activations = 0, gradients = 0;
  for (const auto& text : pipe.order) {
    const pp::Action a = pp::Action::parse(text);
    const int64_t messages = (a.stage > 0) + (a.stage < last);
    (a.kind == pp::Action::Kind::kForward ? activations : gradients) += messages;
  }
  if (pipe.message_shape.empty() && activations + gradients > 0) {
    return Verdict::fail("axis pp at step " + std::to_string(row.step) + ": the order rank 0 ran implies " +
                         std::to_string(activations + gradients) + " messages, and its pipeline record has no message "
                         "shape: it moved none, or the record was edited (open " + file + ")");
  }
  int64_t per_message = 0;
  if (!pipe.message_shape.empty()) {
    if (Verdict v = pp_message_bytes(ev, row, &per_message); !v.passed()) return v;
  }
  std::map<std::string, int64_t> moved;  // a site the ledger does not show moved nothing
  if (row.comm_sites && row.comm_sites->count("pp")) moved = row.comm_sites->at("pp");
  for (const auto& [site, count] : {std::pair<std::string, int64_t>{"pipeline.activation", activations},
                                    std::pair<std::string, int64_t>{"pipeline.gradient", gradients}}) {
    const int64_t want = count * per_message, got = moved.count(site) ? moved.at(site) : 0;
    if (want == got) continue;
    return Verdict::fail("axis pp, call site " + site + ": moved " + std::to_string(got) + " bytes at step " +
                         std::to_string(row.step) + ", the schedule rank 0 ran implies " + std::to_string(count) +
                         " messages of " + std::to_string(per_message) + " bytes (shape " +
                         shape_text(pipe.message_shape) + ", " + pipe.message_dtype + ") = " + std::to_string(want) +
                         ": a send or receive is missing, repeated or moves the wrong size (open " + file +
                         " and the comm ledgers under run/)");
  }
  return tied_over_pp(ev, row, moved);
}

}  // namespace

namespace {

// The pp ranks of group `g` (pp is the outermost mesh dim: pp rank p of group g is rank
// p * per_pp + g) at row `k` of their performance files: the orders they ran, or a failed
// verdict when a rank's row is not rank 0's step or has no order.
Verdict group_orders(const CaseEvidence& ev, const std::vector<std::vector<contract::PerformanceRow>>& rows, size_t k,
                     int g, std::vector<std::vector<pp::Action>>* executed) {
  const auto& cfg = ev.config();
  const int per_pp = cfg.world_size() / cfg.pp;
  const int64_t step = rows[0][k].step;
  for (int p = 0; p < cfg.pp; ++p) {
    const int r = p * per_pp + g;
    const std::string file = rel_path(ev, layout::performance_rank(r));
    const auto& mine = rows[static_cast<size_t>(r)];
    if (mine.size() != rows[0].size()) {
      return Verdict::fail("rank " + std::to_string(r) + " recorded " + std::to_string(mine.size()) + " steps, rank 0 " +
                           std::to_string(rows[0].size()) + " (open " + file + ")");
    }
    if (mine[k].step != step) {
      return Verdict::fail("row " + std::to_string(k) + " of rank " + std::to_string(r) + " is step " +
                           std::to_string(mine[k].step) + ", rank 0's is step " + std::to_string(step) + " (open " + file + ")");
    }
    if (!mine[k].pipeline_order) {
      return Verdict::fail("step " + std::to_string(step) + " of rank " + std::to_string(r) +
                           " has no pipeline_order: the evidence predates it or was edited; rerun the case (open " + file + ")");
    }
    executed->emplace_back();
    for (const auto& text : *mine[k].pipeline_order) executed->back().push_back(pp::Action::parse(text));
  }
  return Verdict::pass();
}

// Whether the orders pp group `g` ran at row `k` are a step of the configured schedule.
Verdict group_schedule(const CaseEvidence& ev, const std::vector<std::vector<contract::PerformanceRow>>& rows, size_t k,
                       int g) {
  const auto& cfg = ev.config();
  const pp::PipelineShape shape = cfg.pipeline_shape();
  const int per_pp = cfg.world_size() / cfg.pp;
  std::vector<std::vector<pp::Action>> executed;
  if (Verdict v = group_orders(ev, rows, k, g, &executed); !v.passed()) return v;
  const std::vector<std::string> problems = pp::order_problems(cfg.pp_schedule, shape, executed);
  if (problems.empty()) return Verdict::pass();
  std::string ranks;
  for (int p = 0; p < cfg.pp; ++p) ranks += (p ? ", " : "") + std::to_string(p * per_pp + g);
  return Verdict::fail("step " + std::to_string(rows[0][k].step) + ", the pp ranks " + ranks +
                       " ran an order that is not a " + pp::schedule_name(cfg.pp_schedule) + " step of pp(" +
                       std::to_string(shape.pp) + ") x vpp(" + std::to_string(shape.vpp) + ") with " +
                       std::to_string(shape.micro_batches) + " micro-batches: " + problems.front() +
                       (problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) + " more)" : "") +
                       " (open performance_rank<r>.jsonl of those ranks under " + rel_path(ev, layout::kRuntimeDir) + ")");
}

}  // namespace

Verdict pipeline_schedule(const CaseEvidence& ev) {
  const auto& cfg = ev.config();
  if (!cfg.pipelined()) return Verdict::fail("config '" + cfg.name() + "' has no pipeline stages: nothing to examine");
  const int world = cfg.world_size(), per_pp = world / cfg.pp;
  std::vector<std::vector<contract::PerformanceRow>> rows;  // every rank's record
  for (int r = 0; r < world; ++r) {
    rows.push_back(contract::performance_rows(ev.jsonl(layout::performance_rank(r)), r,
                                              rel_path(ev, layout::performance_rank(r))));
  }
  const std::map<int64_t, MetricsRow> metrics = metrics_of(ev);
  int64_t steps = 0;
  for (size_t k = 0; k < rows[0].size(); ++k) {
    const int64_t step = rows[0][k].step;
    // What metrics.jsonl says rank 0 ran (CommVolume counts its messages) is what it recorded.
    const auto metric = metrics.find(step);
    if (metric == metrics.end() || !metric->second.pipeline || !rows[0][k].pipeline_order ||
        metric->second.pipeline->order != *rows[0][k].pipeline_order) {
      return Verdict::fail("step " + std::to_string(step) + ": the order metrics.jsonl records for rank 0 is not the one rank 0 "
                           "recorded (open " + rel_path(ev, layout::kMetrics) + " and " +
                           rel_path(ev, layout::performance_rank(0)) + ")");
    }
    for (int g = 0; g < per_pp; ++g) {
      if (Verdict v = group_schedule(ev, rows, k, g); !v.passed()) return v;
    }
    ++steps;
  }
  if (steps == 0) return Verdict::fail("no step recorded (open " + rel_path(ev, layout::performance_rank(0)) + ")");
  return Verdict::pass(std::to_string(steps) + " steps x " + std::to_string(per_pp) + " pp group(s) of " +
                       std::to_string(cfg.pp) + " ranks: " + pp::schedule_name(cfg.pp_schedule) + " orders");
}

namespace {

// What the parameter table implies dp_shard (FSDP) moves: per FSDP parameter, the bytes of one
// forward that uses it (the gather of each rank's padded shard, and for a trainable one the
// reduce-scatter of the padded full gradient), at the element size recorded (the master
// weights: float32 in the autocast lanes); and once a step, the all-reduce of every trainable
// dense gradient FSDP left whole (a 0-d parameter, one outside every unit).
struct FsdpBytes {
  std::map<std::string, double> per_forward;  ///< FQN -> bytes per forward that uses it
  double unsharded = 0;
};

FsdpBytes fsdp_bytes(const CaseEvidence& ev, const std::vector<ParameterRow>& parameters) {
  const int dp_shard = ev.config().dp_shard;
  FsdpBytes out;
  for (const auto& p : parameters) {
    if (!p.on_rank0()) continue;
    if (!p.fsdp_rows) {
      if (p.requires_grad && !p.expert()) out.unsharded += local_bytes(p);
      continue;
    }
    // No unit (the own-trainer session outside every unit), or experts under ep (over edp).
    if (p.fsdp_unit.value_or("").empty() || p.fsdp_axis_or_dp_shard() != "dp_shard") continue;
    MIH_CHECK_CODE(p.tp_local_shape.has_value(), Code::kFailedPrecondition, "evidence file ",
                   rel_path(ev, layout::kStructure), ": parameter '", p.fqn, "' has fsdp_rows and no tp_local_shape, ",
                   "so its FSDP traffic is unknown; it is not mih's evidence or was edited: rerun the case");
    const std::vector<int64_t>& shape = *p.tp_local_shape;
    const int64_t e = element_size(p.dtype), chunk = p.fsdp_rows->chunk;
    const int64_t cols = shape.size() > 1 ? elements(shape) / shape[0] : 1;
    double& bytes = out.per_forward[p.fqn];
    bytes += static_cast<double>(chunk * cols * e);
    if (p.requires_grad) bytes += static_cast<double>(dp_shard * chunk * cols * e);
  }
  return out;
}

// The degree of every axis metrics' comm_bytes may name, and the bytes the config implies on
// each every step (a floor for dp_cp and world, exact for dp_shard's unsharded gradients).
struct AxisPlan {
  std::map<std::string, int> degree;
  std::map<std::string, double> expected;
};

AxisPlan axis_plan(const ParallelConfig& cfg, const FsdpBytes& fsdp) {
  AxisPlan plan;
  const int dp_cp = cfg.dp_replicate * cfg.dp_shard * cfg.cp, world = cfg.world_size();
  plan.degree = {{"dp_cp", dp_cp}, {"world", world}};
  for (const auto& d : kMeshDims) plan.degree[std::string(d.name)] = cfg.*d.degree;
  if (dp_cp > 1) plan.expected["dp_cp"] = 16;
  if (world > 1) plan.expected["world"] = 16;
  if (cfg.dp_shard > 1 && fsdp.unsharded > 0) plan.expected["dp_shard"] = fsdp.unsharded;
  return plan;
}

// What the config implies at `row`'s step: the plan's, and dp_shard's FSDP traffic of each
// parameter in every forward (micro-batch) that used it: a step that never uses one (a vision
// tower on a text-only batch) moves nothing for it. The runtime records which parameters its
// forwards gathered (fsdp_gather_forwards; a parameter it does not list, none); without that
// record, every parameter in every micro-batch. Plus the gathers for backward of the units
// whose output needed a gradient, as the runtime declared them (comm_expected.dp_shard).
std::map<std::string, double> expected_at(const ParallelConfig& cfg, const AxisPlan& plan, const FsdpBytes& fsdp,
                                          const MetricsRow& row) {
  std::map<std::string, double> expected = plan.expected;
  if (cfg.dp_shard <= 1) return expected;
  double& bytes = expected["dp_shard"];
  for (const auto& [fqn, b] : fsdp.per_forward) {
    int64_t forwards = cfg.micro_batches;
    if (row.fsdp_gather_forwards) {
      const auto it = row.fsdp_gather_forwards->find(fqn);
      forwards = it == row.fsdp_gather_forwards->end() ? 0 : it->second;
    }
    bytes += b * static_cast<double>(forwards);
  }
  std::map<std::string, double> declared;
  if (row.comm_expected) add_sites(declared, *row.comm_expected, "dp_shard");
  for (const auto& [site, b] : declared) bytes += b;
  return expected;
}

// Every axis of `row` against the config: nothing on a trivial axis, dp_shard exact, dp_cp and
// world at least their scalars (they may carry the model's own: an MoE's expert counts), and
// every axis the config implies present.
Verdict axes_as_configured(const CaseEvidence& ev, const AxisPlan& plan, const std::map<std::string, double>& expected,
                           const MetricsRow& row) {
  const std::string file = rel_path(ev, layout::kMetrics), at = " at step " + std::to_string(row.step);
  for (const auto& [axis, b] : *row.comm_bytes) {
    const double got = static_cast<double>(b);
    auto d = plan.degree.find(axis);
    if (got > 0 && d != plan.degree.end() && d->second == 1) {
      return Verdict::fail("axis " + axis + " has degree 1 and moved " + std::to_string(b) + " bytes" + at +
                           ": a collective runs on a trivial group (open " + file + ")");
    }
    auto x = expected.find(axis);
    const bool exact = axis == "dp_shard";
    if (x == expected.end() || (exact ? std::abs(got - x->second) <= 0.5 : got >= x->second - 0.5)) continue;
    return Verdict::fail("axis " + axis + " moved " + std::to_string(b) + " bytes" + at + ", the config implies " +
                         (exact ? "" : "at least ") + std::to_string(static_cast<int64_t>(x->second)) + " (" +
                         (exact ? "FSDP all-gathers and reduce-scatters of the parameter table, and the gathers for "
                                  "backward the units declared"
                                : "two float64 scalars") +
                         "); a collective is missing, repeated or moves the wrong size (open " + file +
                         " and the comm ledgers under run/)");
  }
  for (const auto& [axis, want] : plan.expected) {
    if (!row.comm_bytes->count(axis)) {
      return Verdict::fail("axis " + axis + " moved nothing" + at + ", the config implies " +
                           std::to_string(static_cast<int64_t>(want)) + " bytes (open " + file + ")");
    }
  }
  return Verdict::pass();
}

// The bytes per axis that stay from step to step: the expert all-to-alls move what the
// routing sends, and dp_shard changes with the parameters a step gathers (checked exactly).
struct Steady {
  contract::AxisBytes bytes;
  std::optional<contract::AxisBytes> gathers;
};

Verdict steady_over_steps(const CaseEvidence& ev, const MetricsRow& row, std::optional<Steady>* first) {
  contract::AxisBytes steady = *row.comm_bytes;
  steady.erase("ep");
  if (!*first) {
    *first = Steady{steady, row.fsdp_gather_forwards};
    return Verdict::pass();
  }
  contract::AxisBytes earlier = (*first)->bytes;
  if (row.fsdp_gather_forwards != (*first)->gathers) {
    steady.erase("dp_shard");
    earlier.erase("dp_shard");
  }
  if (earlier == steady) return Verdict::pass();
  auto text = [](const contract::AxisBytes& b) { return nlohmann::json(b).dump(); };
  return Verdict::fail("the bytes per axis change between steps: " + text(earlier) + " then " + text(steady) +
                       " at step " + std::to_string(row.step) + " (open " + rel_path(ev, layout::kMetrics) + ")");
}

}  // namespace

Verdict comm_volume(const CaseEvidence& ev) {
  const auto& cfg = ev.config();
  const std::vector<ParameterRow> parameters = parameters_of(ev);
  const Bytes grad_sync = grad_sync_bytes(parameters, cfg);
  const std::map<int64_t, MetricsRow> rows = metrics_of(ev);
  const std::string file = rel_path(ev, layout::kMetrics);
  if (rows.empty()) return Verdict::fail("no metrics rows (open " + file + ")");
  const FsdpBytes fsdp = cfg.dp_shard > 1 ? fsdp_bytes(ev, parameters) : FsdpBytes{};
  const AxisPlan plan = axis_plan(cfg, fsdp);
  std::optional<Steady> first;
  for (const auto& [step, row] : rows) {
    if (!row.comm_bytes) {
      return Verdict::fail("metrics of step " + std::to_string(step) + " have no comm_bytes: the writer records no "
                           "communication; rerun the case with mih's session (open " + file + ")");
    }
    if (Verdict v = axes_as_configured(ev, plan, expected_at(cfg, plan, fsdp, row), row); !v.passed()) return v;
    if (Verdict v = sites_as_declared(ev, row, grad_sync); !v.passed()) return v;
    if (cfg.pp > 1) {
      if (Verdict v = pipeline_sites(ev, row); !v.passed()) return v;
    }
    if (Verdict v = steady_over_steps(ev, row, &first); !v.passed()) return v;
  }
  return Verdict::pass();
}

}  // namespace mih::verdicts
