# The builtin LLaVA of the golden producer (Liu et al. 2023): a CLIP vision encoder (Radford et
# al. 2021), a two-layer projector and a Llama-family language model whose image placeholder
# tokens take the projected patch features, as Hugging Face transformers states it
# (models/llava/modeling_llava.py: LlavaModel.get_image_features, get_placeholder_mask;
# models/clip/modeling_clip.py: CLIPVisionEmbeddings, CLIPEncoderLayer, CLIPVisionTransformer;
# configuration_llava.py and configuration_clip.py for the defaults), never from mih's C++ port.
# Keys are the checkpoint's in the layout LlavaForConditionalGeneration saves:
# vision_tower.vision_model.*, multi_modal_projector.*, language_model.model.*,
# language_model.lm_head.weight.
import torch
import torch.nn.functional as F

import builtin_models as bm
from errors import GoldenError

_VISION = "vision_tower.vision_model."


def _sub_config(cfg, name):
    raw = cfg[name]
    if not isinstance(raw, dict):
        raise GoldenError(11, "config.json: llava's %s is missing; the builtin takes LLaVA only with text_config and "
                              "vision_config written out (transformers' own defaults for them are a 7B model)" % name)
    return bm.Config(raw)


def _patch_embeddings(ops, x, w):
    """CLIP's patch embedding, nn.Conv2d(C, Hv, p, stride p, bias=False): [N, C, H, W] -> [N, P,
    Hv]. The noise twin computes it as unfolded patches times the flattened kernel, summed in
    halves."""
    p = w.shape[-1]
    if not ops.twin:
        return F.conv2d(x, w, stride=p).flatten(2).transpose(1, 2)
    patches = F.unfold(x, kernel_size=p, stride=p).transpose(1, 2)  # [N, P, C*p*p], channel-major like the kernel
    return ops.linear(patches, w.reshape(w.shape[0], -1))


def _clip_layer(vc, W, ops, x, p):
    """CLIPEncoderLayer: x + out_proj(attn(layer_norm1(x))), then h + fc2(act(fc1(layer_norm2(h))))."""
    hidden, heads, inner = vc["hidden_size"], vc["num_attention_heads"], vc["intermediate_size"]
    eps, act = vc["layer_norm_eps"], bm.activation(vc["hidden_act"])
    d = hidden // heads
    n, t, _ = x.shape

    def linear(name, n_in, n_out, y):
        return ops.linear(y, W.take(p + name + ".weight", [n_out, n_in]), W.take(p + name + ".bias", [n_out]))

    def norm(name, y):
        return bm._layer_norm(ops, y, W.take(p + name + ".weight", [hidden]), W.take(p + name + ".bias", [hidden]), eps)

    h = norm("layer_norm1", x)
    q, k, v = (linear("self_attn.%s_proj" % c, hidden, hidden, h).view(n, t, heads, d).transpose(1, 2) for c in "qkv")
    no_mask = torch.zeros(1, 1, t, t, dtype=x.dtype)  # bidirectional: every patch attends to every one
    ctx = bm._attention(ops, q, k, v, no_mask, d ** -0.5).transpose(1, 2).reshape(n, t, hidden)
    x = x + linear("self_attn.out_proj", hidden, hidden, ctx)
    return x + linear("mlp.fc2", inner, hidden, act(linear("mlp.fc1", hidden, inner, norm("layer_norm2", x))))


def _clip_vision(vc, W, ops, pixels):
    """CLIPVisionTransformer: its hidden states [embeddings after pre_layrnorm, each layer's
    output], each [N, P + 1, Hv]. The post_layernorm (the pooled output's) is in the checkpoint
    and read by nothing LLaVA computes: checked for shape, marked read, given no gradient."""
    hidden, c, p, size = vc["hidden_size"], vc["num_channels"], vc["patch_size"], vc["image_size"]
    bm._no_dropout(vc, "attention_dropout")
    if list(pixels.shape[1:]) != [c, size, size]:
        raise GoldenError(11, "batch.safetensors: pixel_values %s do not fit vision_config (%d channels, %d x %d)"
                          % (list(pixels.shape), c, size, size))
    n, patches = pixels.shape[0], (size // p) ** 2
    e = _VISION + "embeddings."
    x = _patch_embeddings(ops, pixels.to(W.tensors[e + "patch_embedding.weight"].dtype),
                          W.take(e + "patch_embedding.weight", [hidden, c, p, p]))
    cls = W.take(e + "class_embedding", [hidden]).expand(n, 1, hidden)
    x = torch.cat([cls, x], dim=1) + W.take(e + "position_embedding.weight", [patches + 1, hidden])
    eps = vc["layer_norm_eps"]
    x = bm._layer_norm(ops, x, W.take(_VISION + "pre_layrnorm.weight", [hidden]),
                       W.take(_VISION + "pre_layrnorm.bias", [hidden]), eps)
    states = [x]
    for i in range(vc["num_hidden_layers"]):
        x = _clip_layer(vc, W, ops, x, _VISION + "encoder.layers.%d." % i)
        states.append(x)
    for name in ("weight", "bias"):
        W.take(_VISION + "post_layernorm." + name, [hidden])
    return states


def _image_features(cfg, vc, tc, W, ops, pixels):
    """LlavaModel.get_image_features: the vision_feature_layer's hidden state ("default": its
    class token dropped) through linear_2(act(linear_1(.))). -> [N, P (or P + 1), H]."""
    layer, strategy = cfg["vision_feature_layer"], cfg["vision_feature_select_strategy"]
    if not isinstance(layer, int) or strategy not in ("default", "full"):
        raise GoldenError(11, "config.json: vision_feature_layer %r / vision_feature_select_strategy %r have no builtin "
                              "implementation (one layer index; 'default' or 'full')" % (layer, strategy))
    selected = _clip_vision(vc, W, ops, pixels)[layer]
    if strategy == "default":
        selected = selected[:, 1:]
    hv, h = vc["hidden_size"], tc["hidden_size"]
    bias = cfg["multimodal_projector_bias"]
    m = "multi_modal_projector."

    def linear(name, n_in, n_out, y):
        return ops.linear(y, W.take(m + name + ".weight", [n_out, n_in]),
                          W.take(m + name + ".bias", [n_out]) if bias else None)

    return linear("linear_2", h, h, bm.activation(cfg["projector_hidden_act"])(linear("linear_1", hv, h, selected)))


def llava(cfg, W, batch, ops):
    """(logits, the language model's hidden states, None): LlavaForConditionalGeneration's
    forward. The placeholder tokens (input_ids == image_token_index) take the image features in
    order, row by row (get_placeholder_mask + masked_scatter); their count must equal the
    features'."""
    tc, vc = _sub_config(cfg, "text_config"), _sub_config(cfg, "vision_config")
    if tc.model_type == "gpt2":
        raise GoldenError(11, "config.json: llava's text_config is gpt2; the builtin's LLaVA takes a Llama-family one")
    merge = None
    if "pixel_values" in batch:
        features = _image_features(cfg, vc, tc, W, ops, batch["pixel_values"])

        def merge(x):
            placeholders = (batch["input_ids"] == cfg["image_token_index"]).unsqueeze(-1).expand_as(x)
            if placeholders.sum().item() != features.numel():
                raise GoldenError(11, "batch.safetensors: %d image placeholder token(s) (id %d) for %d image "
                                      "feature(s) of %d" % (placeholders[..., 0].sum().item(), cfg["image_token_index"],
                                                            features.shape[0] * features.shape[1], features.shape[1]))
            return x.masked_scatter(placeholders, features.to(x.dtype))

    logits, hidden, aux = bm._decoder(tc, W, batch, ops, prefix="language_model.", merge=merge)
    for sub, c in (("text_config.", tc), ("vision_config.", vc)):
        cfg.defaulted.update({sub + k: v for k, v in c.defaulted.items()})
    if "pixel_values" not in batch:
        _mark_vision_read(W)
    return logits, hidden, aux


def _mark_vision_read(W):
    """A text-only batch runs no vision tower (as transformers' does): its weights are read by
    nothing, and that is the architecture, not a key map's stray name."""
    W.used.update(k for k in W.tensors if k.startswith((_VISION, "multi_modal_projector.")))
