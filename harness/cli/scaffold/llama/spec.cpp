// The validation spec of my_port (model.h): what mih checks about the port, one part of
// ModelSpec (harness/spec/model_spec.h) after another, each commented; edit each to your
// model. The spec is registered by name ("my_port"), and the last line instantiates every
// conformance suite on every case of the cpu-smoke matrix (`<binary> --matrix` overrides it).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include "harness/spec/model_spec.h"
#include "model.h"
#include "suites/conformance.h"

// The golden of the original model CMakeLists.txt makes (empty: none).
#ifndef MIH_GOLDEN_DIR
#define MIH_GOLDEN_DIR ""
#endif

namespace my_port {
namespace {

// The global batch: 8 sequences of 16 tokens. Every split of it (over dp ranks, micro-batches,
// pipeline micro-batches and the cp sequence chunks) must give the numbers of one rank.
constexpr int64_t kRows = 8, kSeq = 16;

// Data: the global batch of step k, the same whatever the parallel config. Synthetic tokens
// from a generator seeded by the step; labels are the next token (shifted here, once), a
// row-dependent number of leading positions ignored (-100), so data-parallel ranks hold
// different numbers of targets. Replace it with your pipeline (harness/data has a byte-level
// text pipeline over a corpus directory); it must be a pure function of the step.
mih::BatchSource synthetic_batches(int64_t vocab) {
  return [vocab](int64_t step) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1234 + static_cast<uint64_t>(step));
    const at::Tensor tokens = at::randint(vocab, {kRows, kSeq + 1}, gen, at::kLong);
    mih::Batch b;
    b.input_ids = tokens.narrow(1, 0, kSeq).contiguous();
    b.labels = tokens.narrow(1, 1, kSeq).contiguous();
    for (int64_t r = 0; r < kRows; ++r) {
      const int64_t masked = (r * 3 + step) % (kSeq / 2);
      if (masked > 0) b.labels[r].narrow(0, 0, masked).fill_(-100);
    }
    return b;  // position_ids left out: the Trainer fills 0..S-1
  };
}

// A structure invariant, and again after a checkpoint load: the rotary table's inv_freq[i] =
// 1 / theta^(2i / D) with the config's rope_theta, recomputed here independently. A table built
// with the usual default theta (10000) instead of the config's trains a different model in
// every parallel configuration alike; inv_freq is a non-persistent buffer (not in the
// checkpoint), so a load must rebuild it.
mih::spec::StateInvariant inv_freq_matches_theta(double theta, mih::spec::Phase phase) {
  const std::string name = phase == mih::spec::Phase::kCheckpoint ? "inv_freq_rebuilt_after_load" : "inv_freq_matches_theta";
  return {name, phase, [theta](const mih::TrainingState& t) -> mih::spec::CheckResult {
            for (const auto& b : t.context->buffers()) {
              if (b.fqn != "rotary_emb.inv_freq") continue;
              const int64_t half = b.tensor.numel();
              double err = 0, largest = 0;
              for (int64_t i = 0; i < half; ++i) {
                const double expected = 1.0 / std::pow(theta, static_cast<double>(i) / static_cast<double>(half));
                err = std::max(err, std::abs(b.tensor[i].item<double>() - expected));
                largest = std::max(largest, expected);
              }
              return {err <= 1e-6 * largest && !b.persistent, {{"max_abs_error", err}, {"persistent", b.persistent}}};
            }
            return {false, {{"missing_buffer", "rotary_emb.inv_freq"}}};
          }};
}

// A structure invariant: the head is one parameter with the embedding exactly when the config
// ties them. A tie made by accident (a module reused), or one lost (a copy of the table), would
// pass every parity test while training a different model.
mih::spec::StateInvariant head_tied_as_configured(bool tied) {
  return {"head_tied_as_configured", mih::spec::Phase::kStructure,
          [tied](const mih::TrainingState& t) -> mih::spec::CheckResult {
            bool aliased = false;
            for (const auto& p : t.context->parameters()) {
              if (p->fqn != "embed_tokens.weight") continue;
              aliased = std::find(p->aliases.begin(), p->aliases.end(), "lm_head.weight") != p->aliases.end();
            }
            return {aliased == tied, {{"tie_word_embeddings", tied}, {"aliased", aliased}}};
          }};
}

// A materialization invariant (run once the model is built and sharded, before step 0): the
// rows that pad the vocabulary to a multiple of tp (37 -> 38 at tp=2) are zero in the
// embedding and the head, on this rank's pieces. A padding row that is not zero gives the head
// a logit no token has (a wrong softmax normalizer), only when tp > 1.
mih::spec::StateInvariant vocab_padding_is_zero(int64_t vocab) {
  return {"vocab_padding_rows_are_zero", mih::spec::Phase::kMaterialization,
          [vocab](const mih::TrainingState& t) -> mih::spec::CheckResult {
            int64_t rows = 0;
            double largest = 0;
            for (const auto& p : t.context->parameters()) {
              if (p->fqn != "embed_tokens.weight" && p->fqn != "lm_head.weight") continue;
              // This piece's first row in the padded table (its tp shard, then its FSDP rows).
              const int64_t first = p->local_offset.at(0);
              for (int64_t r = std::max<int64_t>(vocab - first, 0); r < p->local.size(0); ++r, ++rows) {
                largest = std::max(largest, p->local[r].abs().max().item<double>());
              }
            }
            return {largest == 0, {{"padding_rows_checked", rows}, {"largest_abs_value", largest}}};
          }};
}

// A module parity case: the port's attention (with its rotary table) against Llama's attention
// written independently from Hugging Face's LlamaAttention: rotary over halves from the
// config's theta, an explicit loop over query heads, each reading its KV head
// (repeat_kv: query head i uses KV head i / (heads / kv_heads)), the causal mask from a
// lower-triangular matrix. The harness builds the candidate on one rank, gives the reference
// its weights through the adapter below, runs both forward and backward in float64 and compares
// the output, the input's gradient and every parameter's gradient (one left unmapped fails).
mih::spec::ModuleParityCase attention_vs_llama_attention() {
  const Options o;
  const int64_t heads = o.num_attention_heads, group = heads / o.num_key_value_heads, d = o.head_dim(), seq = 6;
  mih::spec::ModuleParityCase c;
  c.name = "attention_vs_llama_attention";
  c.candidate = [o](mih::ParallelContext& ctx) {
    Attention attention(ctx, o);
    mih::RotaryEmbedding rotary(ctx, o.head_dim(), o.rope_theta);
    auto forward = [m = attention.ptr(), r = rotary.ptr()](const std::vector<at::Tensor>& in) {
      const at::Tensor x = in[0];
      auto [cos, sin] = r->forward(at::arange(x.size(1)).expand({x.size(0), x.size(1)}));  // positions 0..S-1
      return m->forward(x, cos, sin);
    };
    return mih::spec::ParityCandidate{attention.ptr(), forward};
  };
  c.weights = {{"q_proj.weight"}, {"k_proj.weight"}, {"v_proj.weight"}, {"o_proj.weight"}};
  c.reference = [=](const mih::spec::ReferenceWeights& w, const std::vector<at::Tensor>& in) {
    const at::TensorOptions f64 = at::TensorOptions().dtype(at::kDouble);
    const at::Tensor inv_freq = 1.0 / at::pow(o.rope_theta, at::arange(0, d, 2, f64) / static_cast<double>(d));
    const at::Tensor angles = at::outer(at::arange(seq, f64), inv_freq);  // [S, D/2]
    const at::Tensor cos = at::cat({angles, angles}, -1).cos(), sin = at::cat({angles, angles}, -1).sin();
    auto rotate = [&](const at::Tensor& t) {  // t * cos + rotate_half(t) * sin, rotate_half = [-t2, t1]
      return t * cos + at::cat({-t.narrow(-1, d / 2, d / 2), t.narrow(-1, 0, d / 2)}, -1) * sin;
    };
    auto rows = [&](const char* name, int64_t head) { return w.at(name).narrow(0, head * d, d); };
    const at::Tensor causal = at::ones({seq, seq}, at::kBool).tril();
    std::vector<at::Tensor> per_head;
    for (int64_t i = 0; i < heads; ++i) {
      const at::Tensor q = rotate(at::matmul(in[0], rows("q_proj.weight", i).t()));
      const at::Tensor k = rotate(at::matmul(in[0], rows("k_proj.weight", i / group).t()));
      const at::Tensor v = at::matmul(in[0], rows("v_proj.weight", i / group).t());
      at::Tensor scores = at::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(d));
      scores = at::where(causal, scores, at::full_like(scores, -std::numeric_limits<double>::infinity()));
      per_head.push_back(at::matmul(at::softmax(scores, -1), v));
    }
    return at::matmul(at::cat(per_head, -1), w.at("o_proj.weight").t());
  };
  c.input_shapes = {{2, seq, o.hidden_size}};
  return c;
}

mih::spec::ModelSpec my_port_spec() {
  const Options o;
  mih::spec::ModelSpec s;
  s.name = "my_port";
  s.description = "a tiny Llama-style decoder (written by mih scaffold --template llama)";
  s.factory = make_model(o);
  // What the parallel degrees must divide: tp the query heads and the MLP's width (the matrix
  // rejects, with the arithmetic, a case whose tp does not), tp the KV heads or a multiple of
  // them (KV heads replicated over tp), cp the sequence (into 2 * cp chunks, zigzag), pp (x vpp)
  // the decoder layers the model splits into stages.
  s.tp_divides = {o.num_attention_heads, o.intermediate_size};
  s.num_key_value_heads = o.num_key_value_heads;
  s.seq_len = kSeq;
  s.pipeline_layers = o.num_hidden_layers;

  // Data: the pipeline, its fields and who fills them. input_ids, labels and position_ids are
  // implicit; declare every other field the pipeline produces in s.data.fields (forward or
  // loss, split on the sequence or whole under cp), e.g. {"loss_mask", false, true}.
  s.data.pipeline = "synthetic tokens from a generator seeded by the step, labels shifted in the pipeline";
  s.data.make_batches = [vocab = o.vocab_size] { return synthetic_batches(vocab); };
  s.data.labels_are_shifted = true;  // labels[:, t] is the target of input_ids[:, t]
  s.data.causal_lm = true;           // checked: each valid label is the next input token
  s.data.runtime_fields = {"position_ids"};  // filled by the Trainer, not by the pipeline

  // Checkpoint: internal FQN -> Hugging Face key, rule by rule (the first that matches).
  // LlamaForCausalLM keeps the decoder under "model." and the head beside it; every weight is
  // a Linear's [out, in], as here.
  s.checkpoint.key_map = {{R"(lm_head\.weight)", {"lm_head.weight"}}, {R"((.+))", {"model.$1"}}};
  // The architecture's config.json (what `mih export` writes, `mih inspect` compares), by
  // LlamaConfig's names: a Hugging Face LlamaForCausalLM loads the export. Every field that
  // changes the original's numbers is declared, defaults included, so none defaults silently
  // on the original's side.
  s.checkpoint.hf = {"llama",
                     {"LlamaForCausalLM"},
                     {{"vocab_size", o.vocab_size},
                      {"hidden_size", o.hidden_size},
                      {"intermediate_size", o.intermediate_size},
                      {"num_hidden_layers", o.num_hidden_layers},
                      {"num_attention_heads", o.num_attention_heads},
                      {"num_key_value_heads", o.num_key_value_heads},
                      {"head_dim", o.head_dim()},
                      {"hidden_act", "silu"},
                      {"rms_norm_eps", o.rms_norm_eps},
                      {"rope_theta", o.rope_theta},
                      {"rope_scaling", nullptr},
                      {"pretraining_tp", 1},
                      {"tie_word_embeddings", o.tie_word_embeddings},
                      {"attention_bias", false},
                      {"attention_dropout", 0.0},
                      {"mlp_bias", false},
                      {"initializer_range", o.initializer_range}}};
  // Keys of a real Llama checkpoint the port does not load: older exports carry the rotary
  // table, which the port rebuilds from the config.
  s.checkpoint.inference_only = {"*rotary_emb.inv_freq"};
  // Parameters with no external key (none here), pairs of FQNs that must be one tied
  // parameter (with tie_word_embeddings: the export then has no lm_head.weight), and a local
  // checkpoint directory whose keys the map must cover (`mih inspect --hf-dir` compares
  // shapes, dtypes and config too; nothing is downloaded).
  s.checkpoint.training_only = {};
  s.checkpoint.tied = {};
  if (o.tie_word_embeddings) s.checkpoint.tied = {{"embed_tokens.weight", "lm_head.weight"}};
  s.checkpoint.source = "";
  // A local Hugging Face checkpoint every case and its reference start from instead of the
  // seed's weights (through the key map; checked before any rank starts; it is then also the
  // source checkpoint). Empty: the seed's. For one run:
  // `my_port_conformance test --init-from DIR`.
  s.checkpoint.init_from = "";

  // Shared state: values one layer publishes in forward and others consume, checked for one
  // producer and one publication per forward, also under activation checkpointing: the
  // rotary table, published by rotary_emb, consumed by every decoder layer.
  s.shared_state = {{"rotary.cos", "rotary_emb", {"layers.*"}}, {"rotary.sin", "rotary_emb", {"layers.*"}}};
  // Modalities: a batch field and the parameters that must receive finite, non-zero
  // gradients when it reaches the model (a vision tower for pixel_values). Text only here.
  s.modalities = {};

  // The original model: the golden Hugging Face's Llama computes on this port's export
  // (CMakeLists.txt makes it: transformers' LlamaForCausalLM where a transformers Python is
  // configured, else mih's builtin Llama), and where the port's modules meet its hidden
  // states: embed_tokens' output is hidden state 0, layer i's output i + 1, the final norm's
  // the last (num_hidden_layers + 1); the logits are lm_head's output. MatchesOriginal compares
  // the Reference's loss, logits, these outputs, every gradient and the parameters after the
  // step with it; a failure names the first module whose output differs from Llama's.
  s.golden.dir = MIH_GOLDEN_DIR;
  s.golden.layers = {{"embed_tokens", 0}};
  for (int64_t i = 0; i < o.num_hidden_layers; ++i) s.golden.layers.emplace_back("layers." + std::to_string(i), i + 1);
  s.golden.layers.emplace_back("norm", o.num_hidden_layers + 1);
  s.golden.logits = "lm_head";

  // State invariants by phase (structure, materialization, checkpoint, runtime), and module
  // parity cases against independent implementations.
  s.invariants = {inv_freq_matches_theta(o.rope_theta, mih::spec::Phase::kStructure),
                  inv_freq_matches_theta(o.rope_theta, mih::spec::Phase::kCheckpoint),
                  head_tied_as_configured(o.tie_word_embeddings), vocab_padding_is_zero(o.vocab_size)};
  s.parity_cases = {attention_vs_llama_attention()};

  // Tolerances of parity with the single-rank reference, relative, by dtype: same topology
  // (a resume) and cross topology (another parallel config). float64 on CPU is the oracle
  // lane: any split of one global batch must match to 1e-10.
  s.tolerances.same_topology = {{"float64", 1e-10}, {"float32", 1e-4}, {"bfloat16", 2e-2}};
  s.tolerances.cross_topology = {{"float64", 1e-10}, {"float32", 1e-3}, {"bfloat16", 5e-2}};

  // The trainer options the port trains with: AdamW, weight decay except on the RMSNorms
  // (Llama names them *norm*: a norm outside this pattern is a finding), global gradient
  // clipping. The OptimizerLayout suite checks the groups against them.
  s.trainer.lr(1e-3).beta1(0.9).beta2(0.95).weight_decay(0.1).max_grad_norm(1.0).no_weight_decay({"*norm*"});
  // 1-D parameters decayed on purpose, frozen parameters, trainable parameters some runs may
  // never reach (any other that gets no gradient at any step of a case is a finding), and the
  // modules whose outputs the activation probes record (empty: every module the model declares
  // with ctx.observe(module, output, layout), as model.h does for each of its modules).
  s.decayed_1d = {};
  s.frozen = {};
  s.unused_parameters = {};
  s.activation_watch = {};
  return s;
}

MIH_REGISTER_SPEC(my_port_spec);

}  // namespace
}  // namespace my_port

// Every conformance suite for this spec over the cpu-smoke matrix (`--matrix` overrides it):
// tests named MyPort/<Suite>.<Invariant>/<Case>.
MIH_CONFORMANCE_SUITES(MyPort, "my_port", "cpu-smoke");
