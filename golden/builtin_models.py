# The builtin implementations of the golden producer (`--impl builtin`): Llama, Qwen3 (per-head
# q/k RMSNorm before rotary, head_dim apart from hidden / heads), a sparse mixture of experts in
# the Mixtral, Qwen2-MoE and Qwen3-MoE styles (top-k softmax router, optional renormalization,
# optional shared expert behind a sigmoid gate, the Switch-Transformer load-balancing loss), and
# GPT-2, written in plain PyTorch from the architectures' published equations as Hugging Face
# transformers states them (models/{llama,qwen3,mixtral,qwen2_moe,qwen3_moe,gpt2}/
# modeling_*.py, configuration_*.py for the defaults), never from mih's C++ ports. Everything
# is computed in the weights' dtype (float64 for a golden); nothing is cast to float32.
#
# A model is a function of a dict of weights under the checkpoint's own (external) keys, so the
# gradients come out under those keys. Every weight the architecture reads must be there with
# its shape, and every weight of the checkpoint must be read: a key map that renames, drops or
# reshapes a tensor is an error naming the key, never a silently random weight.
#
# `Ops(twin=True)` is the noise twin: every contraction (a linear's forward over the input
# features, its input gradient over the output features, its weight gradient over the tokens;
# attention's two matmuls; the norms' means) summed in two halves. Mathematically the same
# model, rounded differently: the difference between the two runs is the golden's own
# reduction-order noise, from which mih calibrates its tolerances (mih's float32 and bfloat16
# lanes do the same with their noise twin).
import math

import torch
import torch.nn.functional as F

from errors import GoldenError

# Hugging Face's defaults of the config fields each architecture reads (configuration_*.py):
# what the original computes with when config.json leaves a field out.
DEFAULTS = {
    "llama": {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
        "attention_dropout": 0.0, "mlp_bias": False, "tie_word_embeddings": False, "pretraining_tp": 1,
    },
    "mixtral": {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "rope_theta": 1e6, "rope_scaling": None, "attention_dropout": 0.0,
        "tie_word_embeddings": False, "num_local_experts": 8, "num_experts_per_tok": 2,
        "output_router_logits": False, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
        "sliding_window": None,
    },
    "mistral": {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None, "attention_dropout": 0.0,
        "tie_word_embeddings": False, "sliding_window": 4096,
    },
    "qwen3": {
        "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
        "attention_dropout": 0.0, "tie_word_embeddings": False, "use_sliding_window": False,
    },
    "qwen3_moe": {
        "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": None, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
        "attention_dropout": 0.0, "tie_word_embeddings": False, "use_sliding_window": False,
        "decoder_sparse_step": 1, "moe_intermediate_size": 768, "num_experts_per_tok": 8, "num_experts": 128,
        "norm_topk_prob": False, "output_router_logits": False, "router_aux_loss_coef": 0.001, "mlp_only_layers": [],
    },
    "qwen2_moe": {
        "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
        "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": None, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None, "attention_dropout": 0.0,
        "tie_word_embeddings": False, "use_sliding_window": False, "decoder_sparse_step": 1,
        "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4,
        "num_experts": 60, "norm_topk_prob": False, "output_router_logits": False,
        "router_aux_loss_coef": 0.001, "mlp_only_layers": [], "qkv_bias": True,
    },
    "gpt2": {
        "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
        "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
        "layer_norm_epsilon": 1e-5, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "tie_word_embeddings": True, "add_cross_attention": False,
    },
    "llava": {
        "image_token_index": 32000, "projector_hidden_act": "gelu", "multimodal_projector_bias": True,
        "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "tie_word_embeddings": True,
        "text_config": None, "vision_config": None,
    },
    "clip_vision_model": {
        "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
        "num_channels": 3, "image_size": 224, "patch_size": 32, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
        "attention_dropout": 0.0,
    },
}

# Tensors a checkpoint may hold that are buffers, not weights (older exports).
_BUFFERS = (".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")


class Config:
    """config.json with the architecture's defaults; records which fields were defaulted."""

    def __init__(self, raw):
        self.raw = raw
        self.model_type = raw.get("model_type")
        if self.model_type not in DEFAULTS:
            raise GoldenError(11, "config.json: model_type %r has no builtin implementation; the builtin ones are "
                                  "%s (use --impl transformers for another architecture)"
                              % (self.model_type, ", ".join(sorted(DEFAULTS))))
        self.defaulted = {}

    def __getitem__(self, name):
        if name in self.raw and self.raw[name] is not None:
            return self.raw[name]
        value = DEFAULTS[self.model_type][name]
        if name not in self.raw:
            self.defaulted[name] = value
        return value


class Weights:
    """The checkpoint's tensors as leaves with gradients; take() marks what the model read."""

    def __init__(self, tensors, frozen=()):
        self.tensors = {}
        for k, t in tensors.items():
            if k.endswith(_BUFFERS):
                continue
            self.tensors[k] = t.detach().clone().requires_grad_(k not in frozen)
        self.used = set()

    def take(self, key, shape):
        t = self.tensors.get(key)
        if t is None:
            raise GoldenError(11, "the checkpoint has no '%s' (%s expected): the key map did not write it, or the "
                                  "config declares a feature the port does not have" % (key, list(shape)))
        if list(t.shape) != list(shape):
            hint = " (likely transposed)" if list(t.shape) == list(shape)[::-1] and len(shape) == 2 else ""
            raise GoldenError(11, "checkpoint tensor '%s' has shape %s, the architecture reads %s%s"
                              % (key, list(t.shape), list(shape), hint))
        self.used.add(key)
        return t

    def check_all_used(self):
        unused = sorted(set(self.tensors) - self.used)
        if unused:
            raise GoldenError(11, "the checkpoint holds %d tensor(s) the architecture does not read: %s; the key map "
                                  "writes a name the original does not have (or the config leaves out a feature)"
                              % (len(unused), ", ".join(unused[:8]) + (", ..." if len(unused) > 8 else "")))


class _SplitLinear(torch.autograd.Function):
    """y = x w^T (+ nothing), every contraction summed in two halves (the noise twin)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        h = w.shape[1] // 2
        return torch.matmul(x[..., :h], w[:, :h].t()) + torch.matmul(x[..., h:], w[:, h:].t())

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        o = w.shape[0] // 2
        gx = torch.matmul(g[..., :o], w[:o]) + torch.matmul(g[..., o:], w[o:])
        x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
        n = x2.shape[0] // 2
        gw = torch.matmul(g2[:n].t(), x2[:n]) + torch.matmul(g2[n:].t(), x2[n:])
        return gx, gw


class Ops:
    """The reductions of the models: plain, or summed in two halves (the noise twin)."""

    def __init__(self, twin=False):
        self.twin = twin

    def linear(self, x, w, b=None):
        y = _SplitLinear.apply(x, w) if self.twin else F.linear(x, w)
        return y if b is None else y + b

    def matmul(self, a, b):
        """a [..., n, k] @ b [..., k, m]."""
        if not self.twin:
            return torch.matmul(a, b)
        h = a.shape[-1] // 2
        return torch.matmul(a[..., :h], b[..., :h, :]) + torch.matmul(a[..., h:], b[..., h:, :])

    def mean_last(self, x):
        if not self.twin:
            return x.mean(-1, keepdim=True)
        h = x.shape[-1] // 2
        return (x[..., :h].sum(-1, keepdim=True) + x[..., h:].sum(-1, keepdim=True)) / x.shape[-1]


def activation(name):
    """ACT2FN of transformers/activations.py for the names these architectures use."""
    if name in ("silu", "swish"):
        return F.silu
    if name == "gelu":  # the exact GELU, x * Phi(x) with the error function
        return lambda x: F.gelu(x)
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (Hendrycks and Gimpel 2016)
        return lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    if name == "quick_gelu":  # CLIP's: x * sigmoid(1.702 x)
        return lambda x: x * torch.sigmoid(1.702 * x)
    if name == "relu":
        return F.relu
    raise GoldenError(11, "activation %r has no builtin implementation (silu, gelu, gelu_new, gelu_pytorch_tanh, "
                          "gelu_fast, quick_gelu, relu)" % name)


def _no_dropout(cfg, *names):
    for n in names:
        if cfg[n]:
            raise GoldenError(11, "config.json: %s = %s (the original trains with dropout there); a golden is one "
                                  "deterministic forward and backward: export a config with %s 0" % (n, cfg[n], n))


def _rms_norm(ops, x, w, eps):
    # LlamaRMSNorm: w * x / sqrt(mean(x^2) + eps) (Zhang and Sennrich 2019), w initialized to 1.
    return w * (x * torch.rsqrt(ops.mean_last(x * x) + eps))


def _causal_mask(batch, dtype, window=None):
    """Additive [B, 1, S, S] mask: 0 where query t may attend key j (j <= t, the key not
    padding by attention_mask and, when the batch has document_ids, in t's own document: the
    block-causal mask of packed documents, as transformers' packed-sequence mask; with a
    sliding `window`, t - window < j: Mistral's sliding_window), the dtype's lowest value
    elsewhere (as Hugging Face adds it)."""
    ids = batch["input_ids"]
    b, s = ids.shape
    keep = torch.ones(s, s, dtype=torch.bool).tril().expand(b, 1, s, s)
    mask = batch.get("attention_mask")
    if mask is not None:
        keep = keep & mask.bool()[:, None, None, :]
    documents = batch.get("document_ids")
    if documents is not None:
        keep = keep & (documents[:, None, :, None] == documents[:, None, None, :])
    if window is not None:
        t = torch.arange(s)
        keep = keep & (t[None, :] > t[:, None] - window)
    low = torch.finfo(dtype).min
    return torch.zeros(b, 1, s, s, dtype=dtype).masked_fill(~keep, low)


def _attention(ops, q, k, v, mask, scale):
    """softmax(q k^T * scale + mask) v over heads; k, v repeated to q's heads (GQA: key/value
    head j serves query heads j * g ... (j + 1) * g - 1, transformers' repeat_kv)."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    scores = ops.matmul(q, k.transpose(-1, -2)) * scale + mask
    return ops.matmul(torch.softmax(scores, dim=-1), v)


def _rotary(cfg, head_dim, positions, dtype):
    """cos, sin [B, 1, S, D] of rotary position embeddings (Su et al. 2021) in Hugging Face's
    half-split layout: inv_freq_i = theta^(-2i / D), angles duplicated over the two halves."""
    if cfg["rope_scaling"] not in (None, {}) and (cfg["rope_scaling"] or {}).get("rope_type", "default") != "default":
        raise GoldenError(11, "config.json: rope_scaling %r has no builtin implementation (only unscaled rotary "
                              "embeddings)" % (cfg["rope_scaling"],))
    theta = float(cfg["rope_theta"])
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=dtype) / head_dim)
    angles = positions.to(dtype)[..., None] * inv_freq  # [B, S, D/2]
    full = torch.cat([angles, angles], dim=-1)[:, None]
    return full.cos(), full.sin()


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _swiglu(ops, x, gate, up, down, act):
    # down(act(gate x) * up x) (Shazeer 2020)
    return ops.linear(act(ops.linear(x, gate)) * ops.linear(x, up), down)


def _sparse_moe(ops, cfg, W, prefix, x, act, style):
    """A sparse mixture-of-experts MLP on tokens x [N, H]: router logits r = x G^T, p =
    softmax(r); each token goes to its top-k experts by p, weighted by their p (renormalized
    over the k when the architecture says: always in Mixtral, norm_topk_prob in Qwen2-MoE and
    Qwen3-MoE); Qwen2-MoE adds a shared expert scaled by sigmoid(x g^T). Returns (y [N, H], r [N, E])."""
    hidden = x.shape[-1]
    if style == "mixtral":
        experts, k, width = cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["intermediate_size"]
        renormalize = True
        gate_key = prefix + "block_sparse_moe.gate.weight"
        expert_keys = lambda e: [prefix + "block_sparse_moe.experts.%d.%s.weight" % (e, w) for w in ("w1", "w3", "w2")]
        if cfg["router_jitter_noise"]:
            raise GoldenError(11, "config.json: router_jitter_noise = %s multiplies the router's input by noise in "
                                  "training; a golden needs 0" % cfg["router_jitter_noise"])
    else:
        experts, k, width = cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
        renormalize = bool(cfg["norm_topk_prob"])
        gate_key = prefix + "mlp.gate.weight"
        expert_keys = lambda e: [prefix + "mlp.experts.%d.%s.weight" % (e, w) for w in ("gate_proj", "up_proj", "down_proj")]
    router = W.take(gate_key, [experts, hidden])
    logits = ops.linear(x, router)
    probs = torch.softmax(logits, dim=-1)
    top_p, top_i = probs.topk(k, dim=-1)  # [N, k]
    if renormalize:
        top_p = top_p / top_p.sum(-1, keepdim=True)
    y = torch.zeros_like(x)
    for e in range(experts):
        g, u, d = expert_keys(e)
        gate, up, down = W.take(g, [width, hidden]), W.take(u, [width, hidden]), W.take(d, [hidden, width])
        token, slot = torch.where(top_i == e)
        if token.numel() == 0:
            continue
        out = _swiglu(ops, x[token], gate, up, down, act) * top_p[token, slot, None]
        y = y.index_add(0, token, out)
    if style == "qwen2_moe" and cfg["shared_expert_intermediate_size"]:  # Qwen3-MoE has no shared expert
        s = cfg["shared_expert_intermediate_size"]
        p = prefix + "mlp.shared_expert."
        shared = _swiglu(ops, x, W.take(p + "gate_proj.weight", [s, hidden]), W.take(p + "up_proj.weight", [s, hidden]),
                         W.take(p + "down_proj.weight", [hidden, s]), act)
        y = y + torch.sigmoid(ops.linear(x, W.take(prefix + "mlp.shared_expert_gate.weight", [1, hidden]))) * shared
    return y, logits


def load_balancing_loss(router_logits, experts, k, attention_mask):
    """The Switch-Transformer auxiliary loss (Fedus et al. 2021, eqs. 4-6) as Mixtral and
    Qwen2-MoE compute it over every sparse layer's router logits concatenated: E * sum_e f_e
    P_e, f_e the fraction of tokens with e among their top-k (summing to k over the experts),
    P_e the mean router probability of e; padding tokens (attention_mask 0) left out."""
    logits = torch.cat(router_logits, dim=0)
    probs = torch.softmax(logits, dim=-1)
    _, chosen = probs.topk(k, dim=-1)
    mask = F.one_hot(chosen, experts).to(probs.dtype)  # [T, k, E]
    if attention_mask is None:
        tokens_per_expert = mask.mean(0)
        prob_per_expert = probs.mean(0)
    else:
        layers = logits.shape[0] // attention_mask.numel()
        m = attention_mask.reshape(-1).to(probs.dtype).repeat(layers)  # [T]
        tokens_per_expert = (mask * m[:, None, None]).sum(0) / m.sum()
        prob_per_expert = (probs * m[:, None]).sum(0) / m.sum()
    return (tokens_per_expert * prob_per_expert[None]).sum() * experts


def _decoder(cfg, W, batch, ops, prefix="", merge=None):
    """Llama, Qwen3, Mixtral, Qwen2-MoE and Qwen3-MoE: pre-norm decoder layers h = x +
    attn(norm(x)), out = h + mlp(norm(h)) over rotary grouped-query attention (Qwen3's q and k
    each RMS-normalized per head before rotary), a final RMSNorm and the head. `prefix` comes
    before every key (a language model inside another model: "language_model."); `merge`, when
    given, maps the token embeddings [B, S, H] to the decoder's input (a vision-language model's
    image features in place of its placeholder tokens)."""
    mt = cfg.model_type
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg["num_key_value_heads"] or heads
    head_dim = cfg["head_dim"] or hidden // heads
    eps, act = cfg["rms_norm_eps"], activation(cfg["hidden_act"])
    _no_dropout(cfg, "attention_dropout")
    if mt == "llama" and cfg["pretraining_tp"] != 1:
        raise GoldenError(11, "config.json: pretraining_tp = %s has no builtin implementation" % cfg["pretraining_tp"])
    if mt == "mixtral" and cfg["sliding_window"] is not None and cfg["sliding_window"] < batch["input_ids"].shape[1]:
        raise GoldenError(11, "config.json: sliding_window %s is shorter than the batch's sequence; the builtin "
                              "attends to every earlier token" % cfg["sliding_window"])
    if mt in ("qwen2_moe", "qwen3", "qwen3_moe") and cfg["use_sliding_window"]:
        raise GoldenError(11, "config.json: use_sliding_window has no builtin implementation")
    qk_norm = mt in ("qwen3", "qwen3_moe")
    o_bias = cfg["attention_bias"] if mt in ("llama", "qwen3", "qwen3_moe") else False
    qkv_bias = cfg["qkv_bias"] if mt == "qwen2_moe" else o_bias
    mlp_bias = cfg["mlp_bias"] if mt == "llama" else False
    vocab = cfg["vocab_size"]
    ids = batch["input_ids"]
    dtype = W.tensors[prefix + "model.embed_tokens.weight"].dtype if prefix + "model.embed_tokens.weight" in W.tensors \
        else torch.float64
    embed = W.take(prefix + "model.embed_tokens.weight", [vocab, hidden])
    x = F.embedding(ids, embed)
    if merge is not None:
        x = merge(x)
    positions = batch["position_ids"]
    cos, sin = _rotary(cfg, head_dim, positions, dtype)
    mask = _causal_mask(batch, dtype, cfg["sliding_window"] if mt == "mistral" else None)
    b, s = ids.shape
    hidden_states = [x]
    router_logits = []
    for i in range(layers):
        p = prefix + "model.layers.%d." % i

        def bias(name, n, on):
            return W.take(p + name, [n]) if on else None

        h = _rms_norm(ops, x, W.take(p + "input_layernorm.weight", [hidden]), eps)
        q = ops.linear(h, W.take(p + "self_attn.q_proj.weight", [heads * head_dim, hidden]),
                       bias("self_attn.q_proj.bias", heads * head_dim, qkv_bias))
        k = ops.linear(h, W.take(p + "self_attn.k_proj.weight", [kv_heads * head_dim, hidden]),
                       bias("self_attn.k_proj.bias", kv_heads * head_dim, qkv_bias))
        v = ops.linear(h, W.take(p + "self_attn.v_proj.weight", [kv_heads * head_dim, hidden]),
                       bias("self_attn.v_proj.bias", kv_heads * head_dim, qkv_bias))
        q, k = q.view(b, s, heads, head_dim), k.view(b, s, kv_heads, head_dim)
        if qk_norm:  # Qwen3Attention: q_norm and k_norm over each head's head_dim, then rotary
            q = _rms_norm(ops, q, W.take(p + "self_attn.q_norm.weight", [head_dim]), eps)
            k = _rms_norm(ops, k, W.take(p + "self_attn.k_norm.weight", [head_dim]), eps)
        q = _rotate(q.transpose(1, 2), cos, sin)
        k = _rotate(k.transpose(1, 2), cos, sin)
        v = v.view(b, s, kv_heads, head_dim).transpose(1, 2)
        ctx = _attention(ops, q, k, v, mask, head_dim ** -0.5).transpose(1, 2).reshape(b, s, heads * head_dim)
        x = x + ops.linear(ctx, W.take(p + "self_attn.o_proj.weight", [hidden, heads * head_dim]),
                           bias("self_attn.o_proj.bias", hidden, o_bias))
        h = _rms_norm(ops, x, W.take(p + "post_attention_layernorm.weight", [hidden]), eps)
        if mt == "mixtral":
            sparse = True
        elif mt in ("qwen2_moe", "qwen3_moe"):
            sparse = i not in cfg["mlp_only_layers"] and cfg["num_experts"] > 0 and (i + 1) % cfg["decoder_sparse_step"] == 0
        else:
            sparse = False
        if sparse:
            y, r = _sparse_moe(ops, cfg, W, p, h.reshape(-1, hidden), act, mt)
            router_logits.append(r)
            x = x + y.view(b, s, hidden)
        else:
            width = cfg["intermediate_size"]
            mb = lambda name, n: W.take(p + name, [n]) if mlp_bias else None
            gate = ops.linear(h, W.take(p + "mlp.gate_proj.weight", [width, hidden]), mb("mlp.gate_proj.bias", width))
            up = ops.linear(h, W.take(p + "mlp.up_proj.weight", [width, hidden]), mb("mlp.up_proj.bias", width))
            x = x + ops.linear(act(gate) * up, W.take(p + "mlp.down_proj.weight", [hidden, width]),
                               mb("mlp.down_proj.bias", hidden))
        hidden_states.append(x)
    normed = _rms_norm(ops, x, W.take(prefix + "model.norm.weight", [hidden]), eps)
    hidden_states.append(normed)
    head = embed if cfg["tie_word_embeddings"] else W.take(prefix + "lm_head.weight", [vocab, hidden])
    if cfg["tie_word_embeddings"] and prefix + "lm_head.weight" in W.tensors:
        W.used.add(prefix + "lm_head.weight")  # a tied head's copy: Hugging Face ties it to the embedding, ignores it
    logits = ops.linear(normed, head)
    aux = None
    if mt in ("mixtral", "qwen2_moe", "qwen3_moe") and cfg["output_router_logits"] and router_logits:
        experts = cfg["num_local_experts"] if mt == "mixtral" else cfg["num_experts"]
        aux = cfg["router_aux_loss_coef"] * load_balancing_loss(router_logits, experts, cfg["num_experts_per_tok"],
                                                                batch.get("attention_mask"))
    return logits, hidden_states, aux


def _layer_norm(ops, x, w, b, eps):
    # (x - mean) / sqrt(var + eps) * w + b, the biased variance (Ba et al. 2016).
    mu = ops.mean_last(x)
    centered = x - mu
    return centered * torch.rsqrt(ops.mean_last(centered * centered) + eps) * w + b


def _gpt2(cfg, W, batch, ops):
    """GPT-2 (Radford et al. 2019): learned positions, pre-norm blocks h = x + attn(ln_1(x)),
    out = h + mlp(ln_2(h)), Conv1D weights [in, out] (y = x W + b), ln_f and the head."""
    if cfg["add_cross_attention"]:
        raise GoldenError(11, "config.json: add_cross_attention has no builtin implementation")
    _no_dropout(cfg, "resid_pdrop", "embd_pdrop", "attn_pdrop")
    hidden, layers, heads = cfg["n_embd"], cfg["n_layer"], cfg["n_head"]
    inner = cfg["n_inner"] or 4 * hidden
    head_dim = hidden // heads
    eps, act, vocab = cfg["layer_norm_epsilon"], activation(cfg["activation_function"]), cfg["vocab_size"]
    ids = batch["input_ids"]
    b, s = ids.shape
    wte = W.take("transformer.wte.weight", [vocab, hidden])
    dtype = wte.dtype
    wpe = W.take("transformer.wpe.weight", [cfg["n_positions"], hidden])
    x = F.embedding(ids, wte) + F.embedding(batch["position_ids"], wpe)
    mask = _causal_mask(batch, dtype)

    def conv1d(t, name, n_in, n_out):
        # Conv1D: x W + b with W [in, out]: the linear of W^T.
        return ops.linear(t, W.take(name + ".weight", [n_in, n_out]).t(), W.take(name + ".bias", [n_out]))

    hidden_states = [x]
    for i in range(layers):
        p = "transformer.h.%d." % i
        h = _layer_norm(ops, x, W.take(p + "ln_1.weight", [hidden]), W.take(p + "ln_1.bias", [hidden]), eps)
        q, k, v = conv1d(h, p + "attn.c_attn", hidden, 3 * hidden).split(hidden, dim=-1)
        split = lambda t: t.view(b, s, heads, head_dim).transpose(1, 2)
        scale = head_dim ** -0.5 if cfg["scale_attn_weights"] else 1.0
        if cfg["scale_attn_by_inverse_layer_idx"]:
            scale /= float(i + 1)
        ctx = _attention(ops, split(q), split(k), split(v), mask, scale).transpose(1, 2).reshape(b, s, hidden)
        x = x + conv1d(ctx, p + "attn.c_proj", hidden, hidden)
        h = _layer_norm(ops, x, W.take(p + "ln_2.weight", [hidden]), W.take(p + "ln_2.bias", [hidden]), eps)
        x = x + conv1d(act(conv1d(h, p + "mlp.c_fc", hidden, inner)), p + "mlp.c_proj", inner, hidden)
        hidden_states.append(x)
    normed = _layer_norm(ops, x, W.take("transformer.ln_f.weight", [hidden]), W.take("transformer.ln_f.bias", [hidden]), eps)
    hidden_states.append(normed)
    head = wte if cfg["tie_word_embeddings"] else W.take("lm_head.weight", [vocab, hidden])
    if cfg["tie_word_embeddings"] and "lm_head.weight" in W.tensors:
        W.used.add("lm_head.weight")  # a tied head's copy: Hugging Face ties it to wte and ignores it
    return ops.linear(normed, head), hidden_states, None


def forward(cfg, W, batch, ops):
    """(logits [B, S, V], hidden states: L + 2 tensors [B, S, H] (the embeddings, each decoder
    layer's output, the final norm's output), the router's weighted aux loss or None)."""
    if "position_ids" not in batch:
        s = batch["input_ids"].shape[1]
        batch = dict(batch, position_ids=torch.arange(s).expand_as(batch["input_ids"]))
    if cfg.model_type == "llava":
        import builtin_llava

        model = builtin_llava.llava
    elif cfg.model_type == "deepseek_v3":
        model = builtin_mla.deepseek_v3
    else:
        model = _gpt2 if cfg.model_type == "gpt2" else _decoder
    out = model(cfg, W, batch, ops)
    W.check_all_used()
    return out


# DeepSeek-V3 with dense layers (multi-head latent attention): builtin_mla.py, which uses this
# module's pieces.
import builtin_mla  # noqa: E402

DEFAULTS["deepseek_v3"] = builtin_mla.DEFAULTS
