// The checks of a running step: shared state between layers and modality gradients (see
// checks.h).
#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <sstream>

#include <ATen/ATen.h>

#include "harness/checks/checks.h"
#include "harness/findings/codes.h"
#include "harness/base/strings.h"

namespace mih::checks {
namespace {

using nlohmann::json;

bool any_match(const std::vector<std::string>& patterns, const std::string& name) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) { return glob_match(p, name); });
}

}  // namespace

CheckOutput check_shared_state(const std::vector<SharedStateEvent>& events,
                               const std::vector<spec::SharedStateSpec>& declared, int64_t step,
                               const std::set<std::string>* fields_seen) {
  CheckOutput out;
  const std::string where = " at step " + std::to_string(step);
  auto add = [&](const char* code, const std::string& owner, const std::string& message, json facts,
                 const std::string& why, const std::string& fix) {
    out.findings.add({code, "runtime", owner, Severity::kError, message + where, std::move(facts), why, fix});
  };
  std::map<std::string, const spec::SharedStateSpec*> by_key;
  for (const auto& d : declared) by_key[d.key] = &d;
  // Per key: producers and consumers seen; per (forward, key): the publishes.
  std::map<std::string, std::set<std::string>> producers, consumers;
  std::map<std::pair<int64_t, std::string>, json> publishes;
  std::set<std::string> undeclared;
  for (const auto& e : events) {
    const json ej = e;
    if (e.action == "publish") {
      producers[e.key].insert(e.layer);
      publishes[{e.forward, e.key}].push_back(ej);
    } else {
      consumers[e.key].insert(e.layer);
      if (e.state_id < 0) {
        add(codes::kSharedBeforePublish, e.key, "'" + e.layer + "' consumed shared state '" + e.key + "' before it was published in the forward",
            ej, "the consumer reads a value from another forward (or none)",
            "publish before consuming; check the producer runs before its consumers");
      }
    }
    if (!by_key.count(e.key)) undeclared.insert(e.key);
  }
  for (const auto& [fk, list] : publishes) {
    if (list.size() < 2) continue;
    std::string recompute;  // the region whose recompute published again
    for (const auto& e : list) {
      if (recompute.empty()) recompute = e.value("recompute_region", std::string());
    }
    add(codes::kSharedTwice, fk.second,
        "shared state '" + fk.second + "' was published " + std::to_string(list.size()) + " times in forward " +
            std::to_string(fk.first) + (recompute.empty() ? "" : " (again in the activation-checkpoint recompute of region '" + recompute + "')"),
        {{"publishes", list}},
        "a second publication overwrites the state (routing statistics counted twice, a cache rebuilt mid-backward)",
        "publish once per forward: skip the publication when in_recompute() is true");
  }
  json not_required = json::array();
  for (const auto& d : declared) {
    // The step had no batch with the field the state depends on (vision features without
    // pixel_values): the producer has nothing to publish, unless it does anyway.
    if (!d.requires_field.empty() && fields_seen && !fields_seen->count(d.requires_field) && !producers.count(d.key) &&
        !consumers.count(d.key)) {
      not_required.push_back(d.key);
      continue;
    }
    if (!producers.count(d.key)) {
      add(codes::kSharedNoProducer, d.key, "declared shared state '" + d.key + "' was never published (producer '" + d.producer + "')",
          {{"declared", {{"producer", d.producer}, {"consumers", d.consumers}}}},
          "its consumers read nothing or stale values", "publish it from the producer layer each forward");
    } else {
      for (const auto& layer : producers[d.key]) {
        if (glob_match(d.producer, layer)) continue;
        add(codes::kSharedWrongProducer, d.key, "shared state '" + d.key + "' published by '" + layer + "', declared producer '" + d.producer + "'",
            {{"producer", layer}}, "two layers own one state", "publish it from the declared producer only");
      }
    }
    for (const auto& pattern : d.consumers) {
      const auto& seen = consumers[d.key];
      if (std::none_of(seen.begin(), seen.end(), [&](const std::string& l) { return glob_match(pattern, l); })) {
        add(codes::kSharedNoConsumer, d.key, "declared consumer '" + pattern + "' never consumed shared state '" + d.key + "'",
            {{"consumers_seen", std::vector<std::string>(seen.begin(), seen.end())}},
            "the consumer computes without the state (e.g. without rotary positions)",
            "consume it through the session's SharedState in the consumer's forward");
      }
    }
  }
  for (const auto& key : undeclared) {
    add(codes::kSharedUndeclared, key, "shared state '" + key + "' is published or consumed but not declared in the spec",
        {{"producers", std::vector<std::string>(producers[key].begin(), producers[key].end())},
         {"consumers", std::vector<std::string>(consumers[key].begin(), consumers[key].end())}},
        "nothing checks who publishes it, who reads it or that it is published once per forward",
        "declare it in ModelSpec::shared_state with its producer and consumers");
  }
  out.findings.ran(codes::kCheckSharedState, static_cast<int64_t>(declared.size()), "declared shared-state keys");
  out.findings.ran(codes::kCheckSharedEvents, static_cast<int64_t>(events.size()), "shared-state events");
  out.findings.ran(codes::kCheckUndeclared, 1, "steps whose shared-state events were read");
  out.evidence = {{"step", step}, {"events", events}, {"not_required", not_required}};
  return out;
}

CheckOutput check_modality_gradients(const ParallelContext& ctx, const std::vector<spec::ModalitySpec>& modalities,
                                     const std::set<std::string>& fields_seen, int64_t step) {
  CheckOutput out;
  // Per (modality, parameter): ranks [undefined, non-finite, all-zero] and the sum of squares,
  // reduced over the world in one all-reduce.
  struct Row {
    std::string field;
    const ShardedParameter* param;
  };
  std::vector<Row> rows;
  json evidence = json::object();
  for (const auto& m : modalities) {
    evidence[m.field] = {{"reached_model", fields_seen.count(m.field) > 0}, {"parameters", json::object()}};
    if (!fields_seen.count(m.field)) continue;
    for (const auto& p : ctx.parameters()) {
      bool match = any_match(m.parameter_patterns, p->fqn);
      for (const auto& a : p->aliases) match = match || any_match(m.parameter_patterns, a);
      if (match) rows.push_back({m.field, p.get()});
    }
  }
  out.findings.ran(codes::kCheckModality, static_cast<int64_t>(rows.size()), "parameters of modalities that reached the model");
  if (rows.empty()) {
    out.evidence = {{"step", step}, {"modalities", evidence}};
    return out;
  }
  // Rows of [undefined, non-finite, all-zero, sum of squares / replicas] in a plain buffer:
  // indexing a tensor element by element costs more than the norms.
  std::vector<double> stats(rows.size() * 4, 0.0);
  for (size_t i = 0; i < rows.size(); ++i) {
    const at::Tensor& local = rows[i].param->local;
    if (local.numel() == 0) continue;  // an empty FSDP piece holds nothing to check
    const at::Tensor g = local.grad();
    double* row = stats.data() + 4 * i;
    if (!g.defined()) {
      row[0] = 1;
      continue;
    }
    // One pass, accumulated in float64 without a copy of the gradient: the L2 norm is
    // non-finite iff an element is (a float64 square overflows only past 1e154), zero iff all are.
    const double norm = at::linalg_vector_norm(g.detach(), 2, c10::nullopt, false, at::kDouble).item<double>();
    if (!std::isfinite(norm)) row[1] = 1;
    if (norm == 0) row[2] = 1;
    row[3] = norm * norm / static_cast<double>(rows[i].param->replicas());
  }
  at::Tensor reduced = at::from_blob(stats.data(), {static_cast<int64_t>(stats.size())}, at::kDouble)
                           .to(ctx.device(), /*non_blocking=*/false, /*copy=*/true);
  ctx.mesh().comm(MeshAxis::kStage).all_reduce(reduced, ReduceOp::kSum, "mih.session.modality_gradients");
  reduced = reduced.cpu().contiguous();
  const double* all = reduced.data_ptr<double>();
  for (size_t i = 0; i < rows.size(); ++i) {
    const double* row = all + 4 * i;
    const auto undefined = static_cast<int64_t>(row[0]), nonfinite = static_cast<int64_t>(row[1]),
               zero = static_cast<int64_t>(row[2]);
    const json facts = {{"ranks_without_grad", undefined},
                        {"ranks_nonfinite", nonfinite},
                        {"ranks_all_zero", zero},
                        {"global_grad_norm", std::sqrt(std::max(row[3], 0.0))},
                        {"step", step}};
    evidence[rows[i].field]["parameters"][rows[i].param->fqn] = facts;
    if (undefined + nonfinite + zero == 0) continue;
    const std::string what = undefined ? "no gradient" : nonfinite ? "a non-finite gradient" : "an all-zero gradient";
    out.findings.add({codes::kModalNoGradient, "runtime", rows[i].param->fqn, Severity::kError,
                      "'" + rows[i].param->fqn + "' (modality '" + rows[i].field + "') has " + what + " on " +
                          std::to_string(undefined + nonfinite + zero) + " rank(s) at step " + std::to_string(step) +
                          " although '" + rows[i].field + "' reached the model",
                      facts,
                      "the modality's parameters do not train: its input is detached or dropped before they see it",
                      "keep the path from the field to these parameters differentiable (no detach, no dropped field)"});
  }
  out.evidence = {{"step", step}, {"modalities", evidence}};
  return out;
}

namespace {

std::string axes_str(const std::set<std::string>& axes) {
  std::string out = join(axes, ", ");
  return "{" + out + "}";
}

}  // namespace

CheckOutput check_gradient_reductions(const ParallelContext& ctx, int64_t step) {
  CheckOutput out;
  const auto& record = ctx.gradient_reductions();
  json evidence = json::object();
  int64_t examined = 0;
  for (const auto& p : ctx.parameters()) {
    if (!p->local.requires_grad()) continue;
    ++examined;
    const auto domain_list = p->grad_domain();
    std::set<std::string> domain(domain_list.begin(), domain_list.end());
    const auto it = record.find(p->fqn);
    std::set<std::string> reduced = it == record.end() ? std::set<std::string>{} : it->second;
    // No gradient on this rank (an unused branch, a modality absent from the batch): FSDP had
    // nothing to reduce-scatter; whether it should have trained is ModalityGradients' question.
    if (reduced.erase(ParallelContext::kNoGradient) && p->fsdp) domain.erase("dp_shard");
    evidence[p->fqn] = {{"grad_domain", domain}, {"reduced_over", reduced}};
    if (reduced == domain) continue;
    std::set<std::string> missing, extra;
    std::set_difference(domain.begin(), domain.end(), reduced.begin(), reduced.end(), std::inserter(missing, missing.end()));
    std::set_difference(reduced.begin(), reduced.end(), domain.begin(), domain.end(), std::inserter(extra, extra.end()));
    std::string what;
    if (!missing.empty()) what += "never reduced over " + axes_str(missing);
    if (!extra.empty()) what += std::string(what.empty() ? "" : " and ") + "also reduced over " + axes_str(extra);
    out.findings.add({codes::kGradReduction, "runtime", p->fqn, Severity::kError,
                      "gradient " + what + " at step " + std::to_string(step) + ": its domain is " + axes_str(domain) +
                          ", the collectives reduced it over " + axes_str(reduced),
                      {{"step", step}, {"grad_domain", domain}, {"reduced_over", reduced}},
                      "an axis left out leaves each rank with its own partial gradient (replicas drift apart); an "
                      "extra one multiplies the gradient by the axis degree",
                      "reduce every gradient over exactly its grad_domain: the data-parallel axes (dp_replicate, "
                      "dp_shard, cp), and tp where the parameter sees only this tp rank's share of the tokens (sequence "
                      "parallelism) or of the heads (a per-head norm at tp > 1)"});
  }
  out.findings.ran(codes::kCheckGradReduction, examined, "trainable parameters");
  out.evidence = {{"step", step}, {"parameters", evidence}};
  return out;
}

CheckOutput check_tp_partial_gradients(const ParallelContext& ctx, int64_t step) {
  CheckOutput out;
  Communicator& tp = ctx.tp_group();
  std::vector<const ShardedParameter*> rows;
  for (const auto& p : ctx.parameters()) {
    if (p->local.requires_grad() && !(p->tp.is_shard() && tp.size() > 1)) rows.push_back(p.get());
  }
  json evidence = json::object();
  // Per parameter a fingerprint of this rank's local gradient (sum, sum of squares), its
  // maximum and minimum over tp in two all-reduces: equal on every tp rank means every rank
  // computed the whole gradient; different means each holds a partial sum.
  const auto n = static_cast<int64_t>(rows.size());
  at::Tensor prints = at::zeros({n, 2}, at::kDouble);
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor g = rows[static_cast<size_t>(i)]->local.grad();
    if (!g.defined() || g.numel() == 0) continue;
    const at::Tensor gd = g.detach().to(at::kDouble);
    prints[i][0] = gd.sum().item<double>();
    prints[i][1] = gd.pow(2).sum().item<double>();
  }
  at::Tensor hi = prints.to(ctx.device()), lo = prints.neg().to(ctx.device());
  if (n > 0 && tp.size() > 1) {
    tp.all_reduce(hi, ReduceOp::kMax, "mih.session.tp_partial_gradients");
    tp.all_reduce(lo, ReduceOp::kMax, "mih.session.tp_partial_gradients");
  }
  hi = hi.cpu();
  lo = lo.neg().cpu();
  int64_t examined = 0;
  for (int64_t i = 0; i < n; ++i) {
    const ShardedParameter& p = *rows[static_cast<size_t>(i)];
    double spread = 0, scale = 0;
    for (int64_t k = 0; k < 2; ++k) {
      const double a = hi[i][k].item<double>(), b = lo[i][k].item<double>();
      spread = std::max(spread, std::abs(a - b));
      scale = std::max({scale, std::abs(a), std::abs(b)});
    }
    if (scale == 0) continue;  // no gradient on any tp rank: nothing to tell
    ++examined;
    const bool partial = spread > 1e-6 * scale;
    const bool declared = p.tp_partial_grad;
    evidence[p.fqn] = {{"partial_over_tp", partial}, {"declared_partial", declared}, {"relative_spread", spread / scale}};
    if (partial == declared) continue;
    const json facts = {{"step", step}, {"relative_spread", spread / scale}, {"tp", tp.size()}, {"placement", p.tp.str()}};
    if (partial) {
      out.findings.add({codes::kGradTpPartialUndeclared, "runtime", p.fqn, Severity::kError,
                        "replicated over tp, its local gradients before synchronization differ across the " +
                            std::to_string(tp.size()) + " tp ranks (relative spread " + std::to_string(spread / scale) +
                            ") at step " + std::to_string(step) +
                            ": each holds a partial sum, and its grad domain leaves tp out, so it is never all-reduced "
                            "over tp",
                        facts, "each tp rank updates its copy with its own share of the gradient: the copies drift apart",
                        "declare the gradient partial over tp (ParamSpec::tp_partial_grad) for a parameter replicated "
                        "over tp that sees only this tp rank's share of the input: only its tokens (a norm or a router "
                        "under sequence parallelism: RMSNorm, LayerNorm) or only its heads (a per-head QK norm at any "
                        "tp > 1, with or without sequence parallelism: HeadRMSNorm)"});
    } else {
      out.findings.add({codes::kGradTpPartialWhole, "runtime", p.fqn, Severity::kError,
                        "replicated over tp, its local gradient before synchronization is the same on all " +
                            std::to_string(tp.size()) + " tp ranks at step " + std::to_string(step) +
                            ", but its grad domain includes tp: the all-reduce over tp multiplies it by " +
                            std::to_string(tp.size()),
                        facts, "the parameter trains with a gradient tp times too large",
                        "declare the gradient partial over tp only where each tp rank sees a share of the tokens "
                        "(sequence parallelism) or of the heads (a per-head norm at tp > 1)"});
    }
  }
  out.findings.ran(codes::kCheckTpPartial, examined, "tp-replicated parameters with a gradient");
  out.evidence = {{"step", step}, {"parameters", evidence}};
  return out;
}

std::vector<std::string> parameters_without_gradient(const ParallelContext& ctx) {
  std::vector<const ShardedParameter*> trainable;
  for (const auto& p : ctx.parameters()) {
    if (p->local.requires_grad()) trainable.push_back(p.get());
  }
  const auto& record = ctx.gradient_reductions();
  std::vector<double> had(trainable.size(), 0.0);
  for (size_t i = 0; i < trainable.size(); ++i) {
    const ShardedParameter& p = *trainable[i];
    const auto it = record.find(p.fqn);
    const bool zero_filled = it != record.end() && it->second.count(ParallelContext::kNoGradient);
    if (p.local.grad().defined() && !zero_filled) had[i] = 1;
  }
  if (!trainable.empty()) {
    at::Tensor t = at::from_blob(had.data(), {static_cast<int64_t>(had.size())}, at::kDouble)
                       .to(ctx.device(), /*non_blocking=*/false, /*copy=*/true);
    ctx.mesh().comm(MeshAxis::kStage).all_reduce(t, ReduceOp::kSum, "mih.session.gradient_presence");
    t = t.cpu().contiguous();
    std::copy(t.data_ptr<double>(), t.data_ptr<double>() + t.numel(), had.begin());
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < trainable.size(); ++i) {
    if (had[i] == 0) out.push_back(trainable[i]->fqn);
  }
  return out;
}

CheckOutput check_update_without_gradient(const ParallelContext& ctx, const std::map<std::string, at::Tensor>& before,
                                          int64_t step, int64_t trainable) {
  CheckOutput out;
  json moved = json::object(), without = json::array();
  for (const auto& p : ctx.parameters()) {
    const auto it = before.find(p->fqn);
    if (it == before.end()) continue;
    without.push_back(p->fqn);
    const at::Tensor now = p->local.detach();
    if (now.sizes() == it->second.sizes() && at::equal(now, it->second)) continue;
    double change = std::numeric_limits<double>::infinity();
    if (now.sizes() == it->second.sizes() && now.numel() > 0) {
      change = (now.to(at::kDouble) - it->second.to(at::kDouble)).abs().max().item<double>();
    }
    moved[p->fqn] = std::isfinite(change) ? json(change) : json("shape or non-finite change");
    std::ostringstream amount;
    amount << change;
    out.findings.add({codes::kOptimMovedWithoutGradient, "runtime", p->fqn, Severity::kError,
                      "'" + p->fqn + "' had no gradient on any rank at step " + std::to_string(step) +
                          " and the optimizer step changed it (largest change " + amount.str() +
                          " on this rank's piece)",
                      {{"step", step}, {"max_abs_change", moved[p->fqn]}},
                      "a parameter the step never reached is decayed by weight decay and moved by its stale momentum "
                      "(a vision tower shrinks on every text-only step), and the single-rank reference, with the same "
                      "optimizer, moves it alike, so parity cannot see it",
                      "leave the gradient of a parameter no rank's backward reached undefined after the "
                      "synchronization (None in PyTorch), so the optimizer skips it: zero-fill it only for the "
                      "collectives, on the ranks without one while others have one"});
  }
  out.findings.ran(codes::kCheckUpdateWithoutGradient, trainable,
                   "trainable parameters (those without a gradient held unchanged by the optimizer)");
  out.evidence = {{"step", step}, {"without_gradient", without}, {"moved", moved}};
  return out;
}

CheckOutput check_gradients_received(const std::vector<ParameterNames>& trainable, const std::set<std::string>& received,
                                     const std::vector<int64_t>& steps, const std::vector<std::string>& unused) {
  CheckOutput out;
  json never = json::array(), declared = json::array();
  std::string span;
  if (!steps.empty()) {
    span = steps.size() == 1 ? "step " + std::to_string(steps.front())
                             : std::to_string(steps.size()) + " steps (" + std::to_string(steps.front()) + " to " +
                                   std::to_string(steps.back()) + ")";
  }
  for (const auto& p : trainable) {
    if (received.count(p.fqn)) continue;
    bool allowed = any_match(unused, p.fqn);
    for (const auto& a : p.aliases) allowed = allowed || any_match(unused, a);
    never.push_back(p.fqn);
    if (allowed) {
      declared.push_back(p.fqn);
      continue;
    }
    out.findings.add({codes::kGradNeverReceived, "runtime", p.fqn, Severity::kError,
                      "'" + p.fqn + "' is trainable and no rank's backward gave it a gradient in any of the " + span +
                          " of the run",
                      {{"steps", steps}},
                      "it is registered, optimized, saved and exported, and never learns: a branch the forward "
                      "skips, an input detached before it, or a module left out of the loss",
                      "connect it to the loss; freeze it (ModelSpec::frozen) if it is not to train; or, when only "
                      "some data reaches it, declare it in ModelSpec::unused_parameters"});
  }
  const auto count = static_cast<int64_t>(trainable.size());
  out.findings.ran(codes::kCheckGradientsReceived, count, "trainable parameters");
  out.evidence = {{"steps", steps}, {"trainable", count}, {"never_received", never}, {"declared_unused", declared}};
  return out;
}

}  // namespace mih::checks
