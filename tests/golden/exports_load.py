#!/usr/bin/env python3
"""Every reference export loads whole in Hugging Face transformers and agrees with mih's numbers
(ctest ExportsLoadInTransformers, label golden; issue 54 item 3).

For each spec `mih list` registers, `mih export` (its default dtype) is read by transformers:
a spec whose config.json names a causal-LM class must load with AutoModelForCausalLM (another model
class transformers defines, LLaVA's LlavaForConditionalGeneration, by that class; its images passed)
(attn_implementation eager, the export's dtype) with no missing, unexpected or mismatched key,
have no config.json field its config class does not define (nor its modeling code read), and
its logits and loss on batch.safetensors must agree with reference.safetensors within 64
epsilons of the export's dtype. A spec of a known non-loading architecture (golden_kit's
KNOWN_NON_LOADING, with the reason) must still NOT load whole. The check itself must refuse three
broken copies of the llama export, every run: a weight removed, a mih-only config field added
(dense_intermediate_size, the pre-Qwen3-MoE moe's), one weight scaled by 1 + 1e-3.

Exit status: 0 every check held; 1 otherwise; 2 usage."""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_kit as kit  # noqa: E402
from golden_kit import check  # noqa: E402
GOLDEN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "golden")

# Two float32 (or bfloat16) computations of one function in different reduction orders: each
# contraction of K terms rounds to about sqrt(K) epsilons in the typical case (K <= 128 here, so
# ~11), compounded over a few layers; 64 epsilons holds that with margin and stays orders below a
# real difference (the scaled weight below moves the logits by ~1e-4 relative).
TOLERANCE_EPSILONS = 64


def torch_dtype(name):
    import torch

    return {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}[name]


def fields_the_modeling_reads(model_class):
    """Config fields the architecture's modeling file reads with getattr(config, "x", ...) or
    tests with hasattr (a field its config class need not define, e.g. Qwen2-MoE's head_dim)."""
    return kit.fields_read_by(sys.modules[model_class.__module__].__file__)


def undefined_fields(config_json, model_class):
    """config.json fields that the architecture's config class does not define: not in a default
    instance's to_dict(), PretrainedConfig's generic fields, the class's attribute_map,
    torch_dtype (PretrainedConfig's legacy name of dtype), or read by the modeling code."""
    from transformers import PretrainedConfig

    cls = model_class.config_class
    known = set(cls().to_dict()) | set(PretrainedConfig().to_dict()) | set(cls.attribute_map) | {"torch_dtype"}
    read = fields_the_modeling_reads(model_class)
    notes = sorted(f for f in config_json if f in read - known)
    return sorted(f for f in config_json if f not in known | read), notes


def load(export_dir, dtype):
    """(model or None, [problems]) of from_pretrained on the export: AutoModelForCausalLM for a
    causal LM, else the class config.json's architectures names (LLaVA)."""
    import transformers

    transformers.logging.set_verbosity_error()
    arch = kit.architecture(export_dir)
    cls = transformers.AutoModelForCausalLM if arch in kit.causal_lm_classes() else getattr(transformers, arch)
    try:
        model, info = cls.from_pretrained(export_dir, output_loading_info=True, attn_implementation="eager", dtype=dtype)
    except Exception as e:  # transformers raises many types for what it cannot take
        return None, ["from_pretrained refused it: %s: %s" % (type(e).__name__, str(e)[:400])]
    problems = ["%s: %s" % (k, ", ".join(map(str, list(info[k])[:6]))) for k in
                ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs") if info.get(k)]
    return model.eval(), problems


def cross_entropy(logits, labels, shifted):
    import torch.nn.functional as F

    if not shifted:  # Hugging Face's convention: labels[:, t] is the target of position t - 1
        logits, labels = logits[:, :-1], labels[:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), labels.reshape(-1), ignore_index=-100)


def compare_numbers(model, export_dir, dtype):
    """{max_abs, logits_rel, loss_rel, tolerance} of the model's forward on batch.safetensors
    against reference.safetensors."""
    import torch
    from safetensors.torch import load_file

    batch = load_file(os.path.join(export_dir, "batch.safetensors"))
    ref = load_file(os.path.join(export_dir, "reference.safetensors"))
    shifted = kit.read_json(os.path.join(export_dir, "training.json"))["labels_are_shifted"]
    # The golden producer's inputs: packed documents (document_ids) go without an attention_mask,
    # so transformers masks each document, found from the position_ids.
    sys.path.insert(0, GOLDEN_DIR)
    import transformers_impl  # the golden producer's forward inputs (needs torch: imported here)

    kwargs = transformers_impl._inputs(batch)
    if "pixel_values" in batch:  # a vision-language model's images, in the export's dtype
        kwargs["pixel_values"] = batch["pixel_values"].to(dtype)
    with torch.no_grad():
        logits = model(**kwargs, use_cache=False).logits.double()
    want = ref["logits"].double()
    loss = cross_entropy(logits, batch["labels"], shifted).item()
    return {"max_abs": (logits - want).abs().max().item(),
            "logits_rel": ((logits - want).norm() / want.norm()).item(),
            "loss": loss, "reference_loss": ref["loss"].item(),
            "loss_rel": abs(loss - ref["loss"].item()) / abs(ref["loss"].item()),
            "tolerance": TOLERANCE_EPSILONS * torch.finfo(dtype).eps}


def judge(export_dir):
    """([problems], figures or None) of one export in transformers."""
    import transformers

    config_json = kit.read_json(os.path.join(export_dir, "config.json"))
    dtype = torch_dtype(kit.read_json(os.path.join(export_dir, "mih_export.json"))["dtype"])
    model_class = getattr(transformers, config_json["architectures"][0])
    undefined, read_only = undefined_fields(config_json, model_class)
    problems = ["config.json field '%s' is not a field of %s (nor read by its modeling code): a mih-only field"
                % (f, model_class.config_class.__name__) for f in undefined]
    for f in read_only:
        print("      note (%s): config.json's '%s' is no field of %s; %s reads it (getattr/hasattr)"
              % (os.path.basename(export_dir), f, model_class.config_class.__name__, model_class.__module__))
    model, load_problems = load(export_dir, dtype)
    problems += load_problems
    if model is None or load_problems:
        return problems, None
    figures = compare_numbers(model, export_dir, dtype)
    for what in ("logits_rel", "loss_rel"):
        if not figures[what] <= figures["tolerance"]:
            problems.append("%s %.3g > tolerance %.3g" % (what, figures[what], figures["tolerance"]))
    return problems, figures


def check_loadable(loadable):
    table = {}
    for spec, out in loadable:
        problems, figures = judge(out)
        detail = "; ".join(problems)
        if figures:
            table[spec] = figures
            detail = ("max abs %.3g, logits rel L2 %.3g, loss %.9g vs %.9g (rel %.3g), tolerance %.3g; "
                      % (figures["max_abs"], figures["logits_rel"], figures["loss"], figures["reference_loss"],
                         figures["loss_rel"], figures["tolerance"])) + detail
        check(not problems, "%s (%s) loads whole in transformers and agrees with reference.safetensors"
              % (spec, kit.architecture(out)), detail)
        if figures and not problems:
            print("      " + detail.rstrip("; "))
    return table


def check_known(known):
    import transformers

    transformers.logging.set_verbosity_error()
    for spec, out, arch, reason in known:
        try:
            _, info = getattr(transformers, arch).from_pretrained(out, output_loading_info=True)
            problems = [k for k in ("missing_keys", "unexpected_keys", "mismatched_keys") if info.get(k)]
        except Exception as e:  # refused outright: also not loading
            problems = [type(e).__name__]
        check(bool(problems), "%s (%s) is a known non-loading export (%s); still does not load whole: %s"
              % (spec, arch, reason, ", ".join(problems)),
              "it loads now: move its architecture out of KNOWN_NON_LOADING and compare its numbers")


def broken_copy(work, source, name, change):
    out = os.path.join(work, name)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(source, out)
    change(out)
    return out


def drop_weight(key):
    def change(out):
        from safetensors.torch import load_file, save_file

        path = os.path.join(out, "model.safetensors")
        tensors = load_file(path)
        del tensors[key]
        save_file(tensors, path, metadata={"format": "pt"})
    return change


def scale_weight(key, factor):
    def change(out):
        from safetensors.torch import load_file, save_file

        path = os.path.join(out, "model.safetensors")
        tensors = load_file(path)
        tensors[key] = tensors[key] * factor
        save_file(tensors, path, metadata={"format": "pt"})
    return change


def add_field(name, value):
    def change(out):
        path = os.path.join(out, "config.json")
        config = kit.read_json(path)
        config[name] = value
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
    return change


def check_refusals(work, llama):
    """The check fails where it must: three broken copies of the llama export."""
    key = "model.layers.0.mlp.up_proj.weight"
    cases = [("a weight removed", drop_weight(key), key),
             ("a mih-only config field", add_field("dense_intermediate_size", 96), "dense_intermediate_size"),
             ("one weight scaled by 1 + 1e-3", scale_weight(key, 1.001), "logits_rel")]
    for i, (what, change, named) in enumerate(cases):
        problems, _ = judge(broken_copy(work, llama, "broken-%d" % i, change))
        check(any(named in p for p in problems), "the check refuses the llama export with %s, naming '%s'"
              % (what, named), "; ".join(problems) or "accepted")
        print("      refused: " + "; ".join(problems)[:300])


def main():
    a = kit.parse_args(__doc__)
    kit.run_under(a.python)
    import transformers

    print("transformers %s, %s" % (transformers.__version__, sys.executable))
    work = kit.fresh_dir(a.work)
    loadable, known = kit.classify(a.mih, os.path.join(work, "exports"))
    print("loadable: %s\nknown non-loading: %s" % (", ".join(s for s, _ in loadable),
                                                   ", ".join(s for s, *_ in known) or "none"))
    table = check_loadable(loadable)
    check_known(known)
    llama = dict(loadable).get("llama")
    check(llama is not None, "the llama export loads, so the refusals below have a good export to break")
    if llama:
        check_refusals(work, llama)
    with open(os.path.join(work, "figures.json"), "w", encoding="utf-8") as f:
        json.dump({"transformers": transformers.__version__, "specs": table}, f, indent=2, sort_keys=True)
    return kit.finish()


if __name__ == "__main__":
    sys.exit(main())
