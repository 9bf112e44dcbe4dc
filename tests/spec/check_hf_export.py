#!/usr/bin/env python3
"""Reads a `mih export` directory with nothing but the standard library (json + struct), as an
outside tool would, knowing only Hugging Face's names: config.json's fields by the names
LlamaForCausalLM, MixtralForCausalLM and LlavaForConditionalGeneration read, and the tensor
names and shapes those classes create from them. Checks that every weight the architecture
expects is in the safetensors files with that shape and that nothing else is (the vision tower
of a LLaVA export: its layer count and width only), then recomputes the mean cross entropy of
the reference logits over the labels != -100 in pure Python. Exits 0 when everything agrees
(the loss to relative 1e-5), printing what it read; 1 otherwise, printing each disagreement."""
import json
import math
import os
import struct
import sys


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    fmt = {"F64": "d", "F32": "f", "F16": "e", "BF16": "H", "I64": "q", "I32": "i"}
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        code = fmt[entry["dtype"]]
        count = (end - begin) // struct.calcsize(code)
        values = struct.unpack("<%d%s" % (count, code), data[base + begin:base + end])
        if entry["dtype"] == "BF16":  # the upper 16 bits of a float32
            values = struct.unpack("<%df" % count, struct.pack("<%dI" % count, *(v << 16 for v in values)))
        out[name] = (entry["shape"], values)
    return out


def weight_shapes(directory):
    index = os.path.join(directory, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    shapes = {}
    for f in files:
        for name, entry in read_header(os.path.join(directory, f)).items():
            shapes[name] = entry["shape"]
    return shapes


def llama_shapes(cfg, prefix="", moe=False, qk_norm=False):
    """LlamaForCausalLM as modeling_llama builds it; with qk_norm Qwen3ForCausalLM (modeling_qwen3:
    q_norm and k_norm [head_dim] per layer); with moe too Qwen3MoeForCausalLM (modeling_qwen3_moe:
    the layers of mlp_only_layers dense, the others sparse, experts of moe_intermediate_size)."""
    h, v, n = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    d = cfg.get("head_dim", h // heads)
    f = cfg["intermediate_size"]
    out = {prefix + "model.embed_tokens.weight": [v, h], prefix + "model.norm.weight": [h]}
    if not cfg.get("tie_word_embeddings", False):
        out[prefix + "lm_head.weight"] = [v, h]
    dense = set(cfg.get("mlp_only_layers", [])) if moe else set(range(n))
    for layer in range(n):
        p = prefix + "model.layers.%d." % layer
        out[p + "input_layernorm.weight"] = [h]
        out[p + "post_attention_layernorm.weight"] = [h]
        for name, rows in (("q", heads * d), ("k", kv * d), ("v", kv * d)):
            out[p + "self_attn.%s_proj.weight" % name] = [rows, h]
            if cfg.get("attention_bias", False):
                out[p + "self_attn.%s_proj.bias" % name] = [rows]
        out[p + "self_attn.o_proj.weight"] = [h, heads * d]
        if qk_norm:
            out[p + "self_attn.q_norm.weight"] = [d]
            out[p + "self_attn.k_norm.weight"] = [d]
        if cfg.get("attention_bias", False):
            out[p + "self_attn.o_proj.bias"] = [h]
        if layer in dense:
            out[p + "mlp.gate_proj.weight"] = [f, h]
            out[p + "mlp.up_proj.weight"] = [f, h]
            out[p + "mlp.down_proj.weight"] = [h, f]
        else:
            fe = cfg["moe_intermediate_size"]
            out[p + "mlp.gate.weight"] = [cfg["num_experts"], h]
            for e in range(cfg["num_experts"]):
                q = p + "mlp.experts.%d." % e
                out[q + "gate_proj.weight"] = [fe, h]
                out[q + "up_proj.weight"] = [fe, h]
                out[q + "down_proj.weight"] = [h, fe]
    return out


def clip_vision_shapes(vision, prefix="vision_tower.vision_model."):
    """The tensors of transformers' CLIPVisionModel (modeling_clip.py) by their checkpoint keys."""
    h, f, c, p = vision["hidden_size"], vision["intermediate_size"], vision.get("num_channels", 3), vision["patch_size"]
    patches = (vision["image_size"] // p) ** 2
    out = {prefix + "embeddings.class_embedding": [h],
           prefix + "embeddings.patch_embedding.weight": [h, c, p, p],
           prefix + "embeddings.position_embedding.weight": [patches + 1, h]}
    for norm in ("pre_layrnorm", "post_layernorm"):
        out[prefix + norm + ".weight"] = out[prefix + norm + ".bias"] = [h]
    for i in range(vision["num_hidden_layers"]):
        layer = prefix + "encoder.layers.%d." % i
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out[layer + "self_attn.%s.weight" % proj], out[layer + "self_attn.%s.bias" % proj] = [h, h], [h]
        for norm in ("layer_norm1", "layer_norm2"):
            out[layer + norm + ".weight"] = out[layer + norm + ".bias"] = [h]
        out[layer + "mlp.fc1.weight"], out[layer + "mlp.fc1.bias"] = [f, h], [f]
        out[layer + "mlp.fc2.weight"], out[layer + "mlp.fc2.bias"] = [h, f], [h]
    return out


def check_weights(cfg, shapes):
    arch = cfg["architectures"][0]
    problems = []
    if arch == "LlamaForCausalLM":
        expected = llama_shapes(cfg)
    elif arch == "Qwen3ForCausalLM":
        expected = llama_shapes(cfg, qk_norm=True)
    elif arch == "Qwen3MoeForCausalLM":
        expected = llama_shapes(cfg, moe=True, qk_norm=True)
    elif arch == "LlavaForConditionalGeneration":
        text, vision = cfg["text_config"], cfg["vision_config"]
        expected = llama_shapes(text, prefix="language_model.")
        bias = cfg.get("multimodal_projector_bias", True)
        expected["multi_modal_projector.linear_1.weight"] = [text["hidden_size"], vision["hidden_size"]]
        expected["multi_modal_projector.linear_2.weight"] = [text["hidden_size"], text["hidden_size"]]
        if bias:
            expected["multi_modal_projector.linear_1.bias"] = [text["hidden_size"]]
            expected["multi_modal_projector.linear_2.bias"] = [text["hidden_size"]]
        expected.update(clip_vision_shapes(vision))
    else:
        return ["unknown architecture %s" % arch]
    for key, shape in sorted(expected.items()):
        if key not in shapes:
            problems.append("missing %s %s" % (key, shape))
        elif shapes[key] != shape:
            problems.append("%s: %s expects %s, the file holds %s" % (key, arch, shape, shapes[key]))
    for key in sorted(set(shapes) - set(expected)):
        problems.append("unexpected %s %s" % (key, shapes[key]))
    return problems


def main(directory):
    cfg = json.load(open(os.path.join(directory, "config.json")))
    shapes = weight_shapes(directory)
    problems = check_weights(cfg, shapes)
    batch = read_safetensors(directory + "/batch.safetensors")
    ref = read_safetensors(directory + "/reference.safetensors")
    (b, s, v), logits = ref["logits"]
    _, labels = batch["labels"]
    total, count = 0.0, 0
    for t in range(b * s):
        if labels[t] == -100:
            continue
        row = logits[t * v:(t + 1) * v]
        m = max(row)
        total += m + math.log(sum(math.exp(x - m) for x in row)) - row[labels[t]]
        count += 1
    loss = total / count
    exported = ref["loss"][1][0]
    # The loss is computed from the logits in their dtype; bfloat16 logits carry 8 bits.
    tolerance = 1e-2 if ref["logits"] and cfg.get("torch_dtype") == "bfloat16" else 1e-5
    if abs(loss - exported) > tolerance * abs(exported):
        problems.append("loss recomputed from the logits %.6f, exported %.6f" % (loss, exported))
    print("%s (%s): %d weight tensors as its config predicts, logits [%d, %d, %d], %d targets: loss %.6f, exported %.6f"
          % (cfg["architectures"][0], cfg["model_type"], len(shapes), b, s, v, count, loss, exported))
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
