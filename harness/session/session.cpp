// ValidationSession (see session.h).
#include "harness/session/session.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <map>

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include "harness/base/error.h"
#include "harness/base/json_fields.h"
#include "harness/base/version.h"
#include "harness/checkpoint/safetensors.h"
#include "harness/compat/collectives.h"
#include "harness/findings/codes.h"
#include "harness/runtime/communicator.h"

namespace mih {
namespace {

using nlohmann::json;

// Keys of the merged findings: the same finding from several ranks is kept once, with the
// ranks that reported it.
std::string finding_key(const json& f) {
  return f.at("code").get<std::string>() + "\n" + f.at("owner").get<std::string>() + "\n" + f.at("message").get<std::string>();
}

// environment.json's "versions": the harness ("mih", compared by verify-only) and its build,
// libtorch, CUDA and NCCL (null when absent), the compiler.
json harness_versions() {
  auto or_null = [](const std::string& v) { return v.empty() ? json(nullptr) : json(v); };
  return {{"mih", std::string(harness_version())},
          {"build_id", build_id()},
          {"libtorch", compat::torch_version()},
          {"cuda", or_null(compat::cuda_version())},
          {"nccl", or_null(compat::nccl_version())},
          {"compiler", __VERSION__}};
}

}  // namespace

std::string session_mode_name(SessionMode mode) {
  switch (mode) {
    case SessionMode::kOff: return "off";
    case SessionMode::kBuild: return "build";
    case SessionMode::kRuntime: return "runtime";
  }
  return "?";
}

SessionMode parse_session_mode(const std::string& name) {
  if (name == "off") return SessionMode::kOff;
  if (name == "build") return SessionMode::kBuild;
  if (name == "runtime") return SessionMode::kRuntime;
  MIH_THROW(Code::kInvalidSpec, "unknown session mode '", name, "'; use off, build or runtime");
}

ValidationSession::ValidationSession(const spec::ModelSpec& spec, SessionOptions options, DeviceMesh& mesh)
    : spec_(&spec), options_(std::move(options)), mesh_(&mesh) {
  MIH_CHECK(options_.mode != SessionMode::kOff, "ValidationSession in mode off: use make_session, which returns no-op hooks");
  spec.validate();
  if (!options_.evidence_dir.empty()) {
    evidence_ = std::make_unique<EvidenceDir>(options_.evidence_dir);
    machine_ = std::make_unique<IntegrationStateMachine>(*evidence_);
    if (mesh.rank() == 0) {
      json env = options_.environment;
      env["world_size"] = mesh.world_size();
      env["session_mode"] = session_mode_name(options_.mode);
      env["versions"] = harness_versions();
      evidence_->write_json("environment.json", capture_environment(options_.source_dir, env));
      evidence_->write_json("spec.resolved.json", spec.to_json());
      json config = options_.config;
      config["lr"] = options_.trainer.lr();
      config["weight_decay"] = options_.trainer.weight_decay();
      config["max_grad_norm"] = options_.trainer.max_grad_norm();
      config["no_weight_decay"] = options_.trainer.no_weight_decay();
      config["world_size"] = mesh.world_size();
      evidence_->write_json("config.resolved.json", config);
      machine_->advance_if_before(IntegrationState::kDiscovered, {"environment.json", "spec.resolved.json"});
    }
  }
}

ValidationSession::~ValidationSession() = default;

template <class Fn>
void ValidationSession::guarded(const char* hook, Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  try {
    fn();
    // end_step measures itself (it writes the per-step figures).
    if (std::string_view(hook) != "end_step") {
      hook_ms_[hook] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    }
  } catch (const std::exception& e) {
    fail_case(std::string("the session's ") + hook + " raised: " + e.what());
    throw;
  }
}

void ValidationSession::write(std::string_view relative, const json& j) const {
  if (evidence_ && mesh_->rank() == 0) evidence_->write_json(relative, j);
}

void ValidationSession::write_step(std::string_view relative, const json& j) const {
  if (evidence_ && mesh_->rank() == 0) evidence_->write_json(relative, j, Durability::kDeferred);
}

void ValidationSession::write_rank_file(std::string_view relative, const json& j) const {
  if (evidence_) evidence_->write_json(relative, j);
}

void ValidationSession::take(FindingReport& into, const FindingReport& from) {
  for (const auto& f : from.findings()) into.add(f);
  // The record of the run stays with this rank's report (rank 0 writes findings.json).
  FindingReport runs;
  for (const auto& r : from.runs()) {
    for (int64_t i = 0; i < r.runs; ++i) runs.ran(r.check, i == 0 ? r.examined : 0, r.unit);
  }
  findings_.absorb(runs);
}

void ValidationSession::merge(FindingReport local, const json& perf) {
  take(pending_, local);
  json mine = {{"findings", pending_.to_json()["findings"]}, {"perf", perf}};
  pending_ = FindingReport();
  const std::vector<json> all =
      all_gather_json(mesh_->comm(MeshAxis::kWorld), mine, state_.context ? state_.context->device()
                                                                          : c10::Device(c10::DeviceType::CPU),
                      "mih.session.findings");
  std::map<std::string, std::pair<json, std::vector<int>>> merged;
  std::vector<std::string> order;
  for (size_t r = 0; r < all.size(); ++r) {
    for (const auto& f : all[r]["findings"]) {
      const std::string key = finding_key(f);
      if (!merged.count(key)) {
        merged[key] = {f, {}};
        order.push_back(key);
      }
      merged[key].second.push_back(static_cast<int>(r));
    }
  }
  for (const auto& key : order) {
    Finding f = merged[key].first.get<Finding>();
    if (!f.facts.is_object()) f.facts = {{"value", f.facts}};
    f.facts["ranks"] = merged[key].second;
    findings_.add(std::move(f));
  }
  if (!perf.is_null()) {
    double step_ms = 0;
    int64_t peak = 0;
    for (const auto& a : all) {
      step_ms = std::max(step_ms, a["perf"]["step_ms"].get<double>());
      peak = std::max(peak, a["perf"]["peak_memory_bytes"].get<int64_t>());
    }
    metrics_.back()["step_ms_max_over_ranks"] = step_ms;
    metrics_.back()["peak_memory_bytes"] = peak;
    check_valid_tokens(all, perf.value("step", int64_t{0}));
  }
  if (!order.empty()) write("check/findings.json", findings_.to_json());
}

void ValidationSession::check_valid_tokens(const std::vector<json>& all, int64_t step) {
  // The global valid-label count recounted from the micro-batches every rank received,
  // against what the Trainer reports and what each rank divided its loss by.
  int64_t recounted = 0;
  for (const auto& a : all) recounted += a["perf"].value("valid_labels", int64_t{0});
  findings_.ran(codes::kCheckValidTokens, 1, "steps");
  const int64_t reported = all[0]["perf"].value("valid_tokens_reported", int64_t{-1});
  json wrong = json::array();
  int64_t normalizers = 0;  // a backend that reports none leaves this check examining nothing
  for (const auto& a : all) normalizers += static_cast<int64_t>(a["perf"].value("loss_normalizers", json::array()).size());
  findings_.ran(codes::kCheckLossNormalizer, normalizers, "loss normalizers (micro-batches x ranks)");
  for (size_t r = 0; r < all.size(); ++r) {
    for (const auto& n : all[r]["perf"].value("loss_normalizers", json::array())) {
      if (std::abs(n.get<double>() - static_cast<double>(recounted)) > 0.5) {
        wrong.push_back({{"rank", r}, {"normalizers", all[r]["perf"]["loss_normalizers"]}});
        break;
      }
    }
  }
  const json facts = {{"step", step}, {"labels_recounted", recounted}, {"valid_tokens_reported", reported},
                      {"ranks_with_another_normalizer", wrong}};
  if (reported != recounted) {
    findings_.add({codes::kDataValidTokens, "runtime", "valid_tokens", Severity::kError,
                   "the trainer reports " + std::to_string(reported) + " valid tokens at step " + std::to_string(step) +
                       ", the micro-batches the model received hold " + std::to_string(recounted) +
                       " labels != -100",
                   facts, "the loss and the gradients are normalized by a count of other tokens than were trained on",
                   "count the valid labels of the global batch once, over every data-parallel and cp rank"});
  }
  if (!wrong.empty()) {
    findings_.add({codes::kDataLossNormalizer, "runtime", "loss_normalizer", Severity::kError,
                   "rank " + std::to_string(wrong[0]["rank"].get<int64_t>()) + " divided its loss at step " +
                       std::to_string(step) + " by " + wrong[0]["normalizers"].dump() + ", not by the " +
                       std::to_string(recounted) + " valid labels of the global batch (" +
                       std::to_string(wrong.size()) + " rank(s))",
                   facts,
                   "a loss normalized per rank or per micro-batch weights tokens unevenly: the gradients depend on how "
                   "the batch is split",
                   "divide every micro-batch's summed token losses by the global valid-token count of the step"});
  }
}

void ValidationSession::attach_optimizer(const TrainingState& state) {
  guarded("attach_optimizer", [&] {
    state_ = state;
    ParallelContext& ctx = *state.context;
    ctx.shared_state().set_recording(runtime());
    std::vector<std::string> names;
    for (const auto& p : ctx.parameters()) {
      names.push_back(p->fqn);
      names.insert(names.end(), p->aliases.begin(), p->aliases.end());
    }
    for (const auto& b : ctx.buffers()) names.push_back(b.fqn);
    for (const auto& item : state.model->named_modules()) names.push_back(item.key());
    spec_->validate_against(names);

    FindingReport local;
    checks::CheckOutput structure = checks::check_structure(state, *spec_);
    take(local, structure.findings);
    write("check/structure.json", structure.evidence);
    write("check/fsdp_units.json", structure.evidence["fsdp_units"]);
    if (evidence_ && mesh_->rank() == 0) evidence_->write_text("check/parameter_ownership.csv", checks::parameter_ownership_csv(ctx));

    checks::CheckOutput optimizer = checks::check_optimizer_layout(state, options_.trainer, spec::Phase::kStructure, spec_->decayed_1d);
    take(local, optimizer.findings);
    write("check/optimizer_layout_initial.json", optimizer.evidence);
    checks::CheckOutput frozen = checks::check_frozen_parameters(state, spec_->frozen, checks::FrozenPoint::kBuilt, 0);
    take(local, frozen.findings);
    write("check/frozen_parameters.json", frozen.evidence);

    std::optional<std::vector<std::string>> source_keys = options_.source_checkpoint_keys;
    if (!source_keys && !spec_->checkpoint.source.empty()) {
      source_keys = safetensors::checkpoint_keys(spec_->checkpoint.source);
    }
    checks::CheckOutput coverage =
        checks::check_checkpoint_coverage(ctx, spec_->checkpoint, source_keys ? &*source_keys : nullptr);
    take(local, coverage.findings);
    write("checkpoint/coverage.json", coverage.evidence);

    checks::CheckOutput structure_inv = checks::run_invariants(spec_->invariants, spec::Phase::kStructure, state);
    take(local, structure_inv.findings);
    write("check/invariants_structure.json", structure_inv.evidence);
    // Weights loaded after the build are examined once they are there (weights_loaded()).
    if (options_.weights_loaded_from.empty()) {
      materialization_invariants(local, "the build's initialization (seed " + std::to_string(options_.config.seed) + ")");
    }

    watchlist_ = probes::build_watchlist(ctx, options_.watch);
    ctx.activation_probes().configure(spec_->activation_watch, options_.watch.projections);
    write("check/parameter_watchlist.json", probes::to_json(watchlist_));
    for (const auto& f : local.findings()) pending_.add(f);
  });
}

void ValidationSession::materialization_invariants(FindingReport& into, const std::string& weights) {
  checks::CheckOutput inv = checks::run_invariants(spec_->invariants, spec::Phase::kMaterialization, state_);
  take(into, inv.findings);
  json evidence = inv.evidence.is_object() ? inv.evidence : json::object();
  for (auto& [name, result] : evidence.items()) result["weights"] = weights;
  write("check/invariants_materialization.json", evidence);
  materialized_ = true;
}

void ValidationSession::weights_loaded() {
  guarded("weights_loaded", [&] {
    MIH_CHECK(!options_.weights_loaded_from.empty(), "weights_loaded: the session was not told that weights are set "
              "after the build (SessionOptions::weights_loaded_from), so its materialization invariants already ran");
    MIH_CHECK(!materialized_, "weights_loaded: called twice; call it once, after the load and before the first step");
    FindingReport local;
    // What the structure check found finite at the build is replaced: the loaded values again.
    checks::CheckOutput values = checks::check_loaded_values(*state_.context, options_.weights_loaded_from);
    take(local, values.findings);
    write("check/loaded_values.json", values.evidence);
    materialization_invariants(local, options_.weights_loaded_from);
    for (const auto& f : local.findings()) pending_.add(f);
  });
}

void ValidationSession::attach_data_pipeline(const BatchSource& batches) {
  guarded("attach_data_pipeline", [&] {
    const Batch first = batches(0);
    checks::CheckOutput data = checks::check_data_contract(spec_->data, first);
    write("data/field_ownership.json", data.evidence);
    checks::CheckOutput documents = checks::check_batch_documents(spec_->data, first);
    if (spec_->data.rows_from_documents) write("data/batch_documents.json", documents.evidence);
    data.findings.absorb(documents.findings);
    identity_ = std::make_unique<checks::InputIdentity>(options_.trainer.sequence_fields(),
                                                        options_.trainer.cp_replicated_fields());
    merge(std::move(data.findings));
    if (machine_ && mesh_->rank() == 0 && !findings_.failed()) {
      machine_->advance_if_before(IntegrationState::kStructureValidated,
                                  {"check/findings.json", "check/structure.json", "check/optimizer_layout_initial.json",
                                   "data/field_ownership.json", "checkpoint/coverage.json"});
    }
  });
}

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
      write("data/observed_forward_fields.json", fields.evidence);
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
    write("data/token_losses.json", losses.evidence);
  });
}

void ValidationSession::before_gradient_sync(int64_t step) {
  guarded("before_gradient_sync", [&] {
    if (!runtime() || state_.context->tp_size() == 1) return;
    checks::CheckOutput partial = checks::check_tp_partial_gradients(*state_.context, step);
    take(pending_, partial.findings);
    if (step == first_step_) write_step("cases/runtime/tp_partial_gradients_step" + std::to_string(step) + ".json", partial.evidence);
  });
}

void ValidationSession::after_backward_before_clip(int64_t step) {
  guarded("after_backward_before_clip", [&] {
    if (!runtime()) return;
    checks::CheckOutput reductions = checks::check_gradient_reductions(*state_.context, step);
    take(pending_, reductions.findings);
    if (step == 0 || step == first_step_) {
      write_step("cases/runtime/gradient_reductions_step" + std::to_string(step) + ".json", reductions.evidence);
    }
    checks::CheckOutput modal = checks::check_modality_gradients(*state_.context, spec_->modalities, fields_seen_, step);
    take(pending_, modal.findings);
    if (!spec_->modalities.empty()) write_step("cases/runtime/modality_gradients_step" + std::to_string(step) + ".json", modal.evidence);
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
    write_step("cases/runtime/optimizer_layout_step" + std::to_string(step) + ".json", optimizer.evidence);
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
    write_step("cases/runtime/gradient_presence_step" + std::to_string(step) + ".json", presence.evidence);
    json replicas;
    FindingReport r = probes::check_replica_consistency(*state_.context, step, &replicas);
    take(pending_, r);
    write_step("cases/runtime/replicas_step" + std::to_string(step) + ".json", replicas);
  });
}

void ValidationSession::probe(probes::Stage stage, int64_t step) {
  json j = probes::probe_stage(*state_.context, watchlist_, stage, state_.optimizer, options_.watch);
  j["step"] = step;
  if (evidence_ && mesh_->rank() == 0) evidence_->append_jsonl("probes/rank0.jsonl", j);
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
  if (evidence_ && mesh_->rank() == 0) {
    evidence_->append_jsonl("probes/rank0.jsonl", {{"stage", "forward_output"}, {"step", step}, {"order", order}, {"tensors", forward}});
    evidence_->append_jsonl("probes/rank0.jsonl", {{"stage", "output_grad"}, {"step", step}, {"order", order}, {"tensors", grad}});
  }
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
    if (evidence_ && mesh_->rank() == 0) evidence_->append_jsonl("data/input_identity.jsonl", identity);

    checks::CheckOutput shared =
        checks::check_shared_state(ctx.shared_state().events(), spec_->shared_state, step, &fields_seen_);
    take(local, shared.findings);
    write_step("cases/runtime/shared_state_step" + std::to_string(step) + ".json", shared.evidence);

    checks::CheckOutput inv = checks::run_invariants(spec_->invariants, spec::Phase::kRuntime, state_);
    take(local, inv.findings);
    if (!inv.evidence.empty()) write_step("cases/runtime/invariants_step" + std::to_string(step) + ".json", inv.evidence);

    // The reduction paths the runtime took so far (reduction_paths.h), for `mih reach`.
    json paths = json::object();
    for (const auto& [name, reached] : ctx.reached_reduction_paths()) {
      const ReductionPath& path = reduction_path(name);
      paths[name] = {{"axis", path.axis}, {"axis_size", reached.axis_size}, {"op", path.op},
                     {"site", path.site}, {"parameters", reached.parameters}};
    }
    write_step("cases/runtime/reduction_paths.json", {{"through_step", step}, {"paths", paths}});

    // Communication of training (not of the session) since the last step, per axis.
    json sites, expected_by_layer;
    const json comm = take_comm_bytes(&sites);
    const json expected = take_expected_comm(&expected_by_layer);
    write_step("cases/runtime/comm_expected_step" + std::to_string(step) + ".json", expected_by_layer);
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
    metrics_.push_back(row);
    json perf = {{"step", step},
                 {"step_ms", m.step_ms},
                 {"peak_memory_bytes", probes::peak_memory_bytes(ctx.device())},
                 {"comm_bytes", comm},
                 // tp ranks see the same rows: count them once.
                 {"valid_labels", mesh_->comm(MeshAxis::kTp).rank() == 0 ? labels_seen_ : 0},
                 {"loss_normalizers", m.loss_normalizers},
                 {"valid_tokens_reported", m.valid_tokens}};
    merge(std::move(local), perf);
    hook_ms_["end_step"] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    perf["session_ms"] = hook_ms_;
    double total = 0;
    for (const auto& [hook, ms] : hook_ms_) total += ms;
    metrics_.back()["session_ms"] = total;
    hook_ms_.clear();
    performance_.push_back(perf);
    if (evidence_) evidence_->append_jsonl("cases/runtime/performance_rank" + std::to_string(mesh_->rank()) + ".jsonl", perf);
    if (evidence_ && mesh_->rank() == 0) evidence_->append_jsonl("cases/runtime/metrics.jsonl", metrics_.back());
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
    write_step("check/activation_checkpoint.json", {{"enabled", ctx.config().activation_checkpointing},
                                                    {"regions", ctx.checkpoint_regions()},
                                                    {"steps", checkpoint_steps_}});
    // At the first step this session trains: step 0, or the first after a resume's load (whose
    // evidence directory is the case's own).
    if (step != first_step_) return;
    write("check/fsdp_trace.json", ctx.to_json());
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
    write_rank_file("checkpoint/" + event + "_rank" + std::to_string(mesh_->rank()) + ".json", summary);
    if (event != "load") return;
    FindingReport local;
    checks::CheckOutput inv = checks::run_invariants(spec_->invariants, spec::Phase::kCheckpoint, state_);
    take(local, inv.findings);
    write("checkpoint/invariants_after_load.json", inv.evidence);
    checks::CheckOutput optimizer = checks::check_optimizer_layout(state_, options_.trainer, spec::Phase::kCheckpoint, spec_->decayed_1d);
    take(local, optimizer.findings);
    write("checkpoint/optimizer_layout_after_load.json", optimizer.evidence);
    take(local, checks::check_frozen_parameters(state_, spec_->frozen, checks::FrozenPoint::kBuilt, 0).findings);
    merge(std::move(local));
  });
}

void ValidationSession::fail_case(const std::string& reason) {
  if (failed_) return;
  failed_ = true;
  if (!evidence_ || mesh_->rank() != 0) return;
  try {
    evidence_->write_json("check/findings.json", findings_.to_json());
    IntegrationState s;
    if (!machine_->current(&s) || (s != IntegrationState::kFailed && s != IntegrationState::kBlocked)) {
      machine_->fail(reason, {"check/findings.json"});
    }
  } catch (const std::exception&) {
    // The original failure is what the caller reports; a second one here must not mask it.
  }
}

bool ValidationSession::finish() {
  for (const auto& f : pending_.findings()) findings_.add(f);  // rank-local leftovers
  pending_ = FindingReport();
  if (failed_) return false;
  if (!materialized_ && !options_.weights_loaded_from.empty() && state_.context) {
    fail_case("the materialization invariants never ran: weights were to be loaded after the build (" +
              options_.weights_loaded_from + ") and weights_loaded() was not called after the load");
    return false;
  }
  if (runtime() && !presence_steps_.empty()) {
    try {
      gradients_received();
    } catch (const std::exception& e) {
      fail_case(std::string("the session's finish raised: ") + e.what());
      return false;
    }
  }
  if (findings_.failed()) {
    fail_case("findings with errors:\n" + findings_.summary());
    return false;
  }
  if (evidence_ && mesh_->rank() == 0) {
    evidence_->write_json("check/findings.json", findings_.to_json());
    machine_->advance_if_before(IntegrationState::kStructureValidated, {"check/findings.json"});
  }
  return !failed_;
}

void ValidationSession::gradients_received() {
  // The whole run: this session's steps, and those of the run it continues (a resume's save
  // phase), whose record rank 0 wrote where it writes (the other ranks judge this session's
  // steps alone; only rank 0's findings are written).
  std::set<std::string> received = gradient_received_;
  std::vector<int64_t> steps = presence_steps_;
  json earlier;
  if (!options_.continues_evidence.empty() && mesh_->rank() == 0) {
    const std::filesystem::path file = options_.continues_evidence / "check/gradients_received.json";
    earlier = read_json_file(file);
    auto all_of = [](const json& list, bool (json::*is)() const noexcept) {
      return list.is_array() && std::all_of(list.begin(), list.end(), [&](const json& v) { return (v.*is)(); });
    };
    MIH_CHECK_CODE(earlier.is_object() && all_of(earlier.value("never_received", json()), &json::is_string) &&
                       all_of(earlier.value("steps", json()), &json::is_number_integer),
                   Code::kFailedPrecondition, "evidence file ", file.string(),
                   " has no list never_received of names or steps of integers: it was edited or written by another "
                   "version; rerun the case");
    std::set<std::string> never_before;
    for (const auto& f : earlier["never_received"]) never_before.insert(f.get<std::string>());
    for (const auto& p : trainable_) {
      if (!never_before.count(p.fqn)) received.insert(p.fqn);
    }
    const std::vector<int64_t> before = earlier["steps"].get<std::vector<int64_t>>();
    steps.insert(steps.begin(), before.begin(), before.end());
  }
  checks::CheckOutput out = checks::check_gradients_received(trainable_, received, steps, spec_->unused_parameters);
  // Not the end of the run: a later step may still reach a parameter.
  if (!options_.run_continues) {
    for (const auto& f : out.findings.findings()) findings_.add(f);
    for (const auto& r : out.findings.runs()) findings_.ran(r.check, r.examined, r.unit);
  }
  // The whole run so far, which a later phase continues from.
  write("check/gradients_received.json", out.evidence);
}

std::unique_ptr<TrainingHooks> make_session(const spec::ModelSpec& spec, SessionOptions options, DeviceMesh& mesh) {
  if (options.mode == SessionMode::kOff) return std::make_unique<TrainingHooks>();
  return std::make_unique<ValidationSession>(spec, std::move(options), mesh);
}

}  // namespace mih
