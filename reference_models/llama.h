// Reference model ports written against harness/parallel layers the way a careful author
// writes a port: `llama` (Touvron et al. 2023; Hugging Face transformers' LlamaForCausalLM
// layout and names) and `moe`, llama with a mixture-of-experts MLP in some layers (a top-k
// softmax router, Switch-Transformer load-balancing loss; the `moe` spec is a stock Qwen3-MoE:
// qk_norm, layer 0 dense, norm_topk_prob). Plain single-device
// code at degree 1; under dp_replicate, dp_shard (each decoder layer an FSDP unit), tp (with
// or without sequence parallelism), cp (contiguous or zigzag) and activation checkpointing
// (each decoder layer a region) they train to the numbers of one rank.
//
// Shapes: B = local batch, S = local sequence (S_global / CP; under sequence parallelism the
// residual stream is [B, S/TP, H] between tensor-parallel regions), H = hidden_size,
// D = head_dim (LlamaOptions::head_dim, by default H / num_heads), V = vocab_size.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include "harness/parallel/layers.h"
#include "harness/training/trainer.h"
#include "reference_models/mla_attention.h"

namespace mih::models {

/// Options of llama, qwen3 and moe (Hugging Face LlamaConfig / Qwen3Config / Qwen3MoeConfig names
/// where they exist).
struct LlamaOptions {
  /// Vocabulary V; default: the byte tokenizer's 256 bytes + BOS, EOS, PAD.
  TORCH_ARG(int64_t, vocab_size) = 259;
  TORCH_ARG(int64_t, hidden_size) = 64;
  /// SwiGLU inner size F of the dense MLP.
  TORCH_ARG(int64_t, intermediate_size) = 128;
  TORCH_ARG(int64_t, num_layers) = 2;
  TORCH_ARG(int64_t, num_heads) = 4;
  /// Key/value heads (grouped-query attention when < num_heads); tp must divide it, or be a
  /// multiple of it: then each KV head is replicated over tp / num_kv_heads tp ranks
  /// (ColumnParallelLinearOptions::heads, as vLLM does), a Qwen3 or Llama job's 4-8 KV heads
  /// at tp 8.
  TORCH_ARG(int64_t, num_kv_heads) = 2;
  /// Width D of each attention head; 0 (default): hidden_size / num_heads. Qwen3 sets it apart
  /// (Qwen3-0.6B: hidden 1024, 16 heads, D 128): q_proj is then [Hq * D, H], o_proj [H, Hq * D].
  TORCH_ARG(int64_t, head_dim) = 0;
  /// Per-head RMSNorm of q and k over D (weights [D], eps rms_norm_eps), after the projections
  /// are split into heads and before rotary: Qwen3's q_norm and k_norm (HeadRMSNorm, its
  /// gradient partial over tp; modules self_attn.q_norm, self_attn.k_norm). Default false.
  TORCH_ARG(bool, qk_norm) = false;
  TORCH_ARG(double, rope_theta) = 10000.0;
  TORCH_ARG(double, rms_norm_eps) = 1e-6;
  /// The output head reuses the token embedding's table.
  TORCH_ARG(bool, tie_word_embeddings) = false;
  /// Dropout on the attention context and on each residual branch (training only).
  TORCH_ARG(double, dropout) = 0.0;
  /// Biases on the q, k, v (column-parallel) and o (row-parallel) projections (Hugging Face
  /// LlamaConfig.attention_bias; Qwen2 has them on q, k, v).
  TORCH_ARG(bool, attention_bias) = false;
  /// Standard deviation of the normal init of every projection and the embedding.
  TORCH_ARG(double, init_std) = 0.02;
  /// The loss over vocab-parallel logits (each tp rank holds V/TP of them; the softmax's max
  /// and sum all-reduced over tp, Megatron's vocab_parallel_cross_entropy). false: the head
  /// all-gathers its logits over tp ([B, S, V/TP] -> [B, S, V]) and every rank computes an
  /// ordinary cross entropy on them, as TorchTitan with --training.disable_loss_parallel and
  /// most ports that keep Hugging Face's loss. Default true.
  TORCH_ARG(bool, loss_parallel) = true;
  /// Make the root module (token embedding, final norm, head) FSDP unit "root". false leaves
  /// its parameters whole on every dp_shard rank, outside every unit, their gradients
  /// all-reduced over dp_shard (a port that fully_shards only its decoder layers; reduction
  /// path dense.unsharded.dp_shard). Default true.
  TORCH_ARG(bool, fsdp_root) = true;
  /// Layers whose MLP is a mixture of experts (the moe model); empty: dense llama.
  TORCH_ARG(std::vector<int64_t>, moe_layers) = {};
  /// Experts E per MoE layer, and how many each token is routed to.
  TORCH_ARG(int64_t, num_experts) = 4;
  TORCH_ARG(int64_t, top_k) = 2;
  /// SwiGLU inner size of each expert.
  TORCH_ARG(int64_t, expert_intermediate_size) = 64;
  /// Weight alpha of the load-balancing loss (Switch Transformer, Fedus et al. 2021, eq. 4).
  TORCH_ARG(double, router_aux_loss_coef) = 0.01;
  /// Declares each module's forward output to the activation probes (ParallelContext::observe),
  /// which localize a parity failure to a module. false: a port that never does (the
  /// `llama_unobserved` spec), whose failures mih can localize no further than the loss.
  /// Default true.
  TORCH_ARG(bool, observe_activations) = true;
  /// The top_k router probabilities renormalized to sum to 1 (Mixtral always; Qwen2-MoE's
  /// norm_topk_prob, false by default there). Default true.
  TORCH_ARG(bool, norm_topk_prob) = true;
  /// SwiGLU inner size of the shared expert every token of a MoE layer also goes through,
  /// scaled by sigmoid(x g^T) (Qwen2-MoE's shared_expert and shared_expert_gate); 0: none.
  TORCH_ARG(int64_t, shared_expert_intermediate_size) = 0;
  /// The attention of every decoder layer: "gqa" (default; LlamaAttention) or "mla"
  /// (multi-head latent attention, DeepSeek-V2/V3: MlaAttention, its sizes in `mla`; the
  /// rotary table built for mla.qk_rope_head_dim; head_dim and num_kv_heads unused by it).
  TORCH_ARG(std::string, attention) = "gqa";
  /// The sizes of the "mla" attention.
  TORCH_ARG(MlaOptions, mla) = {};
  /// Attention never crosses a document of a packed row: a query attends only to the keys of
  /// its own document (block-causal), from the batch field "document_ids" ([B, S] int64,
  /// TextPipelineOptions::document_ids), which the spec hands whole to every cp rank
  /// (cp-replicated) so the mask is looked up at global token ids (CpAttentionMask). Rotary
  /// positions come from position_ids, which restart at every document. false (default): every
  /// row one causal sequence.
  TORCH_ARG(bool, document_mask) = false;
  /// Sliding-window attention: a query attends only to itself and the sliding_window - 1 keys
  /// before it (transformers' sliding_window: q - W < k <= q), in global token ids, so exact
  /// under any cp layout (CpAttentionMask::window); with document_mask both hold. 0 (default):
  /// every earlier key.
  TORCH_ARG(int64_t, sliding_window) = 0;

 public:
  /// D: head_dim, or hidden_size / num_heads when it is 0.
  int64_t resolved_head_dim() const { return head_dim() > 0 ? head_dim() : hidden_size() / num_heads(); }
  /// The width of the rotary table: mla.qk_rope_head_dim under attention("mla"), else D.
  int64_t rotary_dim() const { return attention() == "mla" ? mla().qk_rope_head_dim() : resolved_head_dim(); }
  /// Throws: mih::Error{kInvalidSpec} naming the option and the arithmetic when the sizes do
  ///   not fit each other or the mesh (hidden_size % num_heads without head_dim, an odd or
  ///   negative head_dim, num_heads % num_kv_heads,
  ///   num_heads % tp, num_kv_heads % tp unless tp % num_kv_heads, intermediate_size % tp, top_k > num_experts, a MoE layer index out
  ///   of range).
  void validate(const ParallelContext& ctx) const;
};

/// Grouped-query self-attention with rotary positions over a context-parallel sequence, with
/// Qwen3's per-head q and k norms under qk_norm (Qwen3Attention: norm, then rotary).
/// Input [B, S, H] (sequence parallel: [B, S/TP, H]), cos/sin [B, 1, S, D], document_ids
/// [B, S * CP] (the whole row; undefined: no document mask) -> like the input.
class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(ParallelContext& ctx, const LlamaOptions& o);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& document_ids = {});

  ColumnParallelLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr};
  RowParallelLinear o_proj{nullptr};
  /// Under qk_norm (null otherwise): weights [D], over this rank's heads [B, Hq/TP, S, D].
  HeadRMSNorm q_norm{nullptr}, k_norm{nullptr};

 private:
  ParallelContext* ctx_;
  LlamaOptions o_;
};
TORCH_MODULE(LlamaAttention);

/// SwiGLU MLP: down(silu(gate(x)) * up(x)) with gate and up fused in one column-parallel
/// projection [gate; up] (2 partitions, so each tp rank holds matching halves).
/// Shape: [B, S, H] (sequence parallel: [B, S/TP, H]) -> the same.
class LlamaMlpImpl : public torch::nn::Module {
 public:
  LlamaMlpImpl(ParallelContext& ctx, const LlamaOptions& o);
  at::Tensor forward(const at::Tensor& x);

  ColumnParallelLinear gate_up_proj{nullptr};
  RowParallelLinear down_proj{nullptr};
};
TORCH_MODULE(LlamaMlp);

/// The E routed SwiGLU experts, stacked on dim 0 as TorchTitan's GroupedExperts:
/// gate_up_proj [E * 2F, H] (expert e's fused [gate; up] in rows [2F e, 2F (e + 1))) and
/// down_proj [E * H, F]. Sharded over ep (each ep rank holds its E / ep experts' rows:
/// ParamSpec::experts), FSDP-sharded over edp, replicated over tp (the gradient partial over
/// tp under sequence parallelism, where each tp rank routes only its own tokens).
class MoeExpertsImpl : public torch::nn::Module {
 public:
  MoeExpertsImpl(ParallelContext& ctx, const LlamaOptions& o);
  /// Runs this rank's expert l on rows [sum(rows[:l]), sum(rows[:l + 1])) of `x`.
  /// Every local expert computes, on no row too, so its gradient (zero) and optimizer
  /// update exist like the reference's. Shape: x [R, H], rows [E / ep] (sum R) -> [R, H].
  at::Tensor forward(const at::Tensor& x, const std::vector<int64_t>& rows);

  at::Tensor gate_up_proj, down_proj;  // [E * 2F, H], [E * H, F]

 private:
  ParallelContext* ctx_;
  int64_t hidden_, intermediate_;
};
TORCH_MODULE(MoeExperts);

/// Mixture-of-experts MLP: a top-k softmax router (weight [E, H], replicated) sends each token
/// to top_k of E SwiGLU experts, weighting their outputs by the router probabilities,
/// renormalized over the top_k (Mixtral; Qwen2-MoE with norm_topk_prob) or not; with
/// shared_expert_intermediate_size > 0 every token also goes through a shared SwiGLU expert
/// (tensor-parallel like the dense MLP) scaled by sigmoid(x g^T), g [1, H] replicated
/// (Qwen2-MoE). The load-balancing loss alpha * E * sum_e f_e * P_e (f_e: the fraction of
/// tokens with expert e among their top_k, summing to top_k over the experts, as Mixtral and
/// Qwen2-MoE count it; P_e: mean router probability of e; both over the tokens of the whole
/// global batch: counts all-reduced over dp and cp, and over tp under
/// sequence parallelism) is this rank's share, normalized by the global token count, and
/// reaches the gradients through the output (Megatron-LM's MoEAuxLossAutoScaler), so it works
/// inside a checkpointed region. The global counts are shared state "<FQN>.expert_counts",
/// published by the router and consumed by the balancing loss. Under expert parallelism the
/// token slots are sorted by expert, the per-expert counts exchanged over ep, the tokens sent
/// to the ep rank owning their expert with a variable-split all-to-all, processed, sent back
/// (the reverse all-to-all), weighted by their gates and summed per token (TorchTitan's
/// token dispatch and combine): top_k_routing and TokenDispatcher (harness/parallel/
/// expert_parallel.h), which a port of its own calls the same way; both all-to-alls are
/// differentiable. Shape: [B, S, H] -> the same.
class MoeMlpImpl : public torch::nn::Module {
 public:
  /// `name`: the module's FQN, the producer of its routing statistics.
  MoeMlpImpl(ParallelContext& ctx, const LlamaOptions& o, std::string name);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor router;  // [E, H]
  MoeExperts experts{nullptr};
  /// The shared expert and its gate [1, H] (undefined without one).
  LlamaMlp shared_expert{nullptr};
  at::Tensor shared_expert_gate;
  /// Of the last forward that was not a recompute: token slots per expert over the global
  /// batch [E] (int64; sums to global tokens x top_k), and this rank's aux loss share.
  at::Tensor last_expert_counts;
  double last_aux_loss = 0;

 private:
  ParallelContext* ctx_;
  LlamaOptions o_;
  std::string name_;
};
TORCH_MODULE(MoeMlp);

/// Pre-norm decoder layer: x + attn(norm(x)), then h + mlp(norm(h)); the MLP is MoeMlp in the
/// layers listed in moe_layers.
class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  LlamaDecoderLayerImpl(ParallelContext& ctx, const LlamaOptions& o, int64_t index);
  /// document_ids as LlamaAttentionImpl::forward takes them.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& document_ids = {});

  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  /// The attention, registered as "self_attn": grouped-query (self_attn), or under
  /// attention("mla") multi-head latent attention (mla_attn; self_attn null).
  LlamaAttention self_attn{nullptr};
  MlaAttention mla_attn{nullptr};
  std::shared_ptr<torch::nn::Module> mlp;  // LlamaMlpImpl or MoeMlpImpl

 private:
  ParallelContext* ctx_;
  LlamaOptions o_;
  at::Tensor mlp_forward(const at::Tensor& x);
};
TORCH_MODULE(LlamaDecoderLayer);

/// The causal language model: embed_tokens, rotary_emb (its inv_freq a non-persistent buffer),
/// layers, norm, lm_head (optionally tied to embed_tokens), vocab-parallel cross entropy.
/// FQNs are Hugging Face's without the "model." prefix (embed_tokens.weight,
/// layers.0.self_attn.q_proj.weight, ..., lm_head.weight).
class LlamaForCausalLM : public ParallelModel {
 public:
  LlamaForCausalLM(ParallelContext& ctx, const LlamaOptions& o);

  /// Shape: batch [B, S] (position_ids: global positions) -> per-token losses [B, S].
  at::Tensor token_losses(const Batch& batch) override;
  /// Logits of this rank's vocabulary slice. Shape: [B, S] -> [B, S, V/TP] (padded vocab).
  at::Tensor logits(const Batch& batch) override;
  /// The token embeddings: [B, S] -> [B, S, H] (sequence parallel: [B, S/TP, H]).
  at::Tensor embed(const Batch& batch);
  /// The decoder over embeddings `x` (from embed(), possibly with other modalities merged in)
  /// at batch.position_ids, then the final norm and the head: -> logits [B, S, V/TP].
  /// Throws: mih::Error{kInvalidSpec} on a pipeline stage (it holds part of the model).
  at::Tensor decode(const at::Tensor& x, const Batch& batch);
  /// Pipeline parallelism: stage `stage`'s layers over `input` (the first stage: over the
  /// embeddings of micro_batch), and on the last stage the final norm, the head and the loss.
  /// Shape: [b, s, H] -> [b, s, H], or per-token losses [b, s] on the last stage.
  at::Tensor stage_forward(int stage, const at::Tensor& input, const Batch& micro_batch) override;
  /// [b, s, H] ([b, s/TP, H] under sequence parallelism), empty.
  at::Tensor stage_input(int stage, const Batch& micro_batch) override;
  /// Per-token cross entropy of logits from decode(): -> [B, S].
  at::Tensor losses(const at::Tensor& logits, const Batch& batch);
  /// Each decoder layer an FSDP unit, the rest the root (left out of FSDP when fsdp_root is off).
  void apply_fsdp(ParallelContext& ctx) override;

  const LlamaOptions& options() const { return o_; }
  /// The MoE MLPs of the layers in moe_layers, in layer order.
  std::vector<MoeMlpImpl*> moe_mlps() const;

  /// Under pp a stage holds only its modules: embed_tokens on the first stage (and on the
  /// last as the head's tied copy under tie_word_embeddings), norm and lm_head on the last
  /// (null elsewhere), and its decoder layers.
  VocabParallelEmbedding embed_tokens{nullptr};
  RotaryEmbedding rotary_emb{nullptr};
  /// The decoder layers of this rank, registered under their global index ("layers.3").
  std::shared_ptr<torch::nn::Module> layers;
  std::map<int64_t, LlamaDecoderLayer> decoder_layers;
  RMSNorm norm{nullptr};
  ColumnParallelLinear lm_head{nullptr};

 private:
  /// Layers [first, last) over x, the rotary table published once for them.
  at::Tensor run_layers(at::Tensor x, const Batch& batch, int64_t first, int64_t last);
  /// Under document_mask the batch's document_ids [B, S * CP], else undefined.
  /// Throws: mih::Error{kInvalidSpec} when document_mask is set and the batch lacks the field.
  at::Tensor document_ids(const Batch& batch) const;
  /// The positions of this rank's tokens the rotary table is built for: batch.position_ids.
  at::Tensor rotary_positions(const Batch& batch) const;
  /// The final norm and the head: -> logits [B, S, V/TP].
  at::Tensor head_logits(const at::Tensor& x);

  ParallelContext* ctx_;
  LlamaOptions o_;
  std::vector<PipelineStage> stages_;
};

/// Factories for the Trainer. make_moe requires at least one moe layer (default: every
/// second layer, starting with layer 1, when moe_layers is empty).
ModelFactory make_llama(LlamaOptions o = {});
ModelFactory make_moe(LlamaOptions o = {});

}  // namespace mih::models
