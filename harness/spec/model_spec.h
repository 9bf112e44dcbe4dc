// What a model author declares about a port (DESIGN.md section 5): the data contract, the
// checkpoint mapping, shared state between layers, which parameters each modality must train,
// state invariants by phase, module parity cases, and tolerances. A spec is plain data plus
// callables; validate() rejects a malformed one before any rank starts, naming the spec and
// the field, and to_json() is its evidence form.
//
// How to add one (`mih scaffold --name my_port --out DIR` writes a complete project whose
// spec.cpp fills every part below, commented; tests/external_project/tiny_spec.cpp is a
// smaller one; specs/*.cpp, installed under <prefix>/share/mih/examples, are the reference
// ports'): a function returning the spec, registered in its own namespace, and its suites at
// global scope, in a file of an OBJECT library or of the conformance binary itself:
//
//   mih::spec::ModelSpec my_port_spec() {
//     mih::spec::ModelSpec s;
//     s.name = "my_port";
//     s.factory = [](mih::ParallelContext& ctx) { return std::make_shared<MyModel>(ctx); };
//     s.tp_divides = {kHeads, kFfn};      // what tp must divide (the matrix rejects the rest)
//     s.seq_len = 16;                     // what cp must split
//     s.data.make_batches = [] { return my_batches(); };  // global batch of step k
//     s.data.labels_are_shifted = true;
//     s.checkpoint.key_map = {{R"((.+))", {"model.$1"}}};  // internal FQN -> external key
//     s.invariants = {my_invariant()};    // optional: shared state, modalities, parity cases
//     return s;
//   }
//   MIH_REGISTER_SPEC(my_port_spec);
//   MIH_CONFORMANCE_SUITES(MyPort, "my_port", "cpu-smoke");  // suites/conformance.h
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/checkpoint/key_map.h"
#include "harness/spec/module_parity.h"
#include "harness/training/trainer.h"

namespace mih::spec {

/// How a batch field is split under context parallelism (every field is split on the batch
/// dim over data-parallel ranks).
enum class CpSharding { kSequence, kReplicated };

struct FieldSpec {
  std::string name;
  /// The model reads it in forward (so it must be present at the first micro-batch).
  bool forward = true;
  /// The loss reads it (labels, loss_mask).
  bool loss = false;
  CpSharding cp = CpSharding::kSequence;
};

/// The data contract.
struct DataSpec {
  /// Description of the pipeline (for evidence).
  std::string pipeline;
  /// Global batches; the same for step k whatever the parallel config.
  std::function<BatchSource()> make_batches;
  /// The loader the Trainer's steps draw from, whose state its checkpoints save (a
  /// data::EpochLoader over the same pipeline: its batches are make_batches' in a run that never
  /// resumes). Null: a data::StepLoader over make_batches.
  std::function<std::unique_ptr<data::DataLoader>()> make_loader;
  /// labels[:, t] is the target of input_ids[:, t] (shifted once, by the pipeline).
  bool labels_are_shifted = true;
  /// Causal language-model data: the data contract checks that labels are the next input
  /// token (labels_are_shifted) or the same token (not shifted) on every valid position.
  bool causal_lm = true;
  /// The pipeline cuts its rows out of documents and attaches how (Batch::provenance; every
  /// TextPipeline batch does): the PipelineOutputs suite recomputes input_ids, labels,
  /// position_ids, loss_mask and attention_mask of step 0's batch from the documents' raw bytes
  /// (checks::check_batch_documents). Default false (a synthetic pipeline has no documents).
  bool rows_from_documents = false;
  /// Fields the runtime fills rather than the pipeline (e.g. position_ids when the
  /// Trainer computes them); a pipeline that also produces one gives it two owners.
  std::vector<std::string> runtime_fields;
  /// input_ids, labels and position_ids are implicit; list every other field.
  std::vector<FieldSpec> fields;
  /// The Trainer's sequence_fields / cp_replicated_fields for these fields.
  TrainerOptions apply_sharding(TrainerOptions options) const;
};

/// The Hugging Face config.json of the port's architecture: what `mih export` writes and what
/// `mih inspect` compares with a checkpoint directory's config.json, field by field.
struct HfConfig {
  /// e.g. "llama", "mixtral", "llava".
  std::string model_type;
  /// e.g. {"LlamaForCausalLM"}.
  std::vector<std::string> architectures;
  /// The fields a loader of that architecture reads, by Hugging Face's names, from the port's
  /// options (hidden_size, num_attention_heads, rms_norm_eps, ...; nested objects such as
  /// LLaVA's text_config and vision_config as they are). Without model_type and
  /// architectures, which are added from the members above.
  nlohmann::json fields = nlohmann::json::object();
  /// config.json fields inspect does not compare (glob patterns on the dotted path, e.g.
  /// "transformers_version", "torch_dtype").
  std::vector<std::string> ignored = {"transformers_version", "torch_dtype", "_name_or_path"};
  bool declared() const { return !model_type.empty(); }
};

struct CheckpointSpec {
  /// Internal FQN -> external keys, with the layout transforms (key_map.h: split along a dim,
  /// transpose, fused heads interleaved).
  std::vector<KeyRule> key_map;
  /// The architecture's Hugging Face config (export, inspect); undeclared: the spec cannot be
  /// exported as a Hugging Face checkpoint and inspect compares no config.
  HfConfig hf;
  /// Internal parameters with no external counterpart (glob patterns, fnmatch).
  std::vector<std::string> training_only;
  /// External keys the model does not load (e.g. rotary inv_freq in some exports).
  std::vector<std::string> inference_only;
  /// Pairs of internal FQNs that must be one parameter when tied.
  std::vector<std::pair<std::string, std::string>> tied;
  /// A source checkpoint in Hugging Face layout whose keys the key map must cover: a
  /// directory with model.safetensors.index.json (its weight_map's keys; the shards are not
  /// opened) or *.safetensors files (their headers). Empty: none (the SourceCheckpoint suite
  /// is not instantiated).
  std::string source;
  /// A local Hugging Face checkpoint directory every case of the spec, its reference
  /// included, initializes the port from (cases::load_hf_weights through key_map, after the
  /// build, before step 0) instead of the seed's initialization. The run checks it before any
  /// rank starts (keys, shapes, readable dtypes), its files' SHA-256 join every case's
  /// fingerprint, and it is then also the source checkpoint (initialized_from). `mih test
  /// --init-from DIR` and `mih run --init-from DIR` override it. Empty: the seed's weights.
  std::string init_from;
};

/// Goldens of the original model (docs/golden.md): what the MatchesOriginal suite compares the
/// port's reference with at step 0 (the loss, the logits, each mapped layer's output, every
/// parameter's gradient and the parameters after the step), and how the port's modules line up
/// with the golden's hidden states.
struct GoldenSpec {
  /// A golden directory (golden.json and golden.safetensors, written by `mih golden`) of this
  /// spec's export. Empty: no golden, and MatchesOriginal is not instantiated. `mih test
  /// --golden DIR` overrides it. Checked before any rank starts: a golden of another
  /// checkpoint, batch or trainer options, or of a format version this mih does not read, is
  /// bad input (exit 11).
  std::string dir;
  /// The layer map: a module the port observes (ParallelContext::observe) -> the index of the
  /// golden hidden state its forward output is, by Hugging Face's output_hidden_states count
  /// (0 the embeddings, i the output of decoder layer i - 1) with L + 1 the final norm's
  /// output (L decoder layers; Hugging Face's tuple holds it at L, in place of the last
  /// layer's). E.g. {{"embed_tokens", 0}, {"layers.0", 1}, {"layers.1", 2}, {"norm", 3}}.
  std::vector<std::pair<std::string, int64_t>> layers;
  /// The module whose forward output is the logits [B, S, V] ("lm_head"); empty: the logits
  /// are not compared.
  std::string logits;
};

/// State one layer publishes in forward and others consume (a rotary table, vision features,
/// routing statistics): `key`, the FQN glob of its producer and of its consumers.
struct SharedStateSpec {
  std::string key;
  std::string producer;
  std::vector<std::string> consumers;
  /// A data field the state depends on (a modality: "pixel_values" for vision features): in
  /// a step none of whose micro-batches holds it (a text-only batch of mixed instruction
  /// data) the key need not be published nor consumed. Empty: every step must publish and
  /// consume it. The rules of a step that holds the field, and of any publication, are the same.
  std::string requires_field = {};
};

/// A modality field and the parameters that must receive finite, non-zero gradients when it
/// reaches the model.
struct ModalitySpec {
  std::string field;
  std::vector<std::string> parameter_patterns;
};

enum class Phase { kStructure, kMaterialization, kCheckpoint, kRuntime };
std::string phase_name(Phase phase);
/// Throws: mih::Error{kInvalidSpec} for another name, listing the valid ones.
Phase parse_phase(const std::string& name);

/// The outcome of an invariant: pass, and the facts that show it.
struct CheckResult {
  bool passed = false;
  nlohmann::json facts;
};

/// A named predicate over the built model (and the state at its phase). The session runs
/// structure and materialization invariants once the model and optimizer are built,
/// checkpoint invariants after every checkpoint load, runtime invariants after every step.
/// It runs on every rank; a collective inside it must be called on every rank.
struct StateInvariant {
  std::string name;
  Phase phase = Phase::kStructure;
  std::function<CheckResult(const TrainingState&)> check;
};

/// Relative tolerances of parity against the reference run, by dtype name and profile.
struct Tolerances {
  std::map<std::string, double> same_topology = {{"float64", 1e-10}, {"float32", 1e-4}, {"bfloat16", 2e-2}};
  std::map<std::string, double> cross_topology = {{"float64", 1e-10}, {"float32", 1e-3}, {"bfloat16", 5e-2}};
  /// Gradient-accumulation cases (micro_batches > 1) of a model whose loss is not linear in
  /// the micro-batches (e.g. an MoE load-balancing loss over each micro-batch's routing):
  /// why, and their tolerance by dtype. A reason without a tolerance declares them not
  /// comparable with the reference: NumericParity skips them, naming the reason. Neither:
  /// such cases use cross_topology.
  std::map<std::string, double> grad_accumulation;
  std::string grad_accumulation_reason;
  /// Reduced-precision lanes (a matrix whose dtype is not float64; DESIGN.md section 7): a
  /// case is compared with the lane's world-size-1 reference, each quantity at
  ///   max(noise_k x noise, noise_floor_eps x epsilon of the dtype)
  /// (noise_k_update for a parameter after an update), where noise is measured between that
  /// reference and its noise twin (compare.h Calibration); the lane's reference and twin are
  /// compared with the float64 Reference at noise_oracle_factor times that. The defaults'
  /// reasoning and measurements: docs/precision.md.
  double noise_k = 20;
  double noise_k_update = 50;
  double noise_floor_eps = 4;
  double noise_oracle_factor = 8;
};

struct ModelSpec {
  std::string name;
  std::string description;
  ModelFactory factory;
  /// Degrees the model supports: tp must divide each of these (e.g. num_heads, the MLP's
  /// inner size).
  std::vector<int64_t> tp_divides;
  /// The attention's key/value heads (Hugging Face's num_key_value_heads; grouped-query
  /// attention when fewer than the query heads): tp must divide them, or be a multiple of
  /// them where the port replicates each KV head over tp / num_key_value_heads ranks
  /// (ColumnParallelLinearOptions::heads). Recorded in spec.resolved.json as
  /// "num_key_value_heads", where the diagnosis reads it ("tp > num_key_value_heads").
  /// 0: not declared (no rule, nothing recorded).
  int64_t num_key_value_heads = 0;
  /// cp must divide the sequence into 2 * cp chunks (zigzag) of this sequence length.
  int64_t seq_len = 0;
  /// Routed experts per MoE layer (ParamSpec::experts of its stacked expert weights): ep must
  /// divide it. 0: a dense model, for which the matrix rejects ep > 1 (nothing to shard).
  int64_t num_experts = 0;
  /// The decoder layers the port splits into pipeline stages (ParallelContext::
  /// pipeline_stages; each stage builds its own, ParallelModel::stage_forward runs them): pp x
  /// vpp must divide it. 0: the port builds no stages, for which the matrix rejects pp > 1 and
  /// vpp > 1.
  int64_t pipeline_layers = 0;
  DataSpec data;
  CheckpointSpec checkpoint;
  std::vector<SharedStateSpec> shared_state;
  std::vector<ModalitySpec> modalities;
  std::vector<StateInvariant> invariants;
  /// Candidate modules against independent implementations, forward and backward
  /// (module_parity.h); run with the reference case into check/module_parity.json.
  std::vector<ModuleParityCase> parity_cases;
  Tolerances tolerances;
  /// The Trainer's optimizer and clipping for this port (lr, betas, weight decay and the
  /// no-weight-decay patterns, max_grad_norm); the runner adds the field sharding and the
  /// device. The OptimizerLayout suite checks the groups against these.
  TrainerOptions trainer;
  /// 1-D parameters (norm scales, biases) the port decays on purpose (FQN globs); any other
  /// 1-D parameter with weight decay is a finding (MIH-OPTIM-007).
  std::vector<std::string> decayed_1d;
  /// Trainable parameters the port may leave without a gradient for a whole run (FQN globs,
  /// e.g. an embedding row block only some data reaches): any other trainable parameter that
  /// no rank's backward gives a gradient at any step of a case is a finding (MIH-GRAD-004: it
  /// is registered, optimized and saved, and never learns). A step without a gradient is no
  /// finding (a vision tower on a text-only batch): the optimizer must leave the parameter as
  /// it is then (MIH-OPTIM-008), as PyTorch's optimizers skip a grad of None.
  std::vector<std::string> unused_parameters;
  /// Parameters the port does not train (FQN globs, e.g. "vision_tower.*" for a frozen vision
  /// encoder): the runner passes them to the Trainer (TrainerOptions::frozen). On every rank,
  /// after sharding, each must have requires_grad false, no gradient after backward and no
  /// optimizer state; a parameter with requires_grad false that no pattern names is a finding
  /// too (MIH-FROZEN-*). A modality must not declare a frozen parameter.
  std::vector<std::string> frozen;
  /// Goldens of the original model and the layer map to them (MatchesOriginal).
  GoldenSpec golden;
  /// The modules whose forward output and output gradient the activation probes record at
  /// the first two steps and the last (FQN globs of modules the model declares with
  /// ParallelContext::observe). Empty: every module the model observes.
  std::vector<std::string> activation_watch;

  /// Throws: mih::Error{kInvalidSpec} naming the spec and the field: an empty name or
  ///   factory, no batches, a duplicate or implicit field name, a modality field not among the
  ///   fields, a modality or training-only pattern that is empty, a shared-state key declared
  ///   twice or without producer or consumer, duplicate invariant or parity case names, an
  ///   invariant without a check, a malformed parity case (ModuleParityCase::validate), an
  ///   empty frozen or unused_parameters pattern, a shared-state requires_field that is not a
  ///   data field, a golden layer map with an empty module, a negative index or a module named
  ///   twice.
  void validate() const;
  /// Throws: as validate, plus every FQN glob (modality, training-only, shared-state
  ///   producer/consumer, tied, frozen, unused_parameters, activation_watch) that matches none of `fqns` (a module's parameter and module
  ///   names), naming the pattern; a golden layer-map or logits module that is not a module name.
  void validate_against(const std::vector<std::string>& fqns) const;
  nlohmann::json to_json() const;
};

/// `spec` as a case initialized from checkpoint directory `dir` sees it: checkpoint.init_from
/// is `dir`, and `dir` is also checkpoint.source (the keys the port loads are that
/// directory's, so the SourceCheckpoint suite checks the key map against them). An empty
/// `dir`: init_from cleared, source left as the spec declares it (a case from the seed).
ModelSpec initialized_from(ModelSpec spec, const std::string& dir);

/// Specs register themselves by name (specs/*.cpp, an OBJECT library).
class SpecRegistry {
 public:
  static SpecRegistry& instance();
  /// Throws: mih::Error{kInvalidSpec} for a duplicate name.
  void add(std::function<ModelSpec()> make);
  /// Throws: mih::Error{kInvalidSpec} for an unknown name, listing the registered ones.
  ModelSpec get(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  std::map<std::string, std::function<ModelSpec()>> makers_;
};

/// Registers a spec from a static initializer: MIH_REGISTER_SPEC(llama_spec) with
/// `ModelSpec llama_spec();`.
#define MIH_REGISTER_SPEC(fn) \
  static const bool mih_spec_registered_##fn = (::mih::spec::SpecRegistry::instance().add(fn), true)

}  // namespace mih::spec
