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

// The global batch: 8 sequences of 16 tokens. Every split of it (over dp ranks, micro-batches
// and the cp sequence chunks) must give the numbers of one rank.
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

// A structure invariant: the head has a weight of its own. GPT-2 ties lm_head to wte; this
// port does not (tie_word_embeddings false in its config), and a tie made by accident (a
// module reused) would pass every parity test while training a different model.
mih::spec::StateInvariant head_not_tied() {
  return {"head_not_tied_to_embedding", mih::spec::Phase::kStructure,
          [](const mih::TrainingState& t) -> mih::spec::CheckResult {
            for (const auto& p : t.context->parameters()) {
              for (const auto& alias : p->aliases) {
                if (alias == "lm_head.weight") return {false, {{"tied", p->fqn + " = lm_head.weight"}}};
              }
            }
            return {true, {{"lm_head", "a parameter of its own"}}};
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
              if (p->fqn != "wte.weight" && p->fqn != "lm_head.weight") continue;
              // This piece's first row in the padded table (its tp shard, then its FSDP rows).
              const int64_t first = p->local_offset.at(0);
              for (int64_t r = std::max<int64_t>(vocab - first, 0); r < p->local.size(0); ++r, ++rows) {
                largest = std::max(largest, p->local[r].abs().max().item<double>());
              }
            }
            return {largest == 0, {{"padding_rows_checked", rows}, {"largest_abs_value", largest}}};
          }};
}

// A module parity case: the port's attention against GPT-2's attention written independently
// from Hugging Face's GPT2Attention (Conv1D weights [in, out], an explicit loop over heads,
// the causal mask from a lower-triangular matrix). The harness builds the candidate on one
// rank, gives the reference its weights through the adapter below, runs both forward and
// backward in float64 and compares the output, the input's gradient and every parameter's
// gradient (one the adapter leaves unmapped fails).
mih::spec::ModuleParityCase attention_vs_gpt2_attention() {
  const Options o;
  const int64_t hidden = o.n_embd, heads = o.n_head, head_dim = o.n_embd / o.n_head, seq = 6;
  mih::spec::ModuleParityCase c;
  c.name = "attention_vs_gpt2_attention";
  c.candidate = [o](mih::ParallelContext& ctx) {
    Attention attention(ctx, o);
    return mih::spec::ParityCandidate{attention.ptr(), [m = attention.ptr()](const std::vector<at::Tensor>& in) {
                                        return m->forward(in[0]);
                                      }};
  };
  // Candidate FQN -> the reference's name, with a differentiable transform: Conv1D holds the
  // transpose of a Linear's weight.
  const auto conv1d = [](const at::Tensor& w) { return w.t(); };
  c.weights = {{"c_attn.weight", "c_attn.weight", conv1d},
               {"c_attn.bias"},
               {"c_proj.weight", "c_proj.weight", conv1d},
               {"c_proj.bias"}};
  c.reference = [=](const mih::spec::ReferenceWeights& w, const std::vector<at::Tensor>& in) {
    const at::Tensor qkv = at::matmul(in[0], w.at("c_attn.weight")) + w.at("c_attn.bias");  // [B, S, 3H]
    const std::vector<at::Tensor> q_k_v = qkv.split(hidden, -1);
    const at::Tensor causal = at::ones({seq, seq}, at::kBool).tril();
    std::vector<at::Tensor> per_head;
    for (int64_t i = 0; i < heads; ++i) {
      auto head = [&](const at::Tensor& t) { return t.narrow(-1, i * head_dim, head_dim); };
      at::Tensor scores = at::matmul(head(q_k_v[0]), head(q_k_v[1]).transpose(-1, -2)) /
                          std::sqrt(static_cast<double>(head_dim));
      scores = at::where(causal, scores, at::full_like(scores, -std::numeric_limits<double>::infinity()));
      per_head.push_back(at::matmul(at::softmax(scores, -1), head(q_k_v[2])));
    }
    return at::matmul(at::cat(per_head, -1), w.at("c_proj.weight")) + w.at("c_proj.bias");
  };
  c.input_shapes = {{2, seq, hidden}};
  return c;
}

mih::spec::ModelSpec my_port_spec() {
  const Options o;
  mih::spec::ModelSpec s;
  s.name = "my_port";
  s.description = "a tiny GPT-2-style decoder (written by mih scaffold)";
  s.factory = make_model(o);
  // What the parallel degrees must divide: tp each of these (the matrix rejects, with the
  // arithmetic, a case whose tp does not), cp the sequence (into 2 * cp chunks, zigzag).
  s.tp_divides = {o.n_head, o.n_inner};
  s.seq_len = kSeq;

  // Data: the pipeline, its fields and who fills them. input_ids, labels and position_ids are
  // implicit; declare every other field the pipeline produces in s.data.fields (forward or
  // loss, split on the sequence or whole under cp), e.g. {"loss_mask", false, true}.
  s.data.pipeline = "synthetic tokens from a generator seeded by the step, labels shifted in the pipeline";
  s.data.make_batches = [vocab = o.vocab_size] { return synthetic_batches(vocab); };
  s.data.labels_are_shifted = true;  // labels[:, t] is the target of input_ids[:, t]
  s.data.causal_lm = true;           // checked: each valid label is the next input token
  s.data.runtime_fields = {"position_ids"};  // filled by the Trainer, not by the pipeline

  // Checkpoint: internal FQN -> Hugging Face key, rule by rule (the first that matches).
  // GPT-2's checkpoints keep attention and MLP weights in Conv1D layout, [in, out]: the
  // transpose of this port's Linear [out, in]. c_attn's q, k, v stay fused, as in GPT-2.
  s.checkpoint.key_map = {
      {R"((h\.\d+\.(attn|mlp)\.c_(attn|proj|fc))\.weight)", {"transformer.$1.weight"}, 0, /*transpose=*/true},
      {R"(lm_head\.weight)", {"lm_head.weight"}},
      {R"((.+))", {"transformer.$1"}}};
  // The architecture's config.json (what `mih export` writes, `mih inspect` compares), by
  // GPT2Config's names: a Hugging Face GPT2LMHeadModel loads the export.
  s.checkpoint.hf = {"gpt2",
                     {"GPT2LMHeadModel"},
                     {{"vocab_size", o.vocab_size},
                      {"n_positions", o.n_positions},
                      {"n_embd", o.n_embd},
                      {"n_layer", o.n_layer},
                      {"n_head", o.n_head},
                      {"n_inner", o.n_inner},
                      {"activation_function", "gelu_new"},
                      {"layer_norm_epsilon", o.layer_norm_epsilon},
                      {"initializer_range", o.initializer_range},
                      {"resid_pdrop", 0.0},
                      {"embd_pdrop", 0.0},
                      {"attn_pdrop", 0.0},
                      {"scale_attn_weights", true},
                      {"scale_attn_by_inverse_layer_idx", false},
                      {"reorder_and_upcast_attn", false},
                      {"tie_word_embeddings", false}}};
  // Keys of a real GPT-2 checkpoint the port does not load: the causal-mask buffers.
  s.checkpoint.inference_only = {"transformer.h.*.attn.bias", "transformer.h.*.attn.masked_bias"};
  // Parameters with no external key (none here), pairs of FQNs that must be one tied
  // parameter (GPT-2 ties {"wte.weight", "lm_head.weight"}; this port does not), and a local
  // checkpoint directory whose keys the map must cover (`mih inspect --hf-dir` compares
  // shapes, dtypes and config too; nothing is downloaded).
  s.checkpoint.training_only = {};
  s.checkpoint.tied = {};
  s.checkpoint.source = "";
  // A local Hugging Face checkpoint every case and its reference start from instead of the
  // seed's weights (through the key map; checked before any rank starts; it is then also the
  // source checkpoint). Empty: the seed's. For one run:
  // `my_port_conformance test --init-from DIR`.
  s.checkpoint.init_from = "";

  // Shared state: values one layer publishes in forward and others consume
  // (ctx.shared_state(): a rotary table, routing statistics, vision features), checked for one
  // producer and one publication per forward, also under activation checkpointing. This port
  // has none; specs/llama_spec.cpp declares its rotary table, e.g.
  // {"rotary.cos", "*rotary_emb", {"*layers.*"}}; a fourth member names a field the state
  // needs (vision features only when pixel_values reach the model: a text-only step
  // publishes none).
  s.shared_state = {};
  // Modalities: a batch field and the parameters that must receive finite, non-zero
  // gradients when it reaches the model (a vision tower for pixel_values). Text only here;
  // specs/vlm_spec.cpp declares {"pixel_values", {"vision_tower.*", "multi_modal_projector.*"}}.
  s.modalities = {};

  // The original model: the golden GPT-2 computes on this port's export (CMakeLists.txt makes
  // it with mih's builtin GPT-2), and where the port's modules meet its hidden states: block
  // h.i's output is hidden state i + 1 (Hugging Face's output_hidden_states count), ln_f's the
  // last (n_layer + 1); the logits are lm_head's output. MatchesOriginal compares the
  // Reference's loss, logits, these outputs, every gradient and the parameters after the step
  // with it; a failure names the first block whose output differs from GPT-2's.
  s.golden.dir = MIH_GOLDEN_DIR;
  for (int64_t i = 0; i < o.n_layer; ++i) s.golden.layers.emplace_back("h." + std::to_string(i), i + 1);
  s.golden.layers.emplace_back("ln_f", o.n_layer + 1);
  s.golden.logits = "lm_head";

  // State invariants by phase (structure, materialization, checkpoint, runtime), and module
  // parity cases against independent implementations.
  s.invariants = {head_not_tied(), vocab_padding_is_zero(o.vocab_size)};
  s.parity_cases = {attention_vs_gpt2_attention()};

  // Tolerances of parity with the single-rank reference, relative, by dtype: same topology
  // (a resume) and cross topology (another parallel config). float64 on CPU is the oracle
  // lane: any split of one global batch must match to 1e-10.
  s.tolerances.same_topology = {{"float64", 1e-10}, {"float32", 1e-4}, {"bfloat16", 2e-2}};
  s.tolerances.cross_topology = {{"float64", 1e-10}, {"float32", 1e-3}, {"bfloat16", 5e-2}};

  // The trainer options the port trains with: AdamW, weight decay except on biases and the
  // LayerNorms (GPT-2 names them ln_*: a norm outside these patterns is a finding), global
  // gradient clipping. The OptimizerLayout suite checks the groups against them.
  s.trainer.lr(1e-3).beta1(0.9).beta2(0.95).weight_decay(0.1).max_grad_norm(1.0).no_weight_decay({"*bias", "*ln_*"});
  // 1-D parameters decayed on purpose, frozen parameters, trainable parameters some runs may
  // never reach (any other that gets no gradient at any step of a case is a finding), and the
  // modules whose outputs the activation probes record (empty: every module the model declares
  // with ctx.observe(module, output, layout), as model.h does for each of its modules; a port
  // that declares none gets failures blamed no further than the loss).
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
