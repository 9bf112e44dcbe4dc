# A golden plug-in as a porter writes one (docs/golden.md, "Three ways to get a golden"): the
# original of "mytoy", an architecture mih ships no builtin for (here: the equations of a
# Llama-style decoder under MyToyForCausalLM's keys, which are LlamaForCausalLM's), written on
# the public mih_golden_api alone. tests/scaffold/run.cmake builds the llama scaffold renamed to
# model_type "mytoy" with it (mih_add_golden ... PRODUCER), and plants a wrong equation in a
# copy (PERTURB below) that MatchesOriginal must fail.
import mih_golden_api as api

NAME = "mytoy"
VERSION = "0.1"
# The original's defaults of the fields it reads, where config.json leaves one out.
DEFAULTS = {"rope_theta": 10000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
            "num_key_value_heads": None, "head_dim": None}
PERTURB = False  # run.cmake's perturbed copy sets it: the rotary table at theta 10000, not the config's


def forward(config, weights, batch, ops):
    hidden, heads, layers = config["hidden_size"], config["num_attention_heads"], config["num_hidden_layers"]
    kv_heads = config["num_key_value_heads"] or heads
    d = config["head_dim"] or hidden // heads
    vocab, width, eps = config["vocab_size"], config["intermediate_size"], config["rms_norm_eps"]
    ids = batch["input_ids"]
    b, s = ids.shape
    embed = weights.take("model.embed_tokens.weight", [vocab, hidden])
    x = api.embedding(ids, embed)
    theta = 10000.0 if PERTURB else config["rope_theta"]
    cos, sin = api.rotary(d, batch["position_ids"], theta, x.dtype)
    mask = api.causal_mask(batch, x.dtype)
    states = [x]
    for i in range(layers):
        p = "model.layers.%d." % i
        w = lambda name, shape: weights.take(p + name, shape)  # noqa: E731
        h = api.rms_norm(ops, x, w("input_layernorm.weight", [hidden]), eps)
        q = ops.linear(h, w("self_attn.q_proj.weight", [heads * d, hidden])).view(b, s, heads, d).transpose(1, 2)
        k = ops.linear(h, w("self_attn.k_proj.weight", [kv_heads * d, hidden])).view(b, s, kv_heads, d).transpose(1, 2)
        v = ops.linear(h, w("self_attn.v_proj.weight", [kv_heads * d, hidden])).view(b, s, kv_heads, d).transpose(1, 2)
        ctx = api.attention(ops, api.apply_rotary(q, cos, sin), api.apply_rotary(k, cos, sin), v, mask, d ** -0.5)
        x = x + ops.linear(ctx.transpose(1, 2).reshape(b, s, heads * d), w("self_attn.o_proj.weight", [hidden, heads * d]))
        h = api.rms_norm(ops, x, w("post_attention_layernorm.weight", [hidden]), eps)
        x = x + api.swiglu(ops, h, w("mlp.gate_proj.weight", [width, hidden]), w("mlp.up_proj.weight", [width, hidden]),
                           w("mlp.down_proj.weight", [hidden, width]), config["hidden_act"])
        states.append(x)
    normed = api.rms_norm(ops, x, weights.take("model.norm.weight", [hidden]), eps)
    states.append(normed)
    head = embed if config["tie_word_embeddings"] else weights.take("lm_head.weight", [vocab, hidden])
    return ops.linear(normed, head), states, None
