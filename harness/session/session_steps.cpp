// ValidationSession's per-step hooks (see session.h): begin_step, record_batch, the
// gradient and optimizer hooks, probes, end_step, the FSDP trace and the expected
// communication, checkpoint payloads.
#include "harness/session/session.h"
#include "harness/session/session_internal.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <map>

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/json_fields.h"
#include "harness/base/version.h"
#include "harness/checkpoint/safetensors.h"
#include "harness/compat/collectives.h"
#include "harness/findings/codes.h"
#include "harness/runtime/communicator.h"

namespace mih {

using nlohmann::json;

void ValidationSession::begin_step(int64_t step) {
  guarded("begin_step", [&] {
    fields_seen_.clear();
    tokens_seen_ = rows_seen_ = labels_seen_ = 0;
    if (!runtime()) return;
    state_.context->shared_state().clear_events();
    // At the first two steps this session trains (a parameter initialized to zero, a bias,
    // changes the forward from the second) and at the last one: the activations and the
    // optimizer state. The parameters before a step only at the first (later they are the
    // previous step's after_optimizer, which compare_evidence reads in their place).
    const bool first = first_step_ < 0 || step == first_step_;
    full_probe_step_ = first || step == first_step_ + 1 || step == options_.last_step;
    state_.context->activation_probes().set_enabled(full_probe_step_);
    if (first) probe(probes::Stage::kModelBefore, step);
  });
}

void ValidationSession::record_batch(int64_t step, int micro_batch, int64_t first_row, const Batch& batch) {
  guarded("record_batch", [&] {
    for (const auto& [name, t] : batch.fields) fields_seen_.insert(name);
    tokens_seen_ += batch.input_ids.numel();
    if (batch.labels.defined()) labels_seen_ += batch.labels.ne(-100).sum().item<int64_t>();
    rows_seen_ += batch.input_ids.size(0);
    // The first micro-batch this session sees (step 0, or the first step after a resume).
    if (first_step_ < 0) first_step_ = step;
    if (step == first_step_ && micro_batch == 0) {
      checks::CheckOutput fields = checks::check_forward_fields(spec_->data, batch);
      take(pending_, fields.findings);
      write(layout::kObservedForwardFields, fields.evidence);
    }
    if (!runtime()) return;
    ParallelContext& ctx = *state_.context;
    identity_->add(first_row, batch, &mesh_->comm(MeshAxis::kCp), ctx.config().cp_layout);
  });
}

void ValidationSession::record_token_losses(int64_t step, int micro_batch, const at::Tensor& token_losses,
                                            const Batch& batch) {
  if (step != first_step_ || micro_batch != 0) return;
  guarded("record_token_losses", [&] {
    checks::CheckOutput losses = checks::check_token_losses(batch, token_losses);
    take(pending_, losses.findings);
    write(layout::kTokenLosses, losses.evidence);
  });
}

void ValidationSession::before_gradient_sync(int64_t step) {
  guarded("before_gradient_sync", [&] {
    if (!runtime() || state_.context->tp_size() == 1) return;
    checks::CheckOutput partial = checks::check_tp_partial_gradients(*state_.context, step);
    take(pending_, partial.findings);
    if (step == first_step_) write_step(layout::tp_partial_gradients_step(step), partial.evidence);
  });
}

void ValidationSession::after_backward_before_clip(int64_t step) {
  guarded("after_backward_before_clip", [&] {
    if (!runtime()) return;
    checks::CheckOutput reductions = checks::check_gradient_reductions(*state_.context, step);
    take(pending_, reductions.findings);
    if (step == 0 || step == first_step_) {
      write_step(layout::gradient_reductions_step(step), reductions.evidence);
    }
    checks::CheckOutput modal = checks::check_modality_gradients(*state_.context, spec_->modalities, fields_seen_, step);
    take(pending_, modal.findings);
    if (!spec_->modalities.empty()) write_step(layout::modality_gradients_step(step), modal.evidence);
    take(pending_, checks::check_frozen_parameters(state_, spec_->frozen, checks::FrozenPoint::kAfterBackward, step).findings);
    // Which parameters no rank's backward reached (collective), and their values before the
    // optimizer, which must leave them as they are.
    without_gradient_before_.clear();
    const std::vector<std::string> absent = checks::parameters_without_gradient(*state_.context);
    const std::set<std::string> absent_set(absent.begin(), absent.end());
    trainable_.clear();
    for (const auto& p : state_.context->parameters()) {
      if (!p->local.requires_grad()) continue;
      trainable_.push_back({p->fqn, p->aliases});
      if (absent_set.count(p->fqn)) {
        without_gradient_before_[p->fqn] = p->local.detach().clone();
      } else {
        gradient_received_.insert(p->fqn);
      }
    }
    presence_steps_.push_back(step);
    if (session_internal::digests_recorded(state_.context->config(), true, !spec_->unused_parameters.empty())) {
      session_internal::write_replica_digests(*state_.context, *mesh_, evidence_.get(), ledger_seen_, step, true);
    }
    probe(probes::Stage::kGradBeforeClip, step);
    probe_activations(step);
  });
}

void ValidationSession::after_clip(int64_t step, double /*grad_norm*/) {
  guarded("after_clip", [&] {
    if (!runtime()) return;
    // The clipped gradients only where everything is probed: in between, the post-clip norm
    // and the parameters after the optimizer (probed every step) carry what clipping did.
    if (full_probe_step_) probe(probes::Stage::kGradAfterClip, step);
    checks::CheckOutput optimizer = checks::check_optimizer_layout(state_, options_.trainer, spec::Phase::kRuntime, spec_->decayed_1d);
    take(pending_, optimizer.findings);
    write_step(layout::optimizer_layout_step(step), optimizer.evidence);
  });
}

void ValidationSession::after_optimizer(int64_t step) {
  guarded("after_optimizer", [&] {
    if (!runtime()) return;
    probe(probes::Stage::kAfterOptimizer, step);
    if (full_probe_step_) probe(probes::Stage::kOptimizerState, step);
    take(pending_, checks::check_frozen_parameters(state_, spec_->frozen, checks::FrozenPoint::kAfterOptimizer, step).findings);
    int64_t trainable = 0;
    for (const auto& p : state_.context->parameters()) trainable += p->local.requires_grad() ? 1 : 0;
    checks::CheckOutput presence =
        checks::check_update_without_gradient(*state_.context, without_gradient_before_, step, trainable);
    without_gradient_before_.clear();
    take(pending_, presence.findings);
    write_step(layout::gradient_presence_step(step), presence.evidence);
    json replicas;
    FindingReport r = probes::check_replica_consistency(*state_.context, step, &replicas);
    take(pending_, r);
    if (session_internal::digests_recorded(state_.context->config(), false)) {
      session_internal::write_replica_digests(*state_.context, *mesh_, evidence_.get(), ledger_seen_, step, false);
    } else {
      write_step(layout::replicas_step(step), replicas);
    }
  });
}

void ValidationSession::probe(probes::Stage stage, int64_t step) {
  json j = probes::probe_stage(*state_.context, watchlist_, stage, state_.optimizer, options_.watch);
  j["step"] = step;
  append(layout::kProbes, j);
}

void ValidationSession::probe_activations(int64_t step) {
  ActivationProbes& probes = state_.context->activation_probes();
  if (!probes.enabled()) return;
  probes.set_enabled(false);
  const std::vector<ActivationProbes::Record> records = probes.take_reduced();
  json order = json::array(), forward = json::object(), grad = json::object();
  auto stats = [](const ActivationStats& st) {
    json t = {{"sum", st.values[0]},
              {"nonfinite", static_cast<int64_t>(st.values[2])},
              {"numel", static_cast<int64_t>(st.values[3])},
              {"sketch", std::vector<double>(st.values.begin() + 4, st.values.end())}};
    if (st.has_sum_sq) t["sum_sq"] = st.values[1];
    return t;
  };
  for (const auto& r : records) {
    order.push_back(r.module);
    if (r.forward.seen) forward[r.module] = stats(r.forward);
    if (r.grad.seen) grad[r.module] = stats(r.grad);
  }
  append(layout::kProbes, {{"stage", "forward_output"}, {"step", step}, {"order", order}, {"tensors", forward}});
  append(layout::kProbes, {{"stage", "output_grad"}, {"step", step}, {"order", order}, {"tensors", grad}});
}

void ValidationSession::end_step(const StepMetrics& m) {
  guarded("end_step", [&] {
    const auto start = std::chrono::steady_clock::now();
    if (!runtime()) {
      if (m.step == 0) merge(FindingReport());
      return;
    }
    const int64_t step = m.step;
    ParallelContext& ctx = *state_.context;
    FindingReport local;
    json identity = identity_->finish(*mesh_, step, &local, ctx.device());
    input_identity_.push_back(identity);
    if (evidence_ && mesh_->rank() == 0) evidence_->append_jsonl(layout::kInputIdentity, identity);

    checks::CheckOutput shared =
        checks::check_shared_state(ctx.shared_state().events(), shared_state_, step, &fields_seen_);
    take(local, shared.findings);
    write_step(layout::shared_state_step(step), shared.evidence);

    checks::CheckOutput inv = checks::run_invariants(spec_->invariants, spec::Phase::kRuntime, state_);
    take(local, inv.findings);
    if (!inv.evidence.empty()) write_step(layout::invariants_step(step), inv.evidence);

    // The reduction paths the runtime took so far (reduction_paths.h), for `mih reach`.
    json paths = json::object();
    for (const auto& [name, reached] : ctx.reached_reduction_paths()) {
      const ReductionPath& path = reduction_path(name);
      paths[name] = {{"axis", path.axis}, {"axis_size", reached.axis_size}, {"op", path.op},
                     {"site", path.site}, {"parameters", reached.parameters}};
    }
    write_step(layout::kReductionPaths, {{"through_step", step}, {"paths", paths}});

    // Communication of training (not of the session) since the last step, per axis.
    json sites, expected_by_layer;
    const json comm = take_comm_bytes(&sites);
    const json expected = take_expected_comm(&expected_by_layer);
    write_step(layout::comm_expected_step(step), expected_by_layer);
    const int64_t dp = mesh_->comm(MeshAxis::kDp).size(), cp = mesh_->comm(MeshAxis::kCp).size();
    const double seconds = std::max(m.step_ms, 1e-9) / 1e3;
    json row = m;
    row["input_hash"] = identity["global"];
    row["tokens_per_s"] = static_cast<double>(tokens_seen_ * dp * cp) / seconds;
    row["samples_per_s"] = static_cast<double>(rows_seen_ * dp) / seconds;
    row["comm_bytes"] = comm;
    // Per axis and call site: what the collectives moved, and what the layers declared.
    row["comm_sites"] = sites;
    row["comm_expected"] = expected;
    // The FSDP parameters this step's forwards gathered (CommVolume counts their traffic).
    row["fsdp_gather_forwards"] = ctx.fsdp_gather_forwards();
    // Under pp: what this rank's schedule ran and the shape of what it moved (CommVolume
    // recomputes the pp bytes from them, PipelineSchedule checks the order).
    if (!m.pipeline_order.empty()) {  // a pipeline schedule ran (pp, or vpp stages on one rank)
      row["pipeline"] = {{"order", m.pipeline_order},
                         {"message_shape", m.pipeline_message_shape},
                         {"message_dtype", m.pipeline_message_dtype}};
    }
    metrics_.push_back(row);
    json perf = {{"step", step},
                 {"step_ms", m.step_ms},
                 {"peak_memory_bytes", probes::peak_memory_bytes(ctx.device())},
                 {"comm_bytes", comm},
                 // tp ranks see the same rows, and so do the pp ranks: count them once.
                 {"valid_labels", mesh_->comm(MeshAxis::kTp).rank() == 0 && mesh_->comm(MeshAxis::kPp).rank() == 0
                                      ? labels_seen_ : 0},
                 {"loss_normalizers", m.loss_normalizers},
                 {"valid_tokens_reported", m.valid_tokens}};
    if (!m.pipeline_order.empty()) perf["pipeline_order"] = m.pipeline_order;
    // Under pp the run-level gradient check gathers the stages' parameters (a collective):
    // at the last step, where every rank still runs, not at finish.
    if (pipelined() && step == options_.last_step && !presence_steps_.empty()) gradients_received();
    merge(std::move(local), perf);
    hook_ms_["end_step"] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    perf["session_ms"] = hook_ms_;
    double total = 0;
    for (const auto& [hook, ms] : hook_ms_) total += ms;
    metrics_.back()["session_ms"] = total;
    hook_ms_.clear();
    performance_.push_back(perf);
    if (evidence_) evidence_->append_jsonl(layout::performance_rank(mesh_->rank()), perf);
    if (evidence_ && mesh_->rank() == 0) evidence_->append_jsonl(layout::kMetrics, metrics_.back());
  });
}

void ValidationSession::record_fsdp_trace(int64_t step) {
  guarded("record_fsdp_trace", [&] {
    ParallelContext& ctx = *state_.context;
    // What the runtime did this step (the config only asks): per region, the forwards that ran
    // under checkpointing and the recomputes backward ran (ActivationCheckpointEquivalence).
    json regions = json::object();
    for (const auto& [name, counts] : ctx.checkpoint_counts()) {
      auto& seen = checkpoint_seen_[name];
      regions[name] = {{"checkpointed", counts.checkpointed - seen.first}, {"recomputed", counts.recomputed - seen.second}};
      seen = {counts.checkpointed, counts.recomputed};
    }
    checkpoint_steps_.push_back(json{{"step", step}, {"regions", regions}});
    write_step(layout::kActivationCheckpoint, {{"enabled", ctx.config().activation_checkpointing},
                                                    {"regions", ctx.checkpoint_regions()},
                                                    {"steps", checkpoint_steps_}});
    // At the first step this session trains: step 0, or the first after a resume's load (whose
    // evidence directory is the case's own).
    if (step == first_step_) write(layout::kFsdpTrace, ctx.to_json());
    flush_stage_evidence();  // under pp: a collective of the stages' writing ranks
  });
}

json ValidationSession::take_comm_bytes(json* sites) {
  json comm = json::object();
  if (sites) *sites = json::object();
  if (const auto& ledger = mesh_->ledger()) {
    const std::vector<CommRecord> records = ledger->completed();
    for (size_t i = ledger_seen_; i < records.size(); ++i) {
      const CommRecord& r = records[i];
      if (r.site.rfind("mih.session", 0) == 0) continue;
      comm[r.axis] = comm.value(r.axis, int64_t{0}) + r.bytes;
      if (sites) {
        const std::string label = r.site.substr(0, r.site.find(" @"));
        json& axis = (*sites)[r.axis];
        if (!axis.is_object()) axis = json::object();
        axis[label] = axis.value(label, int64_t{0}) + r.bytes;
      }
    }
    ledger_seen_ = records.size();
  }
  return comm;
}

json ValidationSession::take_expected_comm(json* by_layer) {
  json expected = json::object();
  *by_layer = json::object();
  if (const auto& ledger = mesh_->ledger()) {
    for (const ExpectedComm& e : ledger->take_expected()) {
      json& axis = expected[e.axis];
      if (!axis.is_object()) axis = json::object();
      axis[e.site] = axis.value(e.site, int64_t{0}) + e.bytes;
      const std::string layer = e.layer.empty() ? "(unnamed layer)" : e.layer;
      json& slot = (*by_layer)[e.axis][e.site];
      if (!slot.is_object()) slot = json::object();
      slot[layer] = slot.value(layer, int64_t{0}) + e.bytes;
    }
  }
  return expected;
}

void ValidationSession::capture_checkpoint_payload(const std::string& event, const std::filesystem::path& dir,
                                                   const json& index) {
  guarded("capture_checkpoint_payload", [&] {
    json summary = {{"event", event}, {"dir", dir.string()}, {"rank", mesh_->rank()}};
    for (const char* k : {"checkpoint_id", "world_size"}) {
      if (index.contains(k)) summary[k] = index[k];
    }
    if (index.contains("tensors")) summary["tensors"] = index["tensors"].size();
    // The checkpoint's own traffic, so that it is not counted in the next step's.
    summary["comm_bytes"] = take_comm_bytes();
    json unused;
    (void)take_expected_comm(&unused);
    write_rank_file(layout::checkpoint_event(event, mesh_->rank()), summary);
    if (event != "load") return;
    FindingReport local;
    checks::CheckOutput inv = checks::run_invariants(spec_->invariants, spec::Phase::kCheckpoint, state_);
    take(local, inv.findings);
    write(layout::kInvariantsAfterLoad, inv.evidence);
    checks::CheckOutput optimizer = checks::check_optimizer_layout(state_, options_.trainer, spec::Phase::kCheckpoint, spec_->decayed_1d);
    take(local, optimizer.findings);
    write(layout::kOptimizerLayoutAfterLoad, optimizer.evidence);
    take(local, checks::check_frozen_parameters(state_, spec_->frozen, checks::FrozenPoint::kBuilt, 0).findings);
    merge(std::move(local));
  });
}

}  // namespace mih
