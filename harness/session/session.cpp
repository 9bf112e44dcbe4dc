// ValidationSession (see session.h): construction, evidence writing, merging findings across
// ranks, the attach hooks and the end of the case; the per-step hooks are in session_steps.cpp.
#include "harness/session/session.h"
#include "harness/session/session_internal.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <map>
#include <set>
#include <utility>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/json_fields.h"
#include "harness/base/version.h"
#include "harness/checkpoint/safetensors.h"
#include "harness/contract/contract.h"
#include "harness/contract/gradients_received.h"
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

// Under pp: one stage's evidence `from` merged into another's `into`, in stage order. Objects
// keyed by parameter, module or unit hold each stage's own keys (a key both hold merges
// inside); lists that differ are concatenated (the stages' modules, units, forward order);
// a flag holds only if it holds on both (an invariant passed on every stage); another value
// both hold equal (a step, a shape) stays; one they hold apart is the first stage's.
void merge_stage_evidence(json& into, const json& from) {
  if (into.is_object() && from.is_object()) {
    for (const auto& [k, v] : from.items()) {
      if (!into.contains(k)) {
        into[k] = v;
      } else {
        merge_stage_evidence(into[k], v);
      }
    }
  } else if (into.is_array() && from.is_array()) {
    // One entry per step on every stage (activation_checkpoint.json's steps): merged entry by
    // entry, not listed twice.
    const auto per_step = [](const json& a, const json& b) {
      if (a.size() != b.size() || a.empty()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!a[i].is_object() || !b[i].is_object() || !a[i].contains("step") || a[i]["step"] != b[i].value("step", json())) {
          return false;
        }
      }
      return true;
    };
    if (per_step(into, from)) {
      for (size_t i = 0; i < into.size(); ++i) merge_stage_evidence(into[i], from[i]);
    } else if (into != from) {
      for (const auto& v : from) into.push_back(v);
    }
  } else if (into.is_boolean() && from.is_boolean()) {
    into = into.get<bool>() && from.get<bool>();
  }
}

// A CSV table's rows after `into`'s (its header kept once).
void merge_stage_table(json& into, const json& from) {
  const std::string text = from.get<std::string>();
  const size_t header = text.find('\n');
  into = into.get<std::string>() + (header == std::string::npos ? "" : text.substr(header + 1));
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
  // Under pp the run-level gradient check gathers the stages' parameters at the last step,
  // while every rank still trains (at finish a rank may be gone): it must know that step.
  MIH_CHECK(mesh.config().pp == 1 || options_.mode != SessionMode::kRuntime || options_.last_step >= 0,
            "the validation session under pp (", options_.config.name(), ") needs SessionOptions::last_step, the last step "
            "this session trains (its gradient check gathers every stage's parameters there); set it");
  spec.validate();
  if (!options_.evidence_dir.empty()) {
    evidence_ = std::make_unique<EvidenceDir>(options_.evidence_dir);
    machine_ = std::make_unique<IntegrationStateMachine>(*evidence_);
    if (mesh.rank() == 0) {
      json env = options_.environment;
      env["world_size"] = mesh.world_size();
      env["session_mode"] = session_mode_name(options_.mode);
      env["versions"] = harness_versions();
      // The contract the case directory follows and who wrote it (docs/evidence.md).
      env[contract::kStampKey] = contract::stamp("mih " + std::string(harness_version()) + " (session)");
      evidence_->write_json(layout::kEnvironment, capture_environment(options_.source_dir, env));
      evidence_->write_json(layout::kSpecResolved, spec.to_json());
      json config = options_.config;
      config["optimizer"] = optimizer_kind_name(options_.trainer.optimizer());
      config["lr"] = options_.trainer.lr();
      config["warmup_steps"] = options_.trainer.warmup_steps();
      config["decay_steps"] = options_.trainer.decay_steps();
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
  if (pipelined()) return buffer_stage_evidence(relative, j, "json");
  if (evidence_ && mesh_->rank() == 0) evidence_->write_json(relative, j);
}

void ValidationSession::write_step(std::string_view relative, const json& j) const {
  if (pipelined()) return buffer_stage_evidence(relative, j, "step");
  if (evidence_ && mesh_->rank() == 0) evidence_->write_json(relative, j, Durability::kDeferred);
}

void ValidationSession::append(std::string_view relative, const json& line) const {
  if (pipelined()) return buffer_stage_evidence(relative, line, "append");
  if (evidence_ && mesh_->rank() == 0) evidence_->append_jsonl(relative, line);
}

void ValidationSession::write_text(std::string_view relative, const std::string& text) const {
  if (pipelined()) return buffer_stage_evidence(relative, text, "text");
  if (evidence_ && mesh_->rank() == 0) evidence_->write_text(relative, text);
}

c10::Device ValidationSession::device() const {
  return state_.context ? state_.context->device() : c10::Device(c10::DeviceType::CPU);
}

bool ValidationSession::pipelined() const { return mesh_->config().pp > 1; }

void ValidationSession::buffer_stage_evidence(std::string_view relative, const json& j, const char* how) const {
  if (!evidence_ || mesh_->comm(MeshAxis::kStage).rank() != 0) return;
  stage_evidence_.push_back({{"path", std::string(relative)}, {"how", how}, {"value", j}});
}

void ValidationSession::flush_stage_evidence() {
  // Every pp group but rank 0's holds ranks that write nothing: only rank 0's group gathers.
  if (!pipelined() || !evidence_ || mesh_->comm(MeshAxis::kStage).rank() != 0) return;
  json mine = std::exchange(stage_evidence_, json::array());
  const std::vector<json> stages = all_gather_json(mesh_->comm(MeshAxis::kPp), mine, device(), "mih.session.stage_evidence");
  if (mesh_->rank() != 0) return;
  std::vector<std::string> order;  // the paths in the order first written
  std::map<std::string, std::pair<std::string, json>> files;
  std::map<std::string, std::vector<json>> lines;
  for (size_t stage = 0; stage < stages.size(); ++stage) {
    // This pp rank's files as last written, and its lines per file in order.
    std::map<std::string, std::pair<std::string, json>> last;
    std::map<std::string, std::vector<json>> appended;
    for (const json& w : stages[stage]) {
      const std::string path = w.at("path").get<std::string>(), how = w.at("how").get<std::string>();
      if (!files.count(path) && !lines.count(path) && !last.count(path) && !appended.count(path)) order.push_back(path);
      if (how == "append") {
        appended[path].push_back(w.at("value"));
      } else {
        last[path] = {how, w.at("value")};
      }
    }
    for (auto& [path, file] : last) {
      auto it = files.find(path);
      if (it == files.end()) {
        files.emplace(path, std::move(file));
      } else if (file.first == "text") {
        merge_stage_table(it->second.second, file.second);
      } else {
        merge_stage_evidence(it->second.second, file.second);
      }
    }
    for (auto& [path, mine_lines] : appended) {
      std::vector<json>& merged = lines[path];
      MIH_CHECK_CODE(merged.empty() || merged.size() == mine_lines.size(), Code::kInternal, "evidence ", path, ": pp rank ",
                     stage, " appended ", mine_lines.size(), " lines where pp rank 0 appended ", merged.size(),
                     ": the stages' hooks ran apart");
      if (merged.empty()) {
        merged = std::move(mine_lines);
        continue;
      }
      for (size_t k = 0; k < merged.size(); ++k) merge_stage_evidence(merged[k], mine_lines[k]);
    }
  }
  std::set<std::string> seen;
  for (const std::string& path : order) {
    if (!seen.insert(path).second) continue;
    if (auto it = files.find(path); it != files.end()) {
      const auto& [how, value] = it->second;
      if (how == "text") {
        evidence_->write_text(path, value.get<std::string>());
      } else {
        evidence_->write_json(path, value, how == "step" ? Durability::kDeferred : Durability::kFsync);
      }
    }
    if (auto it = lines.find(path); it != lines.end()) {
      for (const json& line : it->second) evidence_->append_jsonl(path, line);
    }
  }
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
  if (pipelined()) stage_runs_.absorb(runs);
}

void ValidationSession::merge(FindingReport local, const json& perf) {
  flush_stage_evidence();
  take(pending_, local);
  json mine = {{"findings", pending_.to_json()["findings"]}, {"perf", perf}};
  pending_ = FindingReport();
  // Under pp the checks of a later stage examined its parameters and modules: the record of
  // their runs joins rank 0's from each later stage's writing rank.
  const bool later_stage = pipelined() && mesh_->comm(MeshAxis::kPp).rank() > 0 && mesh_->comm(MeshAxis::kStage).rank() == 0;
  mine["runs"] = later_stage ? stage_runs_.to_json()["checks"] : json::object();
  stage_runs_ = FindingReport();
  const std::vector<json> all = all_gather_json(mesh_->comm(MeshAxis::kWorld), mine, device(), "mih.session.findings");
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
    const json runs = all[r].value("runs", json::object());  // alive through the loop
    for (const auto& [check, run] : runs.items()) {
      // The data checks run alike on every stage (each receives the whole micro-batches).
      if (check == codes::kCheckDataContract || check == codes::kCheckBatchDocuments ||
          check == codes::kCheckForwardFields || check == codes::kCheckInputTp || check == codes::kCheckInputCp) {
        continue;
      }
      const int64_t n = run.at("runs").get<int64_t>();
      for (int64_t i = 0; i < n; ++i) {
        findings_.ran(check, i == 0 ? run.at("examined").get<int64_t>() : 0, run.at("unit").get<std::string>());
      }
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
  // Merged over the world already: written as they are, never buffered per stage.
  if (!order.empty() && evidence_ && mesh_->rank() == 0) evidence_->write_json(layout::kFindings, findings_.to_json());
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
    // What the build moved (under pp, the stages' table of parameter copies) belongs to no
    // step: the first step's communication starts here.
    (void)take_comm_bytes();
    json setup_expected;
    (void)take_expected_comm(&setup_expected);
    std::vector<std::string> names;
    for (const auto& p : ctx.parameters()) {
      names.push_back(p->fqn);
      names.insert(names.end(), p->aliases.begin(), p->aliases.end());
    }
    for (const auto& b : ctx.buffers()) names.push_back(b.fqn);
    std::vector<std::string> modules;  // this rank's (under pp, its stage's)
    for (const auto& item : state.model->named_modules()) modules.push_back(item.key());
    names.insert(names.end(), modules.begin(), modules.end());
    if (pipelined()) {
      // A stage holds its own modules: the spec names those of every stage (a collective).
      std::vector<std::string> every_stage;
      for (const json& stage : all_gather_json(mesh_->comm(MeshAxis::kPp), names, ctx.device(), "mih.session.names")) {
        for (const auto& n : stage) every_stage.push_back(n.get<std::string>());
      }
      names = std::move(every_stage);
    }
    spec_->validate_against(names);

    FindingReport local;
    checks::CheckOutput structure = checks::check_structure(state, *spec_);
    take(local, structure.findings);
    write(layout::kStructure, structure.evidence);
    write(layout::kFsdpUnits, structure.evidence["fsdp_units"]);
    write_text(layout::kParameterOwnership, checks::parameter_ownership_csv(ctx));

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
    std::vector<checks::CoverageTarget> targets = checks::coverage_targets(ctx);
    if (pipelined()) {
      // A key map covers the whole model: every stage's targets, judged on the first stage.
      json mine = json::array();
      for (const auto& t : targets) mine.push_back({t.fqn, t.aliases, t.shape});
      targets.clear();
      for (const json& stage : all_gather_json(mesh_->comm(MeshAxis::kPp), mine, ctx.device(), "mih.session.coverage")) {
        for (const json& t : stage) {
          targets.push_back({t[0].get<std::string>(), t[1].get<std::vector<std::string>>(), t[2].get<std::vector<int64_t>>()});
        }
      }
    }
    if (!pipelined() || mesh_->comm(MeshAxis::kPp).rank() == 0) {
      checks::CheckOutput coverage =
          checks::check_checkpoint_coverage(targets, spec_->checkpoint, source_keys ? &*source_keys : nullptr);
      take(local, coverage.findings);
      write(layout::kCheckpointCoverage, coverage.evidence);
    }

    checks::CheckOutput structure_inv = checks::run_invariants(spec_->invariants, spec::Phase::kStructure, state);
    take(local, structure_inv.findings);
    write(layout::invariants("structure"), structure_inv.evidence);
    // Weights loaded after the build are examined once they are there (weights_loaded()).
    if (options_.weights_loaded_from.empty()) {
      materialization_invariants(local, "the build's initialization (seed " + std::to_string(options_.config.seed) + ")");
    }

    // The shared state this rank's modules can publish and consume: under pp a stage's
    // (a key whose producer is on another stage is that stage's to check).
    shared_state_.clear();
    auto here = [&](const std::string& pattern) {
      return std::any_of(modules.begin(), modules.end(), [&](const std::string& m) { return checks::glob_match(pattern, m); });
    };
    for (spec::SharedStateSpec s : spec_->shared_state) {
      if (pipelined()) {
        if (!here(s.producer)) continue;
        std::erase_if(s.consumers, [&](const std::string& c) { return !here(c); });
      }
      shared_state_.push_back(std::move(s));
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
  if (runtime() && !presence_steps_.empty() && !gradients_checked_) {
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
  std::vector<checks::ParameterNames> trainable = trainable_;
  if (pipelined() && mesh_->comm(MeshAxis::kStage).rank() == 0) {
    // Each stage knows its own parameters: the stages' writing ranks judge their union.
    json mine = {{"trainable", json::array()}, {"received", received}};
    for (const auto& p : trainable_) mine["trainable"].push_back({{"fqn", p.fqn}, {"aliases", p.aliases}});
    const std::vector<json> all = all_gather_json(mesh_->comm(MeshAxis::kPp), mine, device(), "mih.session.gradients_received");
    trainable.clear();
    std::set<std::string> listed;
    for (const json& stage : all) {
      for (const auto& name : stage.at("received")) received.insert(name.get<std::string>());
      for (const auto& p : stage.at("trainable")) {
        if (!listed.insert(p.at("fqn").get<std::string>()).second) continue;
        trainable.push_back({p.at("fqn").get<std::string>(), p.at("aliases").get<std::vector<std::string>>()});
      }
    }
  }
  gradients_checked_ = true;
  std::vector<int64_t> steps = presence_steps_;
  if (!options_.continues_evidence.empty() && mesh_->rank() == 0) {
    const contract::GradientsReceived earlier =
        contract::read_gradients_received(options_.continues_evidence / layout::kGradientsReceived);
    const std::set<std::string> never_before(earlier.never_received.begin(), earlier.never_received.end());
    for (const auto& p : trainable) {
      if (!never_before.count(p.fqn)) received.insert(p.fqn);
    }
    steps.insert(steps.begin(), earlier.steps.begin(), earlier.steps.end());
  }
  checks::CheckOutput out = checks::check_gradients_received(trainable, received, steps, spec_->unused_parameters);
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
