// The checks of a running step: shared state between layers and modality gradients (see
// checks.h).
#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

#include "harness/checks/checks.h"
#include "harness/findings/codes.h"

namespace mih::checks {
namespace {

using nlohmann::json;

bool any_match(const std::vector<std::string>& patterns, const std::string& name) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) { return glob_match(p, name); });
}

}  // namespace

CheckOutput check_shared_state(const std::vector<SharedStateEvent>& events,
                               const std::vector<spec::SharedStateSpec>& declared, int64_t step) {
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
    bool recompute = false;
    for (const auto& e : list) recompute = recompute || e["recompute"].get<bool>();
    add(codes::kSharedTwice, fk.second,
        "shared state '" + fk.second + "' was published " + std::to_string(list.size()) + " times in forward " +
            std::to_string(fk.first) + (recompute ? " (again in the activation-checkpoint recompute)" : ""),
        {{"publishes", list}},
        "a second publication overwrites the state (routing statistics counted twice, a cache rebuilt mid-backward)",
        "publish once per forward: skip the publication when in_recompute() is true");
  }
  for (const auto& d : declared) {
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
  out.evidence = {{"step", step}, {"events", events}};
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
  at::Tensor stats = at::zeros({static_cast<int64_t>(rows.size()), 4}, at::kDouble);
  for (size_t i = 0; i < rows.size(); ++i) {
    const at::Tensor& local = rows[i].param->local;
    if (local.numel() == 0) continue;  // an empty FSDP piece holds nothing to check
    const at::Tensor g = local.grad();
    const auto r = static_cast<int64_t>(i);
    if (!g.defined()) {
      stats[r][0] = 1;
      continue;
    }
    const at::Tensor gd = g.detach().to(at::kDouble);
    if (!at::isfinite(gd).all().item<bool>()) stats[r][1] = 1;
    if (gd.abs().max().item<double>() == 0) stats[r][2] = 1;
    stats[r][3] = gd.pow(2).sum().item<double>() / static_cast<double>(rows[i].param->replicas());
  }
  at::Tensor reduced = stats.to(ctx.device());
  ctx.mesh().comm(MeshAxis::kWorld).all_reduce(reduced, ReduceOp::kSum, "mih.session.modality_gradients");
  reduced = reduced.cpu();
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto r = static_cast<int64_t>(i);
    const auto undefined = reduced[r][0].item<int64_t>(), nonfinite = reduced[r][1].item<int64_t>(),
               zero = reduced[r][2].item<int64_t>();
    const json facts = {{"ranks_without_grad", undefined},
                        {"ranks_nonfinite", nonfinite},
                        {"ranks_all_zero", zero},
                        {"global_grad_norm", std::sqrt(std::max(reduced[r][3].item<double>(), 0.0))},
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

}  // namespace mih::checks
