// inspect_hf and the weights of --init-from (see hf_interop.h); export_hf is hf_export.cpp.
#include "harness/cases/hf_interop.h"
#include "harness/cases/hf_interop_internal.h"

#include <fnmatch.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/base/sha256.h"
#include "harness/checkpoint/distributed_checkpoint.h"
#include "harness/checkpoint/key_map.h"
#include "harness/compat/store.h"
#include "harness/parallel/parallel_context.h"
#include "harness/parallel/placement.h"
#include "harness/evidence/evidence_store.h"
#include "harness/runtime/dtypes.h"
#include "harness/training/trainer.h"

namespace mih::cases {
namespace fs = std::filesystem;

bool matches_any(const std::vector<std::string>& globs, const std::string& name) {
  for (const auto& g : globs) {
    if (fnmatch(g.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

void with_one_rank(const spec::ModelSpec& spec, const std::string& dtype, uint64_t seed,
                   const std::function<void(Trainer&)>& body) {
  ParallelConfig config;
  config.dtype = parse_dtype_name(dtype);
  config.seed = seed;
  compat::Store store = compat::make_hash_store(std::chrono::seconds(30));
  MeshOptions mesh_options;
  mesh_options.group.gloo_hostname = "127.0.0.1";
  DeviceMesh mesh(config, store, 0, 1, mesh_options);
  Trainer trainer(mesh, config, spec.factory, spec.data.make_batches(),
                  spec.data.apply_sharding(spec.trainer).frozen(spec.frozen));
  trainer.model().eval();  // no dropout in the reference numbers
  body(trainer);
}

std::map<std::string, ExternalTensor> expected_external(const spec::ModelSpec& spec, const KeyMap& map,
                                                        ParallelContext& context) {
  std::map<std::string, ExternalTensor> out;
  for (const auto& p : context.parameters()) {
    if (matches_any(spec.checkpoint.training_only, p->fqn)) continue;
    for (auto& [key, shape] : map.external_shapes(p->fqn, p->global_shape)) {
      auto [it, fresh] = out.emplace(key, ExternalTensor{p->fqn, shape});
      MIH_CHECK(fresh, "spec '", spec.name, "': the key map sends both '", it->second.fqn, "' and '", p->fqn,
                "' to the external key '", key, "'; each key must come from one parameter");
    }
  }
  return out;
}

nlohmann::json hf_config_json(const spec::HfConfig& hf) {
  nlohmann::json c = hf.fields;
  c["model_type"] = hf.model_type;
  c["architectures"] = hf.architectures;
  return c;
}

namespace {

// Equal JSON values, numbers by value (10000 and 10000.0 agree; 1e-6 relative for floats).
bool same_value(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.is_number() && b.is_number()) {
    // An integer (a size, a count, a token id) must be that integer (2.0 is 2, 2.0000001 is
    // not); two floats agree to 1e-6 relative (the printing of 1e-06 or 0.000001).
    if (a.is_number_integer() || b.is_number_integer()) {
      if (a.is_number_integer() && b.is_number_integer()) {
        return a.is_number_unsigned() == b.is_number_unsigned() ? a == b : a.get<double>() == b.get<double>();
      }
      const double x = a.get<double>(), y = b.get<double>();
      return x == y && std::floor(x) == x && std::abs(x) < 9007199254740992.0;  // exact below 2^53
    }
    const double x = a.get<double>(), y = b.get<double>();
    return x == y || std::abs(x - y) <= 1e-6 * std::max(std::abs(x), std::abs(y));
  }
  return a == b;
}

// Config fields the port declares against the checkpoint's, by dotted path.
void diff_config(const nlohmann::json& port, const nlohmann::json& checkpoint, const std::string& prefix,
                 const std::vector<std::string>& ignored, nlohmann::json* out) {
  for (const auto& [name, value] : port.items()) {
    const std::string path = prefix.empty() ? name : prefix + "." + name;
    if (matches_any(ignored, path)) continue;
    if (!checkpoint.is_object() || !checkpoint.contains(name)) {
      out->push_back({{"field", path}, {"port", value}, {"checkpoint", nullptr},
                      {"why", "config.json has no '" + path + "'"}});
    } else if (value.is_object() && checkpoint[name].is_object()) {
      diff_config(value, checkpoint[name], path, ignored, out);
    } else if (!same_value(value, checkpoint[name])) {
      out->push_back({{"field", path}, {"port", value}, {"checkpoint", checkpoint[name]},
                      {"why", "the port has " + json_summary(value) + ", config.json " + json_summary(checkpoint[name])}});
    }
  }
}

void unchecked_fields(const nlohmann::json& port, const nlohmann::json& checkpoint, const std::string& prefix,
                      nlohmann::json* out) {
  if (!checkpoint.is_object()) return;
  for (const auto& [name, value] : checkpoint.items()) {
    const std::string path = prefix.empty() ? name : prefix + "." + name;
    if (!port.is_object() || !port.contains(name)) {
      out->push_back(path);
    } else if (value.is_object()) {
      unchecked_fields(port[name], value, path, out);
    }
  }
}

std::string shape_text(const std::vector<int64_t>& s) { return nlohmann::json(s).dump(); }

// The config fields an architecture's forward or loss reads whose value changes the numbers,
// with the default Hugging Face transformers computes with when config.json leaves them out
// (models/<type>/configuration_*.py; golden/builtin_models.py DEFAULTS holds the same).
struct BehaviourField {
  const char* field;
  const char* fallback;  // the default, as JSON
};
const std::map<std::string, std::vector<BehaviourField>>& behaviour_fields() {
  static const std::map<std::string, std::vector<BehaviourField>> table = {
      {"llama",
       {{"rope_theta", "10000.0"}, {"rope_scaling", "null"}, {"rms_norm_eps", "1e-06"}, {"hidden_act", "\"silu\""},
        {"attention_bias", "false"}, {"mlp_bias", "false"}, {"tie_word_embeddings", "false"},
        {"attention_dropout", "0.0"}, {"pretraining_tp", "1"}}},
      {"mixtral",
       {{"rope_theta", "1000000.0"}, {"rope_scaling", "null"}, {"rms_norm_eps", "1e-05"}, {"hidden_act", "\"silu\""},
        {"tie_word_embeddings", "false"}, {"attention_dropout", "0.0"}, {"sliding_window", "null"},
        {"num_experts_per_tok", "2"}, {"router_aux_loss_coef", "0.001"}, {"output_router_logits", "false"},
        {"router_jitter_noise", "0.0"}}},
      {"qwen2_moe",
       {{"rope_theta", "10000.0"}, {"rope_scaling", "null"}, {"rms_norm_eps", "1e-06"}, {"hidden_act", "\"silu\""},
        {"tie_word_embeddings", "false"}, {"attention_dropout", "0.0"}, {"use_sliding_window", "false"},
        {"qkv_bias", "true"}, {"num_experts_per_tok", "4"}, {"norm_topk_prob", "false"},
        {"shared_expert_intermediate_size", "5632"}, {"decoder_sparse_step", "1"}, {"mlp_only_layers", "[]"},
        {"router_aux_loss_coef", "0.001"}, {"output_router_logits", "false"}}},
      {"qwen3",
       {{"rope_theta", "10000.0"}, {"rope_scaling", "null"}, {"rms_norm_eps", "1e-06"}, {"hidden_act", "\"silu\""},
        {"attention_bias", "false"}, {"tie_word_embeddings", "false"}, {"attention_dropout", "0.0"},
        {"use_sliding_window", "false"}, {"head_dim", "128"}}},
      {"qwen3_moe",
       {{"rope_theta", "10000.0"}, {"rope_scaling", "null"}, {"rms_norm_eps", "1e-06"}, {"hidden_act", "\"silu\""},
        {"attention_bias", "false"}, {"tie_word_embeddings", "false"}, {"attention_dropout", "0.0"},
        {"use_sliding_window", "false"}, {"num_experts_per_tok", "8"}, {"norm_topk_prob", "false"},
        {"decoder_sparse_step", "1"}, {"mlp_only_layers", "[]"}, {"router_aux_loss_coef", "0.001"},
        {"output_router_logits", "false"}}},
      {"gpt2",
       {{"activation_function", "\"gelu_new\""}, {"layer_norm_epsilon", "1e-05"}, {"scale_attn_weights", "true"},
        {"scale_attn_by_inverse_layer_idx", "false"}, {"reorder_and_upcast_attn", "false"}, {"resid_pdrop", "0.1"},
        {"embd_pdrop", "0.1"}, {"attn_pdrop", "0.1"}, {"tie_word_embeddings", "true"}, {"n_inner", "null"}}},
  };
  return table;
}

// Warnings for the behaviour fields the declared config leaves out (nested configs with a
// model_type of their own, like LLaVA's text_config, by dotted path).
void undeclared_behaviour(const nlohmann::json& declared, const std::string& model_type, const std::string& prefix,
                          nlohmann::json* out) {
  const auto it = behaviour_fields().find(model_type);
  if (it != behaviour_fields().end()) {
    for (const auto& f : it->second) {
      if (declared.contains(f.field)) continue;
      const std::string path = prefix + f.field;
      out->push_back({{"field", path},
                      {"model_type", model_type},
                      {"default", nlohmann::json::parse(f.fallback)},
                      {"why", "the spec's config declares no '" + path + "': the original (" + model_type +
                                  ") computes with its default " + std::string(f.fallback) +
                                  ", whatever the port does; declare the value the port computes with in "
                                  "CheckpointSpec::hf.fields (a golden of the export then checks it, docs/golden.md)"}});
    }
  }
  for (const auto& [name, value] : declared.items()) {
    if (value.is_object() && value.contains("model_type") && value["model_type"].is_string()) {
      undeclared_behaviour(value, value["model_type"].get<std::string>(), prefix + name + ".", out);
    }
  }
}

at::ScalarType scalar_type_of(const std::string& safetensors_name, const std::string& key) {
  static const std::map<std::string, at::ScalarType> kTypes = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}};
  auto it = kTypes.find(safetensors_name);
  MIH_CHECK(it != kTypes.end(), "checkpoint tensor '", key, "' has dtype ", safetensors_name,
            "; a parameter loads from F64, F32, F16 or BF16");
  return it->second;
}

}  // namespace

std::string checkpoint_digest(const hf::Checkpoint& checkpoint) {
  Sha256 digest;
  for (const auto& file : checkpoint.files) digest.update(file.sha256 + file.path);
  return digest.hex_digest();
}

InitSource check_init_from(const spec::ModelSpec& spec, const fs::path& dir) {
  const hf::Checkpoint checkpoint = hf::read_checkpoint(dir);
  const KeyMap map(spec.checkpoint.key_map);
  std::map<std::string, ExternalTensor> expected;
  with_one_rank(spec, "float32", 0, [&](Trainer& trainer) { expected = expected_external(spec, map, trainer.context()); });
  static const std::set<std::string> kLoadable = {"F64", "F32", "F16", "BF16"};
  std::vector<std::string> problems;
  for (const auto& [key, e] : expected) {
    const hf::TensorEntry* t = checkpoint.find(key);
    if (t == nullptr) {
      problems.push_back("the checkpoint has no '" + key + "' (needed for '" + e.fqn + "')");
      continue;
    }
    if (t->shape != e.shape) {
      std::vector<int64_t> reversed(e.shape.rbegin(), e.shape.rend());
      const bool transposed = e.shape.size() == 2 && t->shape == reversed && e.shape[0] != e.shape[1];
      problems.push_back("'" + key + "' (for '" + e.fqn + "') has shape " + shape_text(t->shape) + ", the port loads " +
                         shape_text(e.shape) +
                         (transposed ? " (likely transposed: a Conv1D [in, out] weight needs `transpose` in its "
                                       "key-map rule)"
                                     : ""));
    }
    if (!kLoadable.count(t->dtype)) {
      problems.push_back("'" + key + "' (for '" + e.fqn + "') has dtype " + t->dtype +
                         "; a parameter loads from F64, F32, F16 or BF16");
    }
  }
  if (!problems.empty()) {
    constexpr size_t kShown = 8;
    std::string listed;
    for (size_t i = 0; i < problems.size() && i < kShown; ++i) listed += "\n  " + problems[i];
    if (problems.size() > kShown) listed += "\n  and " + std::to_string(problems.size() - kShown) + " more";
    MIH_THROW(Code::kInvalidSpec, "init from ", dir.string(), ": the checkpoint does not fit the port of spec '",
              spec.name, "' (", problems.size(), " problem(s), nothing was run):", listed, "\n`mih inspect --spec ",
              spec.name, " --hf-dir ", dir.string(), "` lists every difference");
  }
  return {fs::absolute(dir).lexically_normal(), checkpoint_digest(checkpoint)};
}

size_t load_hf_weights(const spec::ModelSpec& spec, const fs::path& dir, ParallelContext& ctx,
                       const std::string& expected_sha256) {
  const hf::Checkpoint checkpoint = hf::read_checkpoint(dir);
  if (!expected_sha256.empty()) {
    const std::string now = checkpoint_digest(checkpoint);
    MIH_CHECK_CODE(now == expected_sha256, Code::kFailedPrecondition, "init from ", dir.string(),
                   ": the checkpoint's files changed after the run checked them (SHA-256 ",
                   expected_sha256.substr(0, 16), "... then, ", now.substr(0, 16),
                   "... now); leave the directory as it is while cases run from it, and rerun");
  }
  const KeyMap map(spec.checkpoint.key_map);
  // Each shard is opened where read_checkpoint resolved it inside the directory.
  std::map<std::string, fs::path> resolved;
  for (const auto& f : checkpoint.files) resolved[f.path] = f.resolved;
  std::map<std::string, safetensors::Reader> readers;
  std::vector<std::pair<std::shared_ptr<ShardedParameter>, at::Tensor>> staged;
  for (const auto& p : ctx.parameters()) {
    if (matches_any(spec.checkpoint.training_only, p->fqn)) continue;
    std::map<std::string, at::Tensor> external;
    for (const std::string& key : map.external_keys(p->fqn)) {
      const hf::TensorEntry* e = checkpoint.find(key);
      MIH_CHECK(e != nullptr, "init from ", dir.string(), ": the checkpoint has no '", key, "' (needed for '", p->fqn,
                "'); `mih inspect --spec ", spec.name, " --hf-dir ", dir.string(), "` lists every difference");
      auto reader = readers.find(e->file);
      if (reader == readers.end()) {
        MIH_INTERNAL_ASSERT(resolved.count(e->file), "the shard ", e->file, " of '", key, "' is not in the inventory");
        reader = readers.emplace(e->file, safetensors::Reader(resolved.at(e->file))).first;
      }
      at::Tensor t = at::empty(e->shape, at::TensorOptions().dtype(scalar_type_of(e->dtype, key)));
      reader->second.read(key, t.data_ptr());
      external[key] = t;
    }
    at::Tensor full = map.from_external(p->fqn, external);
    if (full.sizes().vec() != p->global_shape) {
      std::vector<int64_t> reversed(p->global_shape.rbegin(), p->global_shape.rend());
      MIH_THROW(Code::kInvalidSpec, "init from ", dir.string(), ": '", p->fqn, "' rebuilt from ",
                map.external_keys(p->fqn).front(), " has shape ", shape_text(full.sizes().vec()), ", the port's is ",
                shape_text(p->global_shape),
                full.dim() == 2 && full.sizes().vec() == reversed ? " (likely transposed: a Conv1D [in, out] weight "
                                                                    "needs `transpose` in its key-map rule)"
                                                                  : "");
    }
    staged.emplace_back(p, full.to(p->local.scalar_type()));
  }
  at::NoGradGuard no_grad;
  for (auto& [p, full] : staged) {
    for (const Box& box : ctx.local_boxes(*p)) {
      at::Tensor dst = p->local, src = full;
      for (size_t d = 0; d < box.lengths.size(); ++d) {
        dst = dst.narrow(static_cast<int64_t>(d), box.local_offset[d], box.lengths[d]);
        src = src.narrow(static_cast<int64_t>(d), box.global_offset[d], box.lengths[d]);
      }
      dst.copy_(src);
    }
  }
  return staged.size();
}

HfInspectResult inspect_hf(const spec::ModelSpec& spec, const HfInspectOptions& options) {
  const hf::Checkpoint checkpoint = hf::read_checkpoint(options.checkpoint);
  const KeyMap map(spec.checkpoint.key_map);
  const std::string dtype = safetensors_dtype(scalar_type(parse_dtype_name(options.dtype)));
  std::map<std::string, ExternalTensor> expected;
  with_one_rank(spec, options.dtype, 0, [&](Trainer& trainer) {
    expected = expected_external(spec, map, trainer.context());
  });

  nlohmann::json missing = nlohmann::json::array(), unexpected = nlohmann::json::array(),
                 shapes = nlohmann::json::array(), dtypes = nlohmann::json::array(),
                 config = nlohmann::json::array(), unchecked = nlohmann::json::array();
  size_t matched = 0;
  for (const auto& [key, e] : expected) {
    const hf::TensorEntry* t = checkpoint.find(key);
    if (t == nullptr) {
      missing.push_back({{"key", key}, {"fqn", e.fqn}, {"shape", e.shape}});
      continue;
    }
    bool same = true;
    if (t->shape != e.shape) {
      same = false;
      std::vector<int64_t> reversed(e.shape.rbegin(), e.shape.rend());
      const bool transposed = e.shape.size() == 2 && t->shape == reversed && e.shape[0] != e.shape[1];
      std::string why = "the port loads " + shape_text(e.shape) + ", the checkpoint holds " + shape_text(t->shape);
      if (transposed) why += ": likely transposed (a Conv1D [in, out] weight needs `transpose` in its key-map rule)";
      shapes.push_back({{"key", key}, {"fqn", e.fqn}, {"port", e.shape}, {"checkpoint", t->shape},
                        {"likely_transposed", transposed}, {"why", why}});
    }
    if (t->dtype != dtype) {
      same = false;
      dtypes.push_back({{"key", key}, {"fqn", e.fqn}, {"port", dtype}, {"checkpoint", t->dtype},
                        {"why", "the port loads " + dtype + " (--dtype " + options.dtype + "), the checkpoint holds " +
                                    t->dtype}});
    }
    if (same) ++matched;
  }
  for (const auto& t : checkpoint.tensors) {
    if (expected.count(t.key) || matches_any(spec.checkpoint.inference_only, t.key)) continue;
    unexpected.push_back({{"key", t.key}, {"shape", t.shape}, {"dtype", t.dtype}, {"file", t.file}});
  }
  nlohmann::json port_config = nlohmann::json::object();
  nlohmann::json warnings = nlohmann::json::array();
  if (spec.checkpoint.hf.declared()) {
    port_config = hf_config_json(spec.checkpoint.hf);
    diff_config(port_config, checkpoint.config, "", spec.checkpoint.hf.ignored, &config);
    unchecked_fields(port_config, checkpoint.config, "", &unchecked);
    undeclared_behaviour(spec.checkpoint.hf.fields, spec.checkpoint.hf.model_type, "", &warnings);
  }
  HfInspectResult result;
  result.matched = matched;
  result.differences = missing.size() + unexpected.size() + shapes.size() + dtypes.size() + config.size();
  result.diff = {{"spec", spec.name},
                 {"checkpoint", fs::absolute(options.checkpoint).string()},
                 {"differences", result.differences},
                 {"matched_tensors", matched},
                 {"expected_tensors", expected.size()},
                 {"checkpoint_tensors", checkpoint.tensors.size()},
                 {"missing_keys", std::move(missing)},  // moved: a checkpoint may hold 65,536 unexpected keys
                 {"unexpected_keys", std::move(unexpected)},
                 {"shape_mismatches", std::move(shapes)},
                 {"dtype_differences", std::move(dtypes)},
                 {"config_differences", std::move(config)},
                 {"config_fields_not_compared", std::move(unchecked)},
                 {"config_warnings", std::move(warnings)},
                 {"config_compared", spec.checkpoint.hf.declared()}};

  // Each inspect's verdict stands alone: an earlier inspect's inventory and state in --out
  // (another spec or checkpoint, or one since fixed) are removed first.
  {
    std::error_code ec;
    fs::remove_all(options.out / layout::kInventoryDir, ec);
    fs::remove(options.out / layout::kIntegrationState, ec);
  }
  EvidenceDir out(options.out);
  nlohmann::json candidate_tensors = nlohmann::json::object();
  for (const auto& [key, e] : expected) candidate_tensors[key] = {{"fqn", e.fqn}, {"shape", e.shape}, {"dtype", dtype}};
  out.write_json(layout::kInventoryCandidate, {{"spec", spec.name},
                                              {"description", spec.description},
                                              {"dtype", options.dtype},
                                              {"config", port_config},
                                              {"key_map", map.to_json()},
                                              {"tensors", candidate_tensors}});
  out.write_json(layout::kInventoryReference, checkpoint.to_json());
  out.write_json(layout::kStructureDiff, result.diff);
  std::string sums;
  for (const auto& f : checkpoint.files) sums += f.sha256 + "  " + f.path + "\n";
  out.write_text(layout::kInventoryFingerprints, sums);
  if (result.differences == 0) {
    IntegrationStateMachine(out).advance_if_before(
        IntegrationState::kDiscovered,
        {layout::kInventoryCandidate, layout::kInventoryReference, layout::kStructureDiff,
         layout::kInventoryFingerprints});
  }
  return result;
}

}  // namespace mih::cases
