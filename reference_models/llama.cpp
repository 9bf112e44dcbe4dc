// llama and moe (see llama.h).
#include "reference_models/llama.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/parallel/activation_checkpoint.h"
#include "harness/parallel/context_parallel.h"
#include "harness/parallel/expert_parallel.h"
#include "harness/parallel/regions.h"

namespace mih::models {
namespace {

// Forward: identity on `out`. Backward: the output's gradient, and 1 for `aux` (a scalar loss
// term), so `aux` adds its gradient without being added to the reported loss
// (Megatron-LM's MoEAuxLossAutoScaler).
struct AttachAuxLoss : public torch::autograd::Function<AttachAuxLoss> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& out, const at::Tensor& aux) {
    ctx->saved_data["aux_dtype"] = static_cast<int64_t>(aux.scalar_type());
    return out.view_as(out);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["aux_dtype"].toInt());
    return {grads[0], at::ones({}, grads[0].options().dtype(dtype))};
  }
};

// `out`, declared the forward output of `module` to the activation probes unless the port is
// built as one that never declares any (LlamaOptions::observe_activations).
at::Tensor observed(ParallelContext& ctx, const LlamaOptions& o, const torch::nn::Module& module, const at::Tensor& out,
                    const ActivationLayout& layout) {
  return o.observe_activations() ? ctx.observe(module, out, layout) : out;
}

ParamSpec replicated(std::vector<int64_t> shape, double std, bool partial_over_tp) {
  ParamSpec s;
  s.shape = std::move(shape);
  s.init = init::normal(std);
  s.tp_partial_grad = partial_over_tp;
  return s;
}

}  // namespace

void LlamaOptions::validate(const ParallelContext& ctx) const {
  const int64_t tp = ctx.tp_size();
  MIH_CHECK(dropout() == 0 || !ctx.config().pipelined(), "llama: dropout ", dropout(), " under pipeline parallelism (",
            ctx.config().name(), ") is not supported yet: the masks follow one forward through the whole model; "
            "set dropout to 0 for pp configs");
  MIH_CHECK(attention() == "gqa" || attention() == "mla", "llama: attention(\"", attention(),
            "\") is not one of \"gqa\" (grouped-query) and \"mla\" (multi-head latent)");
  MIH_CHECK(sliding_window() >= 0, "llama: sliding_window(", sliding_window(), ") must be >= 0 (0: no window)");
  MIH_CHECK(head_dim() >= 0, "llama: head_dim(", head_dim(), ") must be positive, or 0 for hidden_size / num_heads");
  MIH_CHECK(head_dim() > 0 || hidden_size() % num_heads() == 0, "llama: hidden_size(", hidden_size(),
            ") must divide by num_heads(", num_heads(), ") when head_dim is 0 (hidden_size / num_heads); set head_dim");
  MIH_CHECK(resolved_head_dim() % 2 == 0, "llama: head_dim = ",
            head_dim() > 0 ? "head_dim" : "hidden_size / num_heads", " = ", resolved_head_dim(),
            " must be even for rotary embeddings");
  MIH_CHECK(num_heads() % num_kv_heads() == 0, "llama: num_heads(", num_heads(), ") must be a multiple of num_kv_heads(",
            num_kv_heads(), ")");
  MIH_CHECK(num_heads() % tp == 0, "llama: num_heads(", num_heads(), ") must divide by tp(", tp, "): ", num_heads(),
            " % ", tp, " = ", num_heads() % tp, "; each tp rank holds whole query heads");
  MIH_CHECK(num_kv_heads() % tp == 0 || tp % num_kv_heads() == 0, "llama: num_kv_heads(", num_kv_heads(),
            ") must divide by tp(", tp, ") or tp be a multiple of it (the KV heads replicated over tp): ", num_kv_heads(),
            " % ", tp, " = ", num_kv_heads() % tp, ", ", tp, " % ", num_kv_heads(), " = ", tp % num_kv_heads(),
            "; use tp in the divisors or multiples of ", num_kv_heads());
  MIH_CHECK(intermediate_size() % tp == 0, "llama: intermediate_size(", intermediate_size(), ") must divide by tp(", tp, ")");
  MIH_CHECK(top_k() >= 1 && top_k() <= num_experts(), "moe: top_k(", top_k(), ") must be in [1, num_experts(",
            num_experts(), ")]");
  for (int64_t l : moe_layers()) {
    MIH_CHECK(l >= 0 && l < num_layers(), "moe: moe_layers names layer ", l, ", the model has layers 0..",
              num_layers() - 1);
  }
}

LlamaAttentionImpl::LlamaAttentionImpl(ParallelContext& ctx, const LlamaOptions& o) : ctx_(&ctx), o_(o) {
  const int64_t h = o.hidden_size(), d = o.resolved_head_dim();
  auto column = [&](int64_t out) {
    return ColumnParallelLinearOptions(h, out).bias(o.attention_bias()).init_std(o.init_std());
  };
  q_proj = register_module("q_proj", ColumnParallelLinear(ctx, column(o.num_heads() * d)));
  // At tp above the KV heads each is replicated over tp / num_kv_heads ranks (vLLM's
  // num_kv_head_replicas): tp rank t computes KV head t / (tp / num_kv_heads), the one its
  // query heads [t Hq/TP, (t + 1) Hq/TP) attend with.
  k_proj = register_module("k_proj", ColumnParallelLinear(ctx, column(o.num_kv_heads() * d).heads(o.num_kv_heads())));
  v_proj = register_module("v_proj", ColumnParallelLinear(ctx, column(o.num_kv_heads() * d).heads(o.num_kv_heads())));
  o_proj = register_module("o_proj", RowParallelLinear(ctx, RowParallelLinearOptions(o.num_heads() * d, h)
                                                                 .bias(o.attention_bias())
                                                                 .init_std(o.init_std())));
  if (o.qk_norm()) {
    q_norm = register_module("q_norm", HeadRMSNorm(ctx, d, o.rms_norm_eps()));
    k_norm = register_module("k_norm", HeadRMSNorm(ctx, d, o.rms_norm_eps()));
  }
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                       const at::Tensor& document_ids) {
  const int64_t d = o_.resolved_head_dim();
  // KV heads of this rank: KV/TP, or the one replicated head at tp > KV.
  const int64_t heads = o_.num_heads() / ctx_->tp_size(), kv_heads = std::max<int64_t>(o_.num_kv_heads() / ctx_->tp_size(), 1);
  at::Tensor q = q_proj(x);  // [B, S, Hq/TP * D], the sequence gathered under sequence parallelism
  const int64_t b = q.size(0), s = q.size(1);
  auto split_heads = [&](const at::Tensor& t, int64_t n) { return t.reshape({b, s, n, d}).transpose(1, 2); };
  at::Tensor qh = split_heads(q, heads), kh = split_heads(k_proj(x), kv_heads);
  if (q_norm) {
    // Qwen3: each head normalized over D before rotary.
    qh = q_norm(qh);
    kh = k_norm(kh);
  }
  qh = apply_rotary(qh, cos, sin);
  kh = apply_rotary(kh, cos, sin);
  // F29 (docs/fault-catalog.md): the queries scaled by 1 / sqrt(D) before an attention that scales the
  // scores by 1 / sqrt(D) itself: the scores scaled by 1 / D, in every configuration alike.
  if (fault::active(fault::Fault::kF29)) qh = qh / std::sqrt(static_cast<double>(d));
  CpAttentionMask mask;
  mask.document_ids = document_ids;
  mask.window = o_.sliding_window();
  at::Tensor context = cp_causal_attention(qh, kh, split_heads(v_proj(x), kv_heads), ctx_->cp_shard(), mask);
  context = context.transpose(1, 2).reshape({b, s, heads * d});
  // The context is split over tp by heads: Shard(features).
  return o_proj(ctx_->dropout(context, o_.dropout(), is_training(), ActivationLayout::column_parallel()));
}

LlamaMlpImpl::LlamaMlpImpl(ParallelContext& ctx, const LlamaOptions& o) {
  gate_up_proj = register_module(
      // F09 (docs/fault-catalog.md): the fused [gate; up] split over tp as one block, so one rank holds all
      // of gate and the other all of up.
      "gate_up_proj", ColumnParallelLinear(ctx, ColumnParallelLinearOptions(o.hidden_size(), 2 * o.intermediate_size())
                                                    .partitions(fault::active(fault::Fault::kF09) ? 1 : 2)
                                                    .bias(false)
                                                    .init_std(o.init_std())));
  down_proj = register_module("down_proj", RowParallelLinear(ctx, RowParallelLinearOptions(o.intermediate_size(), o.hidden_size())
                                                                         .bias(false)
                                                                         .init_std(o.init_std())));
}

at::Tensor LlamaMlpImpl::forward(const at::Tensor& x) {
  auto gate_up = gate_up_proj(x).chunk(2, -1);  // this rank's [gate | up] halves
  return down_proj(at::silu(gate_up[0]) * gate_up[1]);
}

MoeExpertsImpl::MoeExpertsImpl(ParallelContext& ctx, const LlamaOptions& o)
    : ctx_(&ctx), hidden_(o.hidden_size()), intermediate_(o.expert_intermediate_size()) {
  const int64_t e = o.num_experts(), h = o.hidden_size(), f = o.expert_intermediate_size();
  auto stacked = [&](std::vector<int64_t> shape) {
    ParamSpec spec = replicated(std::move(shape), o.init_std(), ctx.sequence_parallel());
    spec.experts = e;
    return ctx.make_parameter(spec);
  };
  gate_up_proj = register_parameter("gate_up_proj", stacked({e * 2 * f, h}));
  down_proj = register_parameter("down_proj", stacked({e * h, f}));
}

at::Tensor MoeExpertsImpl::forward(const at::Tensor& x, const std::vector<int64_t>& rows) {
  const at::Tensor gate_up = ctx_->use(gate_up_proj), down = ctx_->use(down_proj);
  const int64_t f = intermediate_, h = hidden_;
  MIH_CHECK(gate_up.size(0) == static_cast<int64_t>(rows.size()) * 2 * f, "MoeExperts: ", rows.size(),
            " expert row counts for ", gate_up.size(0) / (2 * f), " local experts");
  std::vector<at::Tensor> outs;
  int64_t start = 0;
  for (size_t l = 0; l < rows.size(); ++l) {
    const auto e = static_cast<int64_t>(l);
    const at::Tensor xs = x.narrow(0, start, rows[l]);
    auto gu = at::matmul(xs, gate_up.narrow(0, e * 2 * f, 2 * f).t()).chunk(2, -1);
    outs.push_back(at::matmul(at::silu(gu[0]) * gu[1], down.narrow(0, e * h, h).t()));
    start += rows[l];
  }
  return at::cat(outs, 0);
}

MoeMlpImpl::MoeMlpImpl(ParallelContext& ctx, const LlamaOptions& o, std::string name)
    : ctx_(&ctx), o_(o), name_(std::move(name)) {
  // F02 (docs/fault-catalog.md): the router's gradient, partial over tp under sequence parallelism (each tp
  // rank routes its own tokens), not marked so: it is never all-reduced.
  const bool router_partial = ctx.sequence_parallel() && !fault::active(fault::Fault::kF02);
  router = register_parameter(
      "router", ctx.make_parameter(replicated({o.num_experts(), o.hidden_size()}, o.init_std(), router_partial)));
  experts = register_module("experts", MoeExperts(ctx, o));
  if (o.shared_expert_intermediate_size() > 0) {
    shared_expert = register_module("shared_expert",
                                    LlamaMlp(ctx, LlamaOptions(o).intermediate_size(o.shared_expert_intermediate_size())));
    // Replicated over tp; under sequence parallelism each tp rank gates only its own tokens,
    // so its gradient is a partial sum over tp (like the router's).
    shared_expert_gate = register_parameter(
        "shared_expert_gate", ctx.make_parameter(replicated({1, o.hidden_size()}, o.init_std(), ctx.sequence_parallel())));
  }
}

at::Tensor MoeMlpImpl::forward(const at::Tensor& x) {
  const int64_t h = o_.hidden_size(), k = o_.top_k(), n_experts = o_.num_experts();
  at::Tensor tokens = x.reshape({-1, h});  // [N, H]: this rank's tokens
  const int64_t n = tokens.size(0);
  at::Tensor probs = at::softmax(at::matmul(tokens, ctx_->use(router).t()), -1);  // [N, E]
  // F31 (docs/fault-catalog.md): the top_k probabilities renormalized although the original does not
  // (Qwen2-MoE's norm_topk_prob false), in every configuration alike.
  const bool renormalize = o_.norm_topk_prob() || fault::active(fault::Fault::kF31);
  TopKRouting routing = top_k_routing(probs, k, /*normalize_top_k=*/renormalize);  // [N, k] experts and gates
  Communicator& ep = ctx_->mesh().comm(MeshAxis::kEp);
  // F24 (docs/fault-catalog.md): the gates detached under ep, so the router learns only from its aux loss.
  if (ep.size() > 1 && fault::active(fault::Fault::kF24)) routing.gates = routing.gates.detach();
  // Dispatch to the ep ranks of the experts, this rank's experts on what they received,
  // combine back (expert_parallel.h).
  const TokenDispatcher dispatcher(*ctx_, TokenDispatcherOptions(n_experts).layer(name_));
  const DispatchedTokens dispatched = dispatcher.dispatch(tokens, routing);  // [R, H]
  const at::Tensor out = dispatcher.combine(experts->forward(dispatched.expert_input, dispatched.rows_per_expert),
                                            dispatched);  // [N, H]
  // Load balancing over the global batch: token counts from every rank holding other tokens.
  at::Tensor global_counts = dispatched.slots_per_expert.to(x.device());  // [E]
  int64_t replicas_of_tokens = ctx_->mesh().comm(MeshAxis::kDpCp).size();
  if (ep.size() > 1 && fault::active(fault::Fault::kF25)) {
    // F25 (docs/fault-catalog.md): reduced over every data-parallel rank but the ep group's, so each ep
    // rank balances its own tokens' counts.
    ctx_->mesh().comm(MeshAxis::kEdp).all_reduce(global_counts, ReduceOp::kSum, "moe.expert_counts");
    ctx_->mesh().comm(MeshAxis::kDpReplicate).all_reduce(global_counts, ReduceOp::kSum, "moe.expert_counts");
  } else {
    ctx_->mesh().comm(MeshAxis::kDpCp).all_reduce(global_counts, ReduceOp::kSum, "moe.expert_counts");
  }
  if (ctx_->sequence_parallel()) {
    ctx_->tp_group().expect("moe.expert_counts",
                            global_counts.numel() * static_cast<int64_t>(global_counts.element_size()), "moe");
    ctx_->tp_group().all_reduce(global_counts, ReduceOp::kSum, "moe.expert_counts");
    replicas_of_tokens *= ctx_->tp_size();
  }
  // Routing statistics are shared state: published here, consumed by the balancing loss
  // (and read by the session and the state invariants).
  // Published once per forward: the activation-checkpoint recompute reads the forward's
  // value instead of publishing again (a second publication is finding MIH-SHARED-004).
  const std::string counts_key = name_ + ".expert_counts";
  // F13 (docs/fault-catalog.md): the guard missing, so the recompute publishes the statistics again.
  if (!in_recompute() || fault::active(fault::Fault::kF13)) ctx_->shared_state().publish(counts_key, global_counts, name_);
  const at::Tensor routed = ctx_->shared_state().consume(counts_key, name_);  // by its balancing loss
  const double global_tokens = static_cast<double>(n * replicas_of_tokens);
  // f_e: the fraction of the tokens with e among their top_k (summing to top_k over the
  // experts), as Mixtral's and Qwen2-MoE's load_balancing_loss_func count tokens_per_expert;
  // not the fraction of the token slots (Megatron's), which is top_k times smaller.
  at::Tensor fraction = routed.to(probs.scalar_type()) / global_tokens;  // f_e
  // F20 (docs/fault-catalog.md): this rank's share normalized by its own tokens, so the shares of the dp
  // ranks add up to dp times the loss (summed instead of averaged over dp).
  const double normalizer = fault::active(fault::Fault::kF20) ? static_cast<double>(n) : global_tokens;
  at::Tensor aux = o_.router_aux_loss_coef() * static_cast<double>(n_experts) * (fraction * probs.sum(0)).sum() / normalizer;
  if (!in_recompute()) {
    last_expert_counts = global_counts.cpu();
    last_aux_loss = aux.item<double>();
  }
  at::Tensor result = out.view_as(x);
  if (shared_expert) {
    // Qwen2-MoE's shared expert: every token, scaled by its sigmoid gate.
    const at::Tensor gate = at::sigmoid(at::matmul(x, ctx_->use(shared_expert_gate).t()));  // [B, S, 1]
    result = result + gate * shared_expert->forward(x);
  }
  // F42 (docs/fault-catalog.md): the balancing loss added to the loss at the model's end, as a
  // forward that sums its layers' aux terms into the returned loss does; under pp only the last
  // stage computes that loss, so the routers of every earlier stage never get its gradient.
  Communicator& pp = ctx_->mesh().comm(MeshAxis::kPp);
  if (pp.size() > 1 && pp.rank() != pp.size() - 1 && fault::active(fault::Fault::kF42)) return result;
  return AttachAuxLoss::apply(result, aux);
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(ParallelContext& ctx, const LlamaOptions& o, int64_t index)
    : ctx_(&ctx), o_(o) {
  input_layernorm = register_module("input_layernorm", RMSNorm(ctx, o.hidden_size(), o.rms_norm_eps()));
  if (o.attention() == "mla") {
    mla_attn = register_module("self_attn", MlaAttention(ctx, o));
  } else {
    self_attn = register_module("self_attn", LlamaAttention(ctx, o));
  }
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(ctx, o.hidden_size(), o.rms_norm_eps()));
  const auto& moe = o.moe_layers();
  if (std::find(moe.begin(), moe.end(), index) != moe.end()) {
    mlp = register_module("mlp", MoeMlp(ctx, o, "layers." + std::to_string(index) + ".mlp").ptr());
  } else {
    mlp = register_module("mlp", LlamaMlp(ctx, o).ptr());
  }
}

at::Tensor LlamaDecoderLayerImpl::mlp_forward(const at::Tensor& x) {
  if (auto* dense = dynamic_cast<LlamaMlpImpl*>(mlp.get())) return dense->forward(x);
  return static_cast<MoeMlpImpl*>(mlp.get())->forward(x);
}

at::Tensor LlamaDecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                          const at::Tensor& document_ids) {
  // The residual stream is replicated over tp, or sharded on the sequence under sequence
  // parallelism: the dropout masks and the activation probes follow.
  const ActivationLayout residual = ActivationLayout::residual(*ctx_);
  const at::Tensor attn_in = observed(*ctx_, o_, *input_layernorm, input_layernorm(x), residual);
  const at::Tensor attn = self_attn ? observed(*ctx_, o_, *self_attn, self_attn(attn_in, cos, sin, document_ids), residual)
                                    : observed(*ctx_, o_, *mla_attn, mla_attn(attn_in, cos, sin, document_ids), residual);
  at::Tensor h = x + ctx_->dropout(attn, o_.dropout(), is_training(), residual);
  const at::Tensor mlp_in = observed(*ctx_, o_, *post_attention_layernorm, post_attention_layernorm(h), residual);
  const at::Tensor mlp_out = observed(*ctx_, o_, *mlp, mlp_forward(mlp_in), residual);
  return observed(*ctx_, o_, *this, h + ctx_->dropout(mlp_out, o_.dropout(), is_training(), residual), residual);
}

LlamaForCausalLM::LlamaForCausalLM(ParallelContext& ctx, const LlamaOptions& o) : ctx_(&ctx), o_(o) {
  o.validate(ctx);
  // Under pp only this rank's stages are built; the modules of other stages are built under
  // skip_parameters(), which keeps the unsplit model's creation indices (its initial values).
  stages_ = ctx.pipeline_stages(o.num_layers());
  const bool first = stages_.front().first, last = stages_.back().last;
  {
    std::optional<ParallelContext::SkipParameters> skip;
    if (!first && !(last && o.tie_word_embeddings())) skip.emplace(ctx);
    auto built = VocabParallelEmbedding(ctx, o.vocab_size(), o.hidden_size(), o.init_std());
    if (!skip) embed_tokens = register_module("embed_tokens", built);
  }
  // F28 (docs/fault-catalog.md): the rotary table built with the usual default theta instead of the
  // config's, in every configuration alike.
  const double theta = fault::active(fault::Fault::kF28) ? 10000.0 : o.rope_theta();
  rotary_emb = register_module("rotary_emb", RotaryEmbedding(ctx, o.rotary_dim(), theta));
  layers = register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < o.num_layers(); ++i) {
    const bool mine = std::any_of(stages_.begin(), stages_.end(),
                                  [&](const PipelineStage& s) { return i >= s.first_layer && i < s.last_layer; });
    if (!mine) {
      auto skip = ctx.skip_parameters();
      LlamaDecoderLayer(ctx, o, i);
      continue;
    }
    auto layer = decoder_layers.emplace(i, LlamaDecoderLayer(ctx, o, i)).first->second;
    layers->register_module(std::to_string(i), layer);
  }
  std::optional<ParallelContext::SkipParameters> skip;
  if (!last) skip.emplace(ctx);
  // F01 (docs/fault-catalog.md): the final norm built without sequence parallelism in mind: its weight
  // gradient, partial over tp under SP, is never all-reduced.
  auto built_norm = RMSNorm(ctx, o.hidden_size(), o.rms_norm_eps(),
                            /*sequence_parallel_grad=*/!fault::active(fault::Fault::kF01));
  auto head = ColumnParallelLinearOptions(o.hidden_size(), o.vocab_size())
                  .bias(false)
                  .pad_to_tp(true)
                  .gather_output(!o.loss_parallel())
                  .init_std(o.init_std());
  // F16 (docs/fault-catalog.md): the head tied by value (its own parameter, a copy of the embedding's
  // values, as when tie_weights() runs before sharding replaces the parameters): the two drift
  // apart from the first step.
  const bool tie_by_value = o.tie_word_embeddings() && fault::active(fault::Fault::kF16);
  ColumnParallelLinear built_head{nullptr};
  if (!o.tie_word_embeddings() || tie_by_value) {
    built_head = ColumnParallelLinear(ctx, head);
  } else if (embed_tokens) {
    built_head = ColumnParallelLinear(ctx, head, embed_tokens->weight);
  }
  if (skip) return;  // not the last stage
  norm = register_module("norm", built_norm);
  lm_head = built_head;
  if (tie_by_value) {
    at::NoGradGuard no_grad;
    lm_head->weight.copy_(embed_tokens->weight);
  }
  register_module("lm_head", lm_head);
}

at::Tensor LlamaForCausalLM::embed(const Batch& batch) {
  return observed(*ctx_, o_, *embed_tokens, embed_tokens(batch.input_ids), ActivationLayout::residual(*ctx_));
}

at::Tensor LlamaForCausalLM::run_layers(at::Tensor x, const Batch& batch, int64_t first, int64_t last) {
  const at::Tensor docs = document_ids(batch);
  // The rotary table, once per forward, for the global positions of this rank's tokens:
  // shared state every layer consumes (outside its checkpoint region, which gets it as an
  // input: a recompute must see this forward's table, not a later one).
  SharedState& shared = ctx_->shared_state();
  {
    auto [cos, sin] = rotary_emb(rotary_positions(batch));
    shared.publish("rotary.cos", cos, "rotary_emb");
    shared.publish("rotary.sin", sin, "rotary_emb");
  }
  for (int64_t i = first; i < last; ++i) {
    const std::string name = "layers." + std::to_string(i);
    const at::Tensor cos = shared.consume("rotary.cos", name), sin = shared.consume("rotary.sin", name);
    auto layer = decoder_layers.at(i).ptr();
    // The document ids are a region input (not state of the model), so a recompute in the
    // backward of an earlier micro-batch sees that micro-batch's.
    std::vector<at::Tensor> inputs = {x, cos, sin};
    if (docs.defined()) inputs.push_back(docs);
    x = ctx_->fsdp_forward(name, [&] {
      return ctx_->checkpoint_region(
          name,
          [layer](const std::vector<at::Tensor>& in) {
            return layer->forward(in[0], in[1], in[2], in.size() > 3 ? in[3] : at::Tensor());
          },
          inputs, layer->parameters());
    });
  }
  return x;
}

at::Tensor LlamaForCausalLM::document_ids(const Batch& batch) const {
  if (!o_.document_mask()) return {};
  const auto it = batch.fields.find("document_ids");
  MIH_CHECK(it != batch.fields.end(), "llama: document_mask is set and the batch has no field 'document_ids'; emit it "
            "(TextPipelineOptions::document_ids) and declare it cp-replicated, or turn document_mask off");
  return it->second.to(ctx_->device());
}

at::Tensor LlamaForCausalLM::rotary_positions(const Batch& batch) const {
  const CpShard cp = ctx_->cp_shard();
  if (!fault::active(fault::Fault::kF38) || cp.size() == 1) return batch.position_ids;
  // F38 (docs/fault-catalog.md): under cp the positions counted on from this rank's first token through
  // its shard (its offset in the row), not read from position_ids: a document that starts
  // inside the shard does not restart at 0.
  const at::Tensor ids = cp.query_ids(batch.position_ids.size(1)).to(batch.position_ids.device());
  return batch.position_ids.narrow(1, 0, 1) + (ids - ids[0]).unsqueeze(0);
}

at::Tensor LlamaForCausalLM::head_logits(const at::Tensor& x) {
  const at::Tensor normed = observed(*ctx_, o_, *norm, norm(x), ActivationLayout::residual(*ctx_));
  // The logits: gathered over tp, or Shard(vocab) for the vocab-parallel loss (padded to tp).
  const ActivationLayout logits = o_.loss_parallel() ? ActivationLayout::column_parallel(o_.vocab_size())
                                                     : ActivationLayout::replicated();
  return observed(*ctx_, o_, *lm_head, lm_head(normed), logits);
}

at::Tensor LlamaForCausalLM::decode(const at::Tensor& embeddings, const Batch& batch) {
  MIH_CHECK(stages_.size() == 1 && stages_[0].first && stages_[0].last, "llama: decode() on pipeline stage ",
            stages_[0].stage, ", which holds part of the model; a pipelined run calls stage_forward");
  return head_logits(run_layers(embeddings, batch, 0, o_.num_layers()));
}

at::Tensor LlamaForCausalLM::stage_forward(int stage, const at::Tensor& input, const Batch& micro_batch) {
  auto s = std::find_if(stages_.begin(), stages_.end(), [&](const PipelineStage& st) { return st.stage == stage; });
  MIH_CHECK(s != stages_.end(), "llama: pipeline stage ", stage, " is not on this rank");
  at::Tensor x = run_layers(s->first ? embed(micro_batch) : input, micro_batch, s->first_layer, s->last_layer);
  return s->last ? losses(head_logits(x), micro_batch) : x;
}

at::Tensor LlamaForCausalLM::stage_input(int /*stage*/, const Batch& micro_batch) {
  const int64_t seq = micro_batch.input_ids.size(1) / (ctx_->sequence_parallel() ? ctx_->tp_size() : 1);
  return at::empty({micro_batch.input_ids.size(0), seq, o_.hidden_size()},
                   at::TensorOptions().dtype(ctx_->param_dtype()).device(ctx_->device()));
}

at::Tensor LlamaForCausalLM::logits(const Batch& batch) { return decode(embed(batch), batch); }

at::Tensor LlamaForCausalLM::losses(const at::Tensor& logits, const Batch& batch) {
  at::Tensor labels = batch.labels;  // shifted by the pipeline (labels[t] = input_ids[t + 1])
  if (fault::active(fault::Fault::kF06)) {
    // F06 (docs/fault-catalog.md): shifted again, as Hugging Face's causal-LM loss does for unshifted labels.
    labels = at::cat({labels.narrow(1, 1, labels.size(1) - 1), at::full({labels.size(0), 1}, -100, labels.options())}, 1);
  }
  if (!o_.loss_parallel()) {
    // Whole logits [B, S, V] on every tp rank: an ordinary cross entropy (0 where -100).
    at::Tensor log_probs = at::log_softmax(logits.reshape({-1, logits.size(-1)}), -1);
    return at::nll_loss(log_probs, labels.reshape(-1), {}, at::Reduction::None, -100).view_as(labels);
  }
  return vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}), labels.reshape(-1), ctx_->tp_group(),
                                      o_.vocab_size())
      .view_as(labels);
}

at::Tensor LlamaForCausalLM::token_losses(const Batch& batch) { return losses(logits(batch), batch); }

void LlamaForCausalLM::apply_fsdp(ParallelContext& ctx) {
  for (auto& [i, layer] : decoder_layers) {
    // Under ep the routed experts are a unit of their own (sharded over edp), before their
    // layer's (TorchTitan shards transformer_block.moe.experts first).
    auto* moe = dynamic_cast<MoeMlpImpl*>(layer->mlp.get());
    if (moe && ctx.config().ep > 1 && ctx.mesh().comm(MeshAxis::kEdp).size() > 1) {
      ctx.fully_shard(*moe->experts, "layers." + std::to_string(i) + ".mlp.experts");
    }
    ctx.fully_shard(*layer, "layers." + std::to_string(i));
  }
  if (o_.fsdp_root()) ctx.fully_shard(*this, "root");
}

std::vector<MoeMlpImpl*> LlamaForCausalLM::moe_mlps() const {
  std::vector<MoeMlpImpl*> out;
  for (const auto& [i, layer] : decoder_layers) {
    if (auto* moe = dynamic_cast<MoeMlpImpl*>(layer->mlp.get())) out.push_back(moe);
  }
  return out;
}

ModelFactory make_llama(LlamaOptions o) {
  return [o](ParallelContext& ctx) { return std::make_shared<LlamaForCausalLM>(ctx, o); };
}

ModelFactory make_moe(LlamaOptions o) {
  if (o.moe_layers().empty()) {
    std::vector<int64_t> every_second;
    for (int64_t l = 1; l < o.num_layers(); l += 2) every_second.push_back(l);
    o.moe_layers(every_second);
  }
  MIH_CHECK(!o.moe_layers().empty(), "moe: no layer has a mixture-of-experts MLP (num_layers = ", o.num_layers(),
            "); set moe_layers or use at least 2 layers");
  return make_llama(o);
}

}  // namespace mih::models
