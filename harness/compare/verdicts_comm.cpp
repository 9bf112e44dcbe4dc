// The CommVolume verdict (verdicts.h): each step's collective bytes per axis and call site,
// recomputed from the parameter table and the config, against the comm ledger.
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
#include "harness/base/pipeline_schedule.h"
#include "harness/base/reduction_paths.h"
#include "harness/base/strings.h"
#include "harness/compare/verdicts_internal.h"
#include "harness/findings/codes.h"

namespace mih::verdicts {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The gradient synchronization of one step per axis and call site, from the parameter table
// (structure.json, rank 0's pieces): the tp-partial gradients (grad domain "tp") all-reduced
// over tp once, and every gradient over each data-parallel axis that is not dp_shard's FSDP
// (dp_replicate, cp).
// Whether a parameter entry of structure.json is held by rank 0, whose traffic metrics.jsonl
// records: without pp every one; under pp those of its stages (pp rank 0 among pp_ranks), a
// parameter tied across stages by the copy on its first stage (pp_counted).
bool on_rank0(const json& p) {
  if (!p.contains("pp_ranks")) return true;
  const json& ranks = p.at("pp_ranks");
  return std::find(ranks.begin(), ranks.end(), 0) != ranks.end() && p.value("pp_counted", true);
}

std::map<std::string, std::map<std::string, double>> grad_sync_bytes(const CaseEvidence& ev) {
  std::map<std::string, std::map<std::string, double>> out;
  const auto& cfg = ev.config();
  for (const auto& p : ev.json(layout::kStructure).at("parameters")) {
    if (!p.value("requires_grad", true) || !on_rank0(p)) continue;
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
  const std::string file = rel_path(ev, layout::kMetrics);
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
      const std::string layers_file = layout::comm_expected_step(step);
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

// pp: every activation and activation gradient rank 0 sent or received, counted from the
// order it ran (metrics "pipeline": each forward of a stage after the first receives the
// previous stage's activation, each forward before the last sends its own; each backward
// the reverse), times the bytes of one message: rows of one micro-batch on one data-parallel
// rank (from the step's global batch) x the rest of the message's shape x its element size.
Verdict pipeline_sites(const CaseEvidence& ev, const json& row) {
  const auto& cfg = ev.config();
  const int64_t step = row.value("step", int64_t{-1});
  const std::string file = rel_path(ev, layout::kMetrics);
  const json pipe = row.value("pipeline", json());
  if (!pipe.is_object() || !pipe.contains("order") || !pipe.contains("message_shape") || !pipe.contains("message_dtype")) {
    return Verdict::fail("metrics of step " + std::to_string(step) + " of a pp case have no pipeline record (order, "
                         "message_shape, message_dtype): the evidence predates it or was edited; rerun the case (open " +
                         file + ")");
  }
  const pp::PipelineShape shape = cfg.pipeline_shape();
  const int last = shape.stages() - 1;
  int64_t activations = 0, gradients = 0;
  for (const auto& text : pipe.at("order")) {
    const pp::Action a = pp::Action::parse(text.get<std::string>());
    const bool forward = a.kind == pp::Action::Kind::kForward;
    activations += forward ? (a.stage > 0) + (a.stage < last) : 0;
    gradients += forward ? 0 : (a.stage > 0) + (a.stage < last);
  }
  const auto& message = pipe.at("message_shape");
  if (message.empty() && activations + gradients > 0) {
    return Verdict::fail("axis pp at step " + std::to_string(step) + ": the order rank 0 ran implies " +
                         std::to_string(activations + gradients) + " messages, and its pipeline record has no message "
                         "shape: it moved none, or the record was edited (open " + file + ")");
  }
  int64_t per_message = 0;
  if (!message.empty()) {
    // The rows of one micro-batch: the step's global rows over the data-parallel ranks and
    // the micro-batches (input_identity.jsonl records the global batch's rows per step).
    int64_t global_rows = -1;
    for (const auto& id : ev.jsonl(layout::kInputIdentity)) {
      if (id.value("step", int64_t{-2}) == step) global_rows = id.value("rows", int64_t{-1});
    }
    const int64_t rows = global_rows / (cfg.dp_replicate * cfg.dp_shard) / cfg.micro_batches;
    if (message[0].get<int64_t>() != rows) {
      return Verdict::fail("axis pp at step " + std::to_string(step) + ": the pipeline's messages have shape " +
                           message.dump() + ", " + std::to_string(message[0].get<int64_t>()) + " rows where one micro-batch " +
                           "of one data-parallel rank has " + std::to_string(rows) + " (" + std::to_string(global_rows) +
                           " global rows / dp " + std::to_string(cfg.dp_replicate * cfg.dp_shard) + " / micro_batches " +
                           std::to_string(cfg.micro_batches) + "): a stage sends another batch than it ran (open " + file + ")");
    }
    per_message = numel(message) * element_size(pipe.at("message_dtype").get<std::string>());
  }
  const json moved = row.value("comm_sites", json::object()).value("pp", json::object());
  for (const auto& [site, count] : {std::pair<std::string, int64_t>{"pipeline.activation", activations},
                                    std::pair<std::string, int64_t>{"pipeline.gradient", gradients}}) {
    const int64_t want = count * per_message, got = moved.value(site, int64_t{0});
    if (want != got) {
      return Verdict::fail("axis pp, call site " + site + ": moved " + std::to_string(got) + " bytes at step " +
                           std::to_string(step) + ", the schedule rank 0 ran implies " + std::to_string(count) +
                           " messages of " + std::to_string(per_message) + " bytes (shape " + message.dump() + ", " +
                           pipe.at("message_dtype").get<std::string>() + ") = " + std::to_string(want) +
                           ": a send or receive is missing, repeated or moves the wrong size (open " + file +
                           " and the comm ledgers under run/)");
    }
  }
  // The gradient of a parameter tied across stages, summed over pp once a step (rank 0's copy:
  // the first stage's).
  double tied = 0;
  for (const auto& p : ev.json(layout::kStructure).at("parameters")) {
    if (p.value("pp_ranks", json::array()).size() > 1 && p.value("requires_grad", true) && on_rank0(p)) {
      tied += static_cast<double>(numel(p.at("local_shape")) * element_size(p.value("dtype", "float32")));
    }
  }
  const double tied_moved = moved.value("grad_sync.tied.pp", 0.0);
  if (std::abs(tied_moved - tied) > 0.5) {
    return Verdict::fail("axis pp, call site grad_sync.tied.pp: moved " + std::to_string(static_cast<int64_t>(tied_moved)) +
                         " bytes at step " + std::to_string(step) + ", the parameters tied across stages that rank 0 " +
                         "holds (structure.json pp_ranks) imply " + std::to_string(static_cast<int64_t>(tied)) +
                         ": a tie's gradients are not summed over pp, or summed twice (open " + file + ")");
  }
  return Verdict::pass();
}

}  // namespace

Verdict pipeline_schedule(const CaseEvidence& ev) {
  const auto& cfg = ev.config();
  if (!cfg.pipelined()) return Verdict::fail("config '" + cfg.name() + "' has no pipeline stages: nothing to examine");
  const pp::PipelineShape shape = cfg.pipeline_shape();
  const int world = cfg.world_size(), per_pp = world / cfg.pp;
  // Every rank's record (pp is the outermost mesh dim: pp rank p of group g is rank p * per_pp + g).
  std::vector<const std::vector<json>*> rows;
  for (int r = 0; r < world; ++r) rows.push_back(&ev.jsonl(layout::performance_rank(r)));
  const std::vector<json>& metrics = ev.jsonl(layout::kMetrics);
  int64_t steps = 0;
  for (size_t k = 0; k < rows[0]->size(); ++k) {
    const int64_t step = (*rows[0])[k].value("step", int64_t{-1});
    // What metrics.jsonl says rank 0 ran (CommVolume counts its messages) is what it recorded.
    const json* metric = nullptr;
    for (const auto& m : metrics) {
      if (m.value("step", int64_t{-2}) == step) metric = &m;
    }
    if (!metric || !metric->contains("pipeline") || (*metric)["pipeline"].value("order", json()) != (*rows[0])[k].value("pipeline_order", json())) {
      return Verdict::fail("step " + std::to_string(step) + ": the order metrics.jsonl records for rank 0 is not the one rank 0 "
                           "recorded (open " + rel_path(ev, layout::kMetrics) + " and " +
                           rel_path(ev, layout::performance_rank(0)) + ")");
    }
    for (int g = 0; g < per_pp; ++g) {
      std::vector<std::vector<pp::Action>> executed;
      for (int p = 0; p < cfg.pp; ++p) {
        const int r = p * per_pp + g;
        const std::string file = rel_path(ev, layout::performance_rank(r));
        if (rows[static_cast<size_t>(r)]->size() != rows[0]->size()) {
          return Verdict::fail("rank " + std::to_string(r) + " recorded " + std::to_string(rows[static_cast<size_t>(r)]->size()) +
                               " steps, rank 0 " + std::to_string(rows[0]->size()) + " (open " + file + ")");
        }
        const json& row = (*rows[static_cast<size_t>(r)])[k];
        if (row.value("step", int64_t{-2}) != step) {
          return Verdict::fail("row " + std::to_string(k) + " of rank " + std::to_string(r) + " is step " +
                               std::to_string(row.value("step", int64_t{-2})) + ", rank 0's is step " + std::to_string(step) +
                               " (open " + file + ")");
        }
        if (!row.contains("pipeline_order") || !row["pipeline_order"].is_array()) {
          return Verdict::fail("step " + std::to_string(step) + " of rank " + std::to_string(r) +
                               " has no pipeline_order: the evidence predates it or was edited; rerun the case (open " + file + ")");
        }
        executed.emplace_back();
        for (const auto& text : row["pipeline_order"]) executed.back().push_back(pp::Action::parse(text.get<std::string>()));
      }
      const std::vector<std::string> problems = pp::order_problems(cfg.pp_schedule, shape, executed);
      if (!problems.empty()) {
        std::string ranks;
        for (int p = 0; p < cfg.pp; ++p) ranks += (p ? ", " : "") + std::to_string(p * per_pp + g);
        return Verdict::fail("step " + std::to_string(step) + ", the pp ranks " + ranks + " ran an order that is not a " +
                             pp::schedule_name(cfg.pp_schedule) + " step of pp(" + std::to_string(shape.pp) + ") x vpp(" +
                             std::to_string(shape.vpp) + ") with " + std::to_string(shape.micro_batches) +
                             " micro-batches: " + problems.front() + (problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) + " more)" : "") +
                             " (open performance_rank<r>.jsonl of those ranks under " + rel_path(ev, layout::kRuntimeDir) + ")");
      }
    }
    ++steps;
  }
  if (steps == 0) return Verdict::fail("no step recorded (open " + rel_path(ev, layout::performance_rank(0)) + ")");
  return Verdict::pass(std::to_string(steps) + " steps x " + std::to_string(per_pp) + " pp group(s) of " +
                       std::to_string(cfg.pp) + " ranks: " + pp::schedule_name(cfg.pp_schedule) + " orders");
}

Verdict comm_volume(const CaseEvidence& ev) {
  const auto& cfg = ev.config();
  const auto grad_sync = grad_sync_bytes(ev);
  const auto& rows = ev.jsonl(layout::kMetrics);
  if (rows.empty()) return Verdict::fail("no metrics rows (open " + rel_path(ev, layout::kMetrics) + ")");
  const std::string file = rel_path(ev, layout::kMetrics);
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
    for (const auto& p : ev.json(layout::kStructure).at("parameters")) {
      if (!p.contains("fsdp_rows") || p.value("fsdp_unit", "").empty() || !on_rank0(p)) continue;
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
    for (const auto& p : ev.json(layout::kStructure).at("parameters")) {
      if (p.contains("fsdp_rows") || !p.value("requires_grad", true) || p.value("gradient_kind", "DENSE") == "EXPERT" ||
          !on_rank0(p)) {
        continue;
      }
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
    if (cfg.pp > 1) {
      if (Verdict v = pipeline_sites(ev, r); !v.passed()) return v;
    }
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
