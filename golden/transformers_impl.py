# `--impl transformers`: the original model as Hugging Face transformers builds it from the
# exported directory (from_pretrained, float64, eager attention): the golden mih's build makes
# for every reference spec where the scripts' venv has transformers (python/requirements-
# golden.txt pins it). Uses transformers' documented API: from_pretrained(..., dtype,
# attn_implementation, output_loading_info), a forward with output_hidden_states (and
# output_router_logits for a mixture of experts), the model's named_parameters under the
# checkpoint's keys. Its noise twin (twin=True) is the same model run on the batch's rows in
# reverse order with every module's output rounded to the precision it computes in.
import os

import torch

from errors import GoldenError

# Where the decoder layers live, by model_type: the last one's output is hooked, because the
# hidden_states tuple replaces it with the final norm's output.
_LAYERS = {"gpt2": ("transformer", "h"), "llava": ("model.language_model", "layers")}
# The precision the original computes in although its weights are float64: transformers'
# Llama-derived models (and many others) cast their RMSNorm, rotary tables and routers to
# float32 (modeling_llama.py LlamaRMSNorm, LlamaRotaryEmbedding's "Force float32", the routers'
# softmax(dtype=torch.float)). Seen, for any model_type, by computes_in_float32.
_LOW_PRECISION = (torch.float32, torch.float16, torch.bfloat16)


class _LowPrecisionSeen(torch.overrides.TorchFunctionMode):
    """Records whether any torch function (tensor methods included) returns a floating tensor
    of less than float64's precision."""

    def __init__(self):
        super().__init__()
        self.seen = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype in _LOW_PRECISION:
                self.seen = True
        return out


def computes_in_float32(model, batch):
    """Whether the float64 model computes anything in float32 (or less) inside: one forward
    with every torch function's result watched."""
    watch = _LowPrecisionSeen()
    with torch.no_grad(), watch:
        model(**_inputs(batch), use_cache=False, return_dict=True)
    return watch.seen


def load(export_dir, config):
    # The export is a local directory: nothing is fetched, and no code of its own (a config's
    # auto_map) is ever run.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        import transformers
    except ImportError:
        raise GoldenError(12, "--impl transformers: the Python running the producer has no transformers package; "
                              "install it (pip install transformers) or use --impl builtin")
    try:
        model, info = model_class(transformers, config).from_pretrained(
            export_dir, dtype=torch.float64, attn_implementation="eager", output_loading_info=True,
            trust_remote_code=False, local_files_only=True)
    except Exception as e:  # transformers raises many types for a config or a checkpoint it cannot take
        raise GoldenError(11, "transformers cannot load %s as %s: %s" % (export_dir, config.get("architectures"), e))
    problems = []
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        if info.get(kind):
            problems.append("%s: %s" % (kind, ", ".join(str(k) for k in list(info[kind])[:8])))
    if problems:
        raise GoldenError(11, "transformers' %s does not take the export as it is (%s); it would start those "
                              "weights at random. The port's key map or config has no counterpart in the original: "
                              "fix them in the spec (mih export writes them), or use --impl builtin or a plug-in"
                          % (type(model).__name__, "; ".join(problems)))
    model.eval()  # no dropout: a golden is one deterministic forward and backward
    return model, transformers.__version__


def model_class(transformers, config):
    """The class that builds the export: AutoModelForCausalLM for a causal LM, else the class
    config.json's architectures names when transformers defines it as a model (LLaVA's
    LlavaForConditionalGeneration is an image-text-to-text model, not a causal LM)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names = config.get("architectures") or []
    if not names or names[0] in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        return transformers.AutoModelForCausalLM
    cls = getattr(transformers, names[0], None) if isinstance(names[0], str) else None
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise GoldenError(11, "config.json: architectures %r names no model class of transformers %s"
                          % (names, transformers.__version__))
    return cls


def saved_parameters(model):
    """{checkpoint key: parameter} of the model: named_parameters() under the keys
    save_pretrained writes, i.e. with the class's _checkpoint_conversion_mapping undone as
    transformers undoes it when saving (LLaVA's model.language_model.* is saved as
    language_model.model.*), so gradients come out under the export's own keys."""
    import re

    reverse = {v: k for k, v in (getattr(model, "_checkpoint_conversion_mapping", None) or {}).items()}
    out = {}
    for name, p in model.named_parameters():
        for pattern, replacement in reverse.items():
            name, replaced = re.subn(pattern, re.sub(r"\(.*\)", "", replacement.lstrip("^")), name)
            if replaced:
                break
        out[name] = p
    return out


def _inputs(batch):
    """The forward's keyword arguments from the batch: input_ids, and attention_mask,
    position_ids and pixel_values when the batch has them. A batch of packed documents
    (document_ids) gives no attention_mask: then transformers finds the documents itself from
    the position_ids, which restart at each one (masking_utils.find_packed_sequence_indices),
    and masks attention to each; a row with padding cannot be given that way."""
    kwargs = {"input_ids": batch["input_ids"]}
    packed = "document_ids" in batch
    for name in ("attention_mask", "position_ids", "pixel_values"):
        if name in batch and not (packed and name == "attention_mask"):
            kwargs[name] = batch[name]
    if packed:
        from transformers import masking_utils

        if not getattr(masking_utils, "_is_torch_greater_or_equal_than_2_6", False):
            raise GoldenError(12, "batch.safetensors has document_ids: transformers masks packed documents only with "
                                  "torch >= 2.6; run the producer with a newer torch or use --impl builtin")
        if "position_ids" not in batch:
            raise GoldenError(11, "batch.safetensors has document_ids but no position_ids: transformers finds packed "
                                  "documents from the position_ids")
        if "attention_mask" in batch and not bool(batch["attention_mask"].bool().all()):
            raise GoldenError(11, "batch.safetensors has document_ids and padding (attention_mask 0): transformers "
                                  "masks packed documents only without an attention_mask; use --impl builtin")
    return kwargs


def _decoder_layers(model, model_type):
    owner, name = _LAYERS.get(model_type, ("model", "layers"))
    for part in owner.split("."):
        model = getattr(model, part)
    return getattr(model, name)


def _round_outputs(model):
    """Forward hooks rounding every leaf module's floating outputs to float32 and back (in the
    backward too, through the casts' gradients): the rounding transformers' float32 norms,
    rotary tables and routers put into a float64 model, at every module. Returns the handles."""

    def rounded(value):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.to(torch.float32).to(value.dtype)
        if isinstance(value, tuple):
            return tuple(rounded(v) for v in value)
        return value

    leaves = [m for m in model.modules() if not list(m.children())]
    return [m.register_forward_hook(lambda _m, _i, out: rounded(out)) for m in leaves]


def forward(model, model_type, batch, twin=False, float32_inside=False):
    """(logits, hidden states [embeddings, each layer's output, the final norm's], the
    router's weighted aux loss or None), from the model's own forward. The noise twin
    (twin=True) runs the rows of the batch in reverse order (every sum over the batch in
    another order) and, for a model that computes in float32 inside (computes_in_float32),
    rounds every module's output to float32; its outputs come back in the batch's order."""
    if twin:
        batch = {k: v.flip(0) for k, v in batch.items()}
        handles = _round_outputs(model) if float32_inside else []
        try:
            logits, hidden, aux = forward(model, model_type, batch)
        finally:
            for h in handles:
                h.remove()
        return logits.flip(0), [h.flip(0) for h in hidden], aux
    layers = _decoder_layers(model, model_type)
    captured = {}

    def hook(_module, _inputs, output):
        captured["last"] = output[0] if isinstance(output, tuple) else output

    handle = layers[-1].register_forward_hook(hook)
    kwargs = dict(_inputs(batch), output_hidden_states=True, use_cache=False, return_dict=True)
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
