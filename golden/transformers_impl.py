# `--impl transformers`: the original model as Hugging Face transformers builds it from the
# exported directory (from_pretrained, float64, eager attention). Not exercised by mih's CI,
# which has no transformers (docs/golden.md says so); written against transformers' documented
# API: from_pretrained(..., torch_dtype, attn_implementation, output_loading_info), a forward
# with output_hidden_states (and output_router_logits for a mixture of experts), the model's
# named_parameters under the checkpoint's keys.
import torch

from errors import GoldenError

# Where the decoder layers live, by model_type: the last one's output is hooked, because the
# hidden_states tuple replaces it with the final norm's output.
_LAYERS = {"gpt2": ("transformer", "h")}
# The precision the original computes in although its weights are float64: transformers'
# RMSNorm, rotary tables and routers cast to float32 (modeling_llama.py LlamaRMSNorm,
# LlamaRotaryEmbedding's "Force float32", the routers' softmax(dtype=torch.float)).
FLOAT32_INSIDE = {"llama", "mistral", "qwen2", "mixtral", "qwen2_moe"}


def load(export_dir, config):
    try:
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise GoldenError(12, "--impl transformers: the Python running the producer has no transformers package; "
                              "install it (pip install transformers) or use --impl builtin")
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            export_dir, torch_dtype=torch.float64, attn_implementation="eager", output_loading_info=True)
    except Exception as e:  # transformers raises many types for a config or a checkpoint it cannot take
        raise GoldenError(11, "transformers cannot load %s as %s: %s" % (export_dir, config.get("architectures"), e))
    problems = []
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        if info.get(kind):
            problems.append("%s: %s" % (kind, ", ".join(str(k) for k in list(info[kind])[:8])))
    if problems:
        raise GoldenError(11, "transformers' %s does not take the export as it is (%s); it would start those "
                              "weights at random. The port's layout has no counterpart in the original (mih's moe "
                              "declares dense layers Mixtral cannot express): use --impl builtin"
                          % (type(model).__name__, "; ".join(problems)))
    model.eval()  # no dropout: a golden is one deterministic forward and backward
    return model, transformers.__version__


def _decoder_layers(model, model_type):
    owner, name = _LAYERS.get(model_type, ("model", "layers"))
    return getattr(getattr(model, owner), name)


def forward(model, model_type, batch):
    """(logits, hidden states [embeddings, each layer's output, the final norm's], the
    router's weighted aux loss or None), from the model's own forward."""
    layers = _decoder_layers(model, model_type)
    captured = {}

    def hook(_module, _inputs, output):
        captured["last"] = output[0] if isinstance(output, tuple) else output

    handle = layers[-1].register_forward_hook(hook)
    kwargs = dict(input_ids=batch["input_ids"], output_hidden_states=True, use_cache=False, return_dict=True)
    for name in ("attention_mask", "position_ids"):
        if name in batch:
            kwargs[name] = batch[name]
    moe = getattr(model.config, "output_router_logits", None) is not None
    if moe:
        kwargs["output_router_logits"] = bool(model.config.output_router_logits)
    try:
        out = model(**kwargs)
    finally:
        handle.remove()
    states = list(out.hidden_states)
    if len(states) != len(layers) + 1:
        raise GoldenError(17, "transformers returned %d hidden states for %d layers; expected the embeddings, each "
                              "layer's output and the final norm's" % (len(states), len(layers)))
    hidden = states[:-1] + [captured["last"], states[-1]]
    aux = None
    if moe and model.config.output_router_logits and getattr(out, "aux_loss", None) is not None:
        aux = model.config.router_aux_loss_coef * out.aux_loss
    return out.logits, hidden, aux
