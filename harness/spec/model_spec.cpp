// ModelSpec validation, JSON and the registry (see model_spec.h).
#include "harness/spec/model_spec.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "harness/base/error.h"
#include "harness/checkpoint/safetensors.h"
#include "harness/base/strings.h"

namespace mih::spec {
namespace {

bool glob_matches_any(const std::string& pattern, const std::vector<std::string>& names) {
  for (const auto& n : names) {
    if (::fnmatch(pattern.c_str(), n.c_str(), 0) == 0) return true;
  }
  return false;
}

}  // namespace

TrainerOptions DataSpec::apply_sharding(TrainerOptions options) const {
  std::vector<std::string> sequence, replicated;
  for (const auto& f : fields) (f.cp == CpSharding::kSequence ? sequence : replicated).push_back(f.name);
  return options.sequence_fields(sequence).cp_replicated_fields(replicated);
}

std::string phase_name(Phase phase) {
  switch (phase) {
    case Phase::kStructure: return "structure";
    case Phase::kMaterialization: return "materialization";
    case Phase::kCheckpoint: return "checkpoint";
    case Phase::kRuntime: return "runtime";
  }
  return "?";
}

Phase parse_phase(const std::string& name) {
  for (Phase p : {Phase::kStructure, Phase::kMaterialization, Phase::kCheckpoint, Phase::kRuntime}) {
    if (phase_name(p) == name) return p;
  }
  MIH_THROW(Code::kInvalidSpec, "unknown phase '", name, "'; valid: structure, materialization, checkpoint, runtime");
}

void ModelSpec::validate() const {
  const std::string where = "spec '" + name + "'";
  MIH_CHECK(!name.empty(), "a spec has an empty name");
  MIH_CHECK(static_cast<bool>(factory), where, ": factory is empty");
  MIH_CHECK(static_cast<bool>(data.make_batches), where, ": data.make_batches is empty");
  std::set<std::string> fields = {"input_ids", "labels", "position_ids"};
  for (const auto& f : data.fields) {
    MIH_CHECK(!f.name.empty(), where, ": data.fields has a field with an empty name");
    MIH_CHECK(fields.insert(f.name).second, where, ": data.fields declares '", f.name,
              "' twice (input_ids, labels and position_ids are implicit)");
  }
  for (const auto& m : modalities) {
    MIH_CHECK(fields.count(m.field), where, ": modality field '", m.field, "' is not a data field; declare it in data.fields");
    MIH_CHECK(!m.parameter_patterns.empty(), where, ": modality '", m.field, "' names no parameter pattern");
  }
  for (const auto& p : checkpoint.training_only) MIH_CHECK(!p.empty(), where, ": checkpoint.training_only has an empty pattern");
  std::set<std::string> keys;
  for (const auto& s : shared_state) {
    MIH_CHECK(keys.insert(s.key).second, where, ": shared_state key '", s.key, "' is declared twice");
    MIH_CHECK(!s.producer.empty() && !s.consumers.empty(), where, ": shared_state '", s.key,
              "' needs a producer and at least one consumer");
    MIH_CHECK(s.requires_field.empty() || fields.count(s.requires_field), where, ": shared_state '", s.key,
              "' requires field '", s.requires_field, "', which is not a data field; declare it in data.fields");
  }
  std::set<std::string> names;
  for (const auto& inv : invariants) {
    MIH_CHECK(names.insert("invariant " + inv.name).second, where, ": invariant '", inv.name, "' is declared twice");
    MIH_CHECK(static_cast<bool>(inv.check), where, ": invariant '", inv.name, "' has no check");
  }
  for (const auto& c : parity_cases) {
    MIH_CHECK(names.insert("parity " + c.name).second, where, ": module parity case '", c.name, "' is declared twice");
    with_context(where, [&] { c.validate(); });
  }
  KeyMap check_rules(checkpoint.key_map);  // throws on a malformed rule
  MIH_CHECK(trainer.lr() > 0 && std::isfinite(trainer.lr()), where, ": trainer.lr must be a positive number, got ",
            trainer.lr());
  MIH_CHECK(trainer.weight_decay() >= 0 && std::isfinite(trainer.weight_decay()), where,
            ": trainer.weight_decay must be >= 0, got ", trainer.weight_decay());
  for (const auto& p : decayed_1d) MIH_CHECK(!p.empty(), where, ": decayed_1d has an empty pattern");
  for (const auto& p : frozen) MIH_CHECK(!p.empty(), where, ": frozen has an empty pattern");
  for (const auto& p : unused_parameters) MIH_CHECK(!p.empty(), where, ": unused_parameters has an empty pattern");
  for (const auto& p : activation_watch) MIH_CHECK(!p.empty(), where, ": activation_watch has an empty pattern");
  std::set<std::string> golden_modules;
  for (const auto& [module, index] : golden.layers) {
    MIH_CHECK(!module.empty() && index >= 0, where, ": golden.layers maps '", module, "' to hidden state ", index,
              "; give a module name and an index >= 0 (0 the embeddings, i decoder layer i - 1's output)");
    MIH_CHECK(golden_modules.insert(module).second, where, ": golden.layers maps module '", module, "' twice");
  }
  if (!checkpoint.source.empty()) {
    with_context(where + ": checkpoint.source", [&] { (void)safetensors::checkpoint_keys(checkpoint.source); });
  }
}

void ModelSpec::validate_against(const std::vector<std::string>& fqns) const {
  validate();
  const std::string where = "spec '" + name + "'";
  auto require = [&](const std::string& pattern, const std::string& field) {
    MIH_CHECK(glob_matches_any(pattern, fqns), where, ": ", field, " pattern '", pattern,
              "' matches no parameter or module of the model; fix the pattern or the model");
  };
  for (const auto& m : modalities) {
    for (const auto& p : m.parameter_patterns) require(p, "modality '" + m.field + "'");
  }
  for (const auto& p : checkpoint.training_only) require(p, "checkpoint.training_only");
  for (const auto& s : shared_state) {
    require(s.producer, "shared_state '" + s.key + "' producer");
    for (const auto& c : s.consumers) require(c, "shared_state '" + s.key + "' consumer");
  }
  for (const auto& [a, b] : checkpoint.tied) {
    require(a, "checkpoint.tied");
    require(b, "checkpoint.tied");
  }
  for (const auto& p : frozen) require(p, "frozen");
  for (const auto& p : unused_parameters) require(p, "unused_parameters");
  for (const auto& p : activation_watch) require(p, "activation_watch");
  for (const auto& [module, index] : golden.layers) {
    MIH_CHECK(std::find(fqns.begin(), fqns.end(), module) != fqns.end(), where, ": golden.layers names module '", module,
              "', which the model does not have; map the module whose output is hidden state ", index);
  }
  MIH_CHECK(golden.logits.empty() || std::find(fqns.begin(), fqns.end(), golden.logits) != fqns.end(), where,
            ": golden.logits names module '", golden.logits, "', which the model does not have");
  // A frozen parameter gets no gradient: a modality that must train it can never hold.
  for (const auto& m : modalities) {
    for (const auto& mp : m.parameter_patterns) {
      for (const auto& f : frozen) {
        for (const auto& fqn : fqns) {
          MIH_CHECK(!(::fnmatch(mp.c_str(), fqn.c_str(), 0) == 0 && ::fnmatch(f.c_str(), fqn.c_str(), 0) == 0), where,
                    ": modality '", m.field, "' pattern '", mp, "' and frozen pattern '", f, "' both name '", fqn,
                    "': a frozen parameter gets no gradient; narrow the modality to the parameters it trains");
        }
      }
    }
  }
}

nlohmann::json ModelSpec::to_json() const {
  nlohmann::json fields = nlohmann::json::array();
  for (const auto& f : data.fields) {
    fields.push_back({{"name", f.name}, {"forward", f.forward}, {"loss", f.loss},
                      {"cp", f.cp == CpSharding::kSequence ? "sequence" : "replicated"}});
  }
  nlohmann::json shared = nlohmann::json::array();
  for (const auto& s : shared_state) {
    shared.push_back({{"key", s.key}, {"producer", s.producer}, {"consumers", s.consumers}});
    if (!s.requires_field.empty()) shared.back()["requires_field"] = s.requires_field;
  }
  nlohmann::json modal = nlohmann::json::array();
  for (const auto& m : modalities) modal.push_back({{"field", m.field}, {"parameters", m.parameter_patterns}});
  nlohmann::json inv = nlohmann::json::array();
  for (const auto& i : invariants) inv.push_back({{"name", i.name}, {"phase", phase_name(i.phase)}});
  nlohmann::json parity = nlohmann::json::array();
  for (const auto& c : parity_cases) parity.push_back(c.to_json());
  nlohmann::json tolerances_json = {{"same_topology", tolerances.same_topology},
                                    {"cross_topology", tolerances.cross_topology},
                                    {"noise_k", tolerances.noise_k},
                                    {"noise_k_update", tolerances.noise_k_update},
                                    {"noise_floor_eps", tolerances.noise_floor_eps},
                                    {"noise_oracle_factor", tolerances.noise_oracle_factor}};
  if (!tolerances.grad_accumulation.empty()) tolerances_json["grad_accumulation"] = tolerances.grad_accumulation;
  if (!tolerances.grad_accumulation_reason.empty()) {
    tolerances_json["grad_accumulation_reason"] = tolerances.grad_accumulation_reason;
  }
  return {{"name", name},
          {"description", description},
          {"tp_divides", tp_divides},
          {"num_key_value_heads", num_key_value_heads},
          {"seq_len", seq_len},
          {"data", {{"pipeline", data.pipeline}, {"labels_are_shifted", data.labels_are_shifted},
                    {"causal_lm", data.causal_lm}, {"rows_from_documents", data.rows_from_documents},
                    {"runtime_fields", data.runtime_fields},
                    {"fields", fields}}},
          {"checkpoint",
           {{"key_map", KeyMap(checkpoint.key_map).to_json()},
            {"training_only", checkpoint.training_only},
            {"inference_only", checkpoint.inference_only},
            {"tied", checkpoint.tied},
            {"source", checkpoint.source},
            {"init_from", checkpoint.init_from}}},
          {"trainer",
           {{"optimizer", optimizer_kind_name(trainer.optimizer())},
            {"lr", trainer.lr()},
            {"momentum", trainer.momentum()},
            {"warmup_steps", trainer.warmup_steps()},
            {"decay_steps", trainer.decay_steps()},
            {"min_lr", trainer.min_lr()},
            {"beta1", trainer.beta1()},
            {"beta2", trainer.beta2()},
            {"eps", trainer.eps()},
            {"weight_decay", trainer.weight_decay()},
            {"max_grad_norm", trainer.max_grad_norm()},
            {"no_weight_decay", trainer.no_weight_decay()}}},
          {"decayed_1d", decayed_1d},
          {"frozen", frozen},
          {"unused_parameters", unused_parameters},
          {"activation_watch", activation_watch},
          {"golden", {{"layers", golden.layers}, {"logits", golden.logits}}},
          {"shared_state", shared},
          {"modalities", modal},
          {"invariants", inv},
          {"module_parity_cases", parity},
          {"tolerances", tolerances_json}};
}

ModelSpec initialized_from(ModelSpec spec, const std::string& dir) {
  spec.checkpoint.init_from = dir;
  if (!dir.empty()) spec.checkpoint.source = dir;
  return spec;
}

SpecRegistry& SpecRegistry::instance() {
  static SpecRegistry registry;
  return registry;
}

void SpecRegistry::add(std::function<ModelSpec()> make) {
  const std::string name = make().name;
  MIH_CHECK(makers_.emplace(name, std::move(make)).second, "spec '", name, "' is registered twice");
}

ModelSpec SpecRegistry::get(const std::string& name) const {
  auto it = makers_.find(name);
  if (it == makers_.end()) {
    std::string known = join(names(), ", ");
    MIH_THROW(Code::kInvalidSpec, "unknown spec '", name, "'; registered: ", known.empty() ? "(none linked)" : known);
  }
  return it->second();
}

std::vector<std::string> SpecRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [n, make] : makers_) out.push_back(n);
  return out;
}

}  // namespace mih::spec
