# The builtin DeepSeek-V3 of the golden producer with dense MLPs only: pre-norm decoder layers
# over multi-head latent attention (DeepSeek-V2, DeepSeek-AI 2024, section 2.1), as Hugging Face
# transformers states it (models/deepseek_v3/modeling_deepseek_v3.py: DeepseekV3Attention,
# DeepseekV3MLP, DeepseekV3RMSNorm; configuration_deepseek_v3.py for the defaults), never from
# mih's C++ port. Keys are DeepseekV3ForCausalLM's (model.layers.<i>.self_attn.q_a_proj.weight,
# ...). What the builtin refuses (exit 11): MoE layers (first_k_dense_replace below the layer
# count), the interleaved rotary (rope_interleave true), rope scaling, attention biases.
import torch
import torch.nn.functional as F

import builtin_models as bm
from errors import GoldenError

# DeepseekV3Config's defaults of the fields the builtin reads.
DEFAULTS = {
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "first_k_dense_replace": 3,
    "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None, "rope_interleave": True,
    "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
}
# DeepseekV3RMSNorm's default eps: q_a_layernorm and kv_a_layernorm are built without the config's.
_LOW_RANK_NORM_EPS = 1e-6


def _refuse_unsupported(cfg):
    if cfg["first_k_dense_replace"] < cfg["num_hidden_layers"]:
        raise GoldenError(11, "config.json: first_k_dense_replace %s < num_hidden_layers %s: layers from %s on are "
                              "DeepseekV3MoE, which the builtin does not implement (it takes dense layers only)"
                          % (cfg["first_k_dense_replace"], cfg["num_hidden_layers"], cfg["first_k_dense_replace"]))
    if cfg["rope_interleave"]:
        raise GoldenError(11, "config.json: rope_interleave true (rotary on interleaved pairs) has no builtin "
                              "implementation; the builtin rotates halves (rope_interleave false)")
    if cfg["attention_bias"]:
        raise GoldenError(11, "config.json: attention_bias true has no builtin implementation for deepseek_v3")
    if cfg["num_key_value_heads"] != cfg["num_attention_heads"]:
        raise GoldenError(11, "config.json: num_key_value_heads %s != num_attention_heads %s: transformers would "
                              "repeat MLA's keys over groups; the builtin takes them equal"
                          % (cfg["num_key_value_heads"], cfg["num_attention_heads"]))
    bm._no_dropout(cfg, "attention_dropout")


def mla_attention(cfg, W, ops, h, p, cos, sin, mask):
    """Multi-head latent attention of layer prefix `p` on h [B, S, H]: q = q_b(norm(q_a(h)))
    per head [q_nope Dn | q_rot Dr] (or q_proj(h) without q_lora_rank); [c_kv | k_rot] =
    kv_a_proj_with_mqa(h); per head [k_nope Dn | v Dv] = kv_b(norm(c_kv)); k_rot one head for
    all; rotary (halves) on q_rot and k_rot; softmax(q k^T / sqrt(Dn + Dr) + mask) v, o_proj.
    cos, sin [B, 1, S, Dr]; mask [B, 1, S, S] additive. Returns [B, S, H]."""
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    rq, rkv, dqk = cfg["q_lora_rank"], cfg["kv_lora_rank"], dn + dr
    b, s, _ = h.shape
    a = p + "self_attn."
    if rq is None:
        q = ops.linear(h, W.take(a + "q_proj.weight", [heads * dqk, hidden]))
    else:
        c_q = bm._rms_norm(ops, ops.linear(h, W.take(a + "q_a_proj.weight", [rq, hidden])),
                           W.take(a + "q_a_layernorm.weight", [rq]), _LOW_RANK_NORM_EPS)
        q = ops.linear(c_q, W.take(a + "q_b_proj.weight", [heads * dqk, rq]))
    q = q.view(b, s, heads, dqk).transpose(1, 2)
    compressed = ops.linear(h, W.take(a + "kv_a_proj_with_mqa.weight", [rkv + dr, hidden]))
    c_kv, k_rot = compressed[..., :rkv], compressed[..., rkv:]
    kv = ops.linear(bm._rms_norm(ops, c_kv, W.take(a + "kv_a_layernorm.weight", [rkv]), _LOW_RANK_NORM_EPS),
                    W.take(a + "kv_b_proj.weight", [heads * (dn + dv), rkv]))
    kv = kv.view(b, s, heads, dn + dv).transpose(1, 2)
    k_rot = bm._rotate(k_rot.view(b, 1, s, dr), cos, sin).expand(b, heads, s, dr)
    q = torch.cat([q[..., :dn], bm._rotate(q[..., dn:], cos, sin)], dim=-1)
    k = torch.cat([kv[..., :dn], k_rot], dim=-1)
    ctx = bm._attention(ops, q, k, kv[..., dn:], mask, dqk ** -0.5).transpose(1, 2).reshape(b, s, heads * dv)
    return ops.linear(ctx, W.take(a + "o_proj.weight", [hidden, heads * dv]))


def deepseek_v3(cfg, W, batch, ops):
    """DeepseekV3ForCausalLM with every layer dense: (logits, hidden states, None) as
    builtin_models.forward returns them."""
    _refuse_unsupported(cfg)
    hidden, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    eps, act, width = cfg["rms_norm_eps"], bm.activation(cfg["hidden_act"]), cfg["intermediate_size"]
    embed = W.take("model.embed_tokens.weight", [vocab, hidden])
    x = F.embedding(batch["input_ids"], embed)
    cos, sin = bm._rotary(cfg, cfg["qk_rope_head_dim"], batch["position_ids"], embed.dtype)
    mask = bm._causal_mask(batch, embed.dtype)
    hidden_states = [x]
    for i in range(layers):
        p = "model.layers.%d." % i
        h = bm._rms_norm(ops, x, W.take(p + "input_layernorm.weight", [hidden]), eps)
        x = x + mla_attention(cfg, W, ops, h, p, cos, sin, mask)
        h = bm._rms_norm(ops, x, W.take(p + "post_attention_layernorm.weight", [hidden]), eps)
        x = x + bm._swiglu(ops, h, W.take(p + "mlp.gate_proj.weight", [width, hidden]),
                           W.take(p + "mlp.up_proj.weight", [width, hidden]),
                           W.take(p + "mlp.down_proj.weight", [hidden, width]), act)
        hidden_states.append(x)
    normed = bm._rms_norm(ops, x, W.take("model.norm.weight", [hidden]), eps)
    hidden_states.append(normed)
    head = embed if cfg["tie_word_embeddings"] else W.take("lm_head.weight", [vocab, hidden])
    if cfg["tie_word_embeddings"] and "lm_head.weight" in W.tensors:
        W.used.add("lm_head.weight")
    return ops.linear(normed, head), hidden_states, None
