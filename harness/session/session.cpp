// ValidationSession (see session.h): construction, evidence writing, merging findings across
// ranks, the attach hooks and the end of the case; the per-step hooks are in session_steps.cpp.
#include "harness/session/session.h"
#include "harness/session/session_internal.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <map>

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include "harness/base/error.h"
#include "harness/base/evidence_layout.h"
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
  // Its checks gather over the world what one rank's modules hold; a pipeline stage holds part
  // of them (issue 37: the stage-wise checks are not there yet). Refused before any collective.
  MIH_CHECK(!options_.config.pipelined() && mesh.config().pp == 1, "the validation session does not run under pipeline parallelism yet (",
            options_.config.name(), "): its checks assume every rank holds every module in one forward; train pp "
            "configs without a session (the Trainer supports pp) or run the case without pp and vpp");
  spec.validate();
  if (!options_.evidence_dir.empty()) {
    evidence_ = std::make_unique<EvidenceDir>(options_.evidence_dir);
    machine_ = std::make_unique<IntegrationStateMachine>(*evidence_);
    if (mesh.rank() == 0) {
      json env = options_.environment;
      env["world_size"] = mesh.world_size();
      env["session_mode"] = session_mode_name(options_.mode);
      env["versions"] = harness_versions();
      evidence_->write_json(layout::kEnvironment, capture_environment(options_.source_dir, env));
      evidence_->write_json(layout::kSpecResolved, spec.to_json());
      json config = options_.config;
      config["lr"] = options_.trainer.lr();
      config["weight_decay"] = options_.trainer.weight_decay();
      config["max_grad_norm"] = options_.trainer.max_grad_norm();
      config["no_weight_decay"] = options_.trainer.no_weight_decay();
      config["world_size"] = mesh.world_size();
      evidence_->write_json(layout::kConfigResolved, config);
      machine_->advance_if_before(IntegrationState::kDiscovered, {layout::kEnvironment, layout::kSpecResolved});
    }
  }
}

ValidationSession::~ValidationSession() = default;


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
  if (!order.empty()) write(layout::kFindings, findings_.to_json());
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
    write(layout::kStructure, structure.evidence);
    write(layout::kFsdpUnits, structure.evidence["fsdp_units"]);
    if (evidence_ && mesh_->rank() == 0) evidence_->write_text(layout::kParameterOwnership, checks::parameter_ownership_csv(ctx));

    checks::CheckOutput optimizer = checks::check_optimizer_layout(state, options_.trainer, spec::Phase::kStructure, spec_->decayed_1d);
    take(local, optimizer.findings);
    write(layout::kOptimizerLayoutInitial, optimizer.evidence);
    checks::CheckOutput frozen = checks::check_frozen_parameters(state, spec_->frozen, checks::FrozenPoint::kBuilt, 0);
    take(local, frozen.findings);
    write(layout::kFrozenParameters, frozen.evidence);

    std::optional<std::vector<std::string>> source_keys = options_.source_checkpoint_keys;
    if (!source_keys && !spec_->checkpoint.source.empty()) {
      source_keys = safetensors::checkpoint_keys(spec_->checkpoint.source);
    }
    checks::CheckOutput coverage =
        checks::check_checkpoint_coverage(ctx, spec_->checkpoint, source_keys ? &*source_keys : nullptr);
    take(local, coverage.findings);
    write(layout::kCheckpointCoverage, coverage.evidence);

    checks::CheckOutput structure_inv = checks::run_invariants(spec_->invariants, spec::Phase::kStructure, state);
    take(local, structure_inv.findings);
    write(layout::invariants("structure"), structure_inv.evidence);
    // Weights loaded after the build are examined once they are there (weights_loaded()).
    if (options_.weights_loaded_from.empty()) {
      materialization_invariants(local, "the build's initialization (seed " + std::to_string(options_.config.seed) + ")");
    }

    watchlist_ = probes::build_watchlist(ctx, options_.watch);
    ctx.activation_probes().configure(spec_->activation_watch, options_.watch.projections);
    write(layout::kParameterWatchlist, probes::to_json(watchlist_));
    for (const auto& f : local.findings()) pending_.add(f);
  });
}

void ValidationSession::materialization_invariants(FindingReport& into, const std::string& weights) {
  checks::CheckOutput inv = checks::run_invariants(spec_->invariants, spec::Phase::kMaterialization, state_);
  take(into, inv.findings);
  json evidence = inv.evidence.is_object() ? inv.evidence : json::object();
  for (auto& [name, result] : evidence.items()) result["weights"] = weights;
  write(layout::invariants("materialization"), evidence);
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
    write(layout::kLoadedValues, values.evidence);
    materialization_invariants(local, options_.weights_loaded_from);
    for (const auto& f : local.findings()) pending_.add(f);
  });
}

void ValidationSession::attach_data_pipeline(const BatchSource& batches) {
  guarded("attach_data_pipeline", [&] {
    const Batch first = batches(0);
    checks::CheckOutput data = checks::check_data_contract(spec_->data, first);
    write(layout::kFieldOwnership, data.evidence);
    checks::CheckOutput documents = checks::check_batch_documents(spec_->data, first);
    if (spec_->data.rows_from_documents) write(layout::kBatchDocuments, documents.evidence);
    data.findings.absorb(documents.findings);
    identity_ = std::make_unique<checks::InputIdentity>(options_.trainer.sequence_fields(),
                                                        options_.trainer.cp_replicated_fields());
    merge(std::move(data.findings));
    if (machine_ && mesh_->rank() == 0 && !findings_.failed()) {
      machine_->advance_if_before(IntegrationState::kStructureValidated,
                                  {layout::kFindings, layout::kStructure, layout::kOptimizerLayoutInitial,
                                   layout::kFieldOwnership, layout::kCheckpointCoverage});
    }
  });
}

void ValidationSession::fail_case(const std::string& reason) {
  if (failed_) return;
  failed_ = true;
  if (!evidence_ || mesh_->rank() != 0) return;
  try {
    evidence_->write_json(layout::kFindings, findings_.to_json());
    IntegrationState s;
    if (!machine_->current(&s) || (s != IntegrationState::kFailed && s != IntegrationState::kBlocked)) {
      machine_->fail(reason, {layout::kFindings});
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
    evidence_->write_json(layout::kFindings, findings_.to_json());
    machine_->advance_if_before(IntegrationState::kStructureValidated, {layout::kFindings});
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
    const std::filesystem::path file = options_.continues_evidence / layout::kGradientsReceived;
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
  write(layout::kGradientsReceived, out.evidence);
}

std::unique_ptr<TrainingHooks> make_session(const spec::ModelSpec& spec, SessionOptions options, DeviceMesh& mesh) {
  if (options.mode == SessionMode::kOff) return std::make_unique<TrainingHooks>();
  return std::make_unique<ValidationSession>(spec, std::move(options), mesh);
}

}  // namespace mih
