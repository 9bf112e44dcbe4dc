#!/usr/bin/env python3
# The golden producer of mih (docs/golden.md): from a directory `mih export` wrote (config.json,
# model.safetensors, batch.safetensors, training.json, mih_export.json) it runs the ORIGINAL
# architecture on the exported weights and the exported first global batch, in float64, and
# writes what mih's MatchesOriginal suite compares the port with:
#   golden.safetensors  loss, logits, hidden_states.<i> (0: the embeddings, i: decoder layer
#                       i-1's output, L + 1: the final norm's), grad.<key> (each parameter's
#                       gradient under its external key), param_after_step.<key> (after one
#                       step of the port's optimizer with clipping, the export's trainer options)
#   golden.json         the manifest: format and version, the implementation, the SHA-256 of
#                       the checkpoint, the batch and the training options it was computed
#                       from, dtype, the noise of every quantity (builtin: against a twin run
#                       with other reduction orders), the config fields it defaulted
# Run it with any Python that has torch (>= 1.13):
#   python3 mih_golden.py --export DIR --out DIR [--impl builtin|transformers]
#   python3 mih_golden.py --export DIR --out DIR --impl plugin --plugin FILE   (a porter's own
#                         original, written on mih_golden_api.py: plugin_impl.py)
# `mih golden --spec NAME --out DIR` exports and runs it in one command.
# Exit status: 0 written; 2 usage; 11 bad input (an export it cannot read, an architecture it
# does not implement, a weight missing or left unread); 12 environment (no transformers for
# --impl transformers); 17 a bug of the producer.
import argparse
import hashlib
import json
import math
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from errors import GoldenError  # noqa: E402

FORMAT = "mih-golden"
VERSION = 1
PRODUCER_VERSION = "1"


def _sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _read_json(path, what):
    try:
        with open(path, "r", encoding="utf-8") as f:
            value = json.load(f)
    except OSError as e:
        raise GoldenError(11, "%s: cannot read %s (%s); is it a directory `mih export` wrote?" % (path, what, e.strerror))
    except ValueError as e:
        raise GoldenError(11, "%s is not JSON: %s" % (path, e))
    if not isinstance(value, dict):
        raise GoldenError(11, "%s: expected a JSON object, got %s" % (path, type(value).__name__))
    return value


def checkpoint_files(export_dir):
    """The files of the checkpoint, as mih's checkpoint_digest counts them: config.json, the
    index when the weights are sharded, every weights file; sorted by path."""
    index = os.path.join(export_dir, "model.safetensors.index.json")
    files = ["config.json"]
    if os.path.exists(index):
        weight_map = _read_json(index, "the weights index").get("weight_map", {})
        files += ["model.safetensors.index.json"] + sorted(set(weight_map.values()))
    else:
        files.append("model.safetensors")
    for f in files:
        if not os.path.isfile(os.path.join(export_dir, f)):
            raise GoldenError(11, "%s has no %s" % (export_dir, f))
    return sorted(files)


def checkpoint_digest(export_dir):
    """SHA-256 over each file's SHA-256 and its relative path, in path order (mih's
    cases::checkpoint_digest): one changed byte of any weight or of config.json changes it."""
    h = hashlib.sha256()
    for f in checkpoint_files(export_dir):
        h.update((_sha256_file(os.path.join(export_dir, f)) + f).encode("utf-8"))
    return h.hexdigest()


def read_weights(export_dir):
    import safetensors_io

    tensors = {}
    for f in checkpoint_files(export_dir):
        if f.endswith(".safetensors"):
            part, _ = safetensors_io.read(os.path.join(export_dir, f))
            tensors.update(part)
    return tensors


def relative_error(a, b):
    """||a - b|| / ||b|| (L2 over every element), 0 for two zeros."""
    a, b = a.detach().double(), b.detach().double()
    norm = b.norm().item()
    diff = (a - b).norm().item()
    return diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)


class Run:
    """One forward, backward and optimizer step of the original on the export."""

    def __init__(self, logits, hidden, loss, aux, grads, after):
        self.logits, self.hidden, self.loss, self.aux, self.grads, self.after = logits, hidden, loss, aux, grads, after

    def tensors(self):
        import torch

        out = {"loss": self.loss.detach().reshape([]), "logits": self.logits.detach()}
        if self.aux is not None:
            out["aux_loss"] = self.aux.detach().reshape([])
        for i, h in enumerate(self.hidden):
            out["hidden_states.%d" % i] = h.detach()
        for k, g in self.grads.items():
            out["grad." + k] = g
        for k, p in self.after.items():
            out["param_after_step." + k] = p
        return {k: v.to(torch.float64).contiguous() for k, v in out.items()}


def cross_entropy(logits, labels, shifted, twin=False):
    """The mean cross entropy over labels != -100: labels[:, t] is the target of position t
    when the export's pipeline shifted them (mih's convention), else of position t - 1 (the
    Hugging Face convention, which shifts inside the model). The noise twin sums the softmax's
    normalizer in two halves of the vocabulary and the token losses in two halves."""
    import torch
    import torch.nn.functional as F

    if not shifted:
        logits, labels = logits[:, :-1], labels[:, 1:]
    flat = labels.reshape(-1)
    valid = flat != -100
    count = valid.sum()
    if count.item() == 0:
        raise GoldenError(11, "batch.safetensors: every label is -100; the first batch has no target")
    rows = logits.reshape(-1, logits.shape[-1])
    if not twin:
        return F.cross_entropy(rows, flat, ignore_index=-100, reduction="sum") / count
    top = rows.detach().max(-1, keepdim=True).values
    h = rows.shape[-1] // 2
    shifted_rows = rows - top
    lse = top.squeeze(-1) + torch.log(shifted_rows[:, :h].exp().sum(-1) + shifted_rows[:, h:].exp().sum(-1))
    target = rows.gather(1, flat.clamp(min=0)[:, None]).squeeze(-1)
    losses = torch.where(valid, lse - target, torch.zeros_like(lse))
    n = losses.shape[0] // 2
    return (losses[:n].sum() + losses[n:].sum()) / count


# The trainer options a step needs, as training.json "trainer" holds them (harness/cases/hf_export.cpp).
STEP_FIELDS = ("optimizer", "step_lr", "beta1", "beta2", "eps", "momentum", "nesterov", "weight_decay", "max_grad_norm")


def make_optimizer(groups, t):
    """The port's optimizer over `groups` at the learning rate of step 0 (training.json "step_lr":
    the schedule's, a warmup's first fraction of lr): torch.optim.AdamW (decoupled weight decay,
    Loshchilov and Hutter 2019), Adam (weight decay as L2 in the gradient) or SGD with momentum,
    as mih's Trainer builds them (harness/training/optimizer.cpp)."""
    import torch

    missing = [f for f in STEP_FIELDS if f not in t]
    if missing:
        raise GoldenError(11, "training.json's trainer has no %s: it was exported by an older mih; export again "
                              "with this one" % ", ".join(missing))
    kind, lr = t["optimizer"], t["step_lr"]
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=(t["beta1"], t["beta2"]), eps=t["eps"], foreach=False)
    if kind == "adam":
        return torch.optim.Adam(groups, lr=lr, betas=(t["beta1"], t["beta2"]), eps=t["eps"], foreach=False)
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=t["momentum"], nesterov=t["nesterov"], foreach=False)
    raise GoldenError(11, "training.json names optimizer '%s'; this producer takes adamw, adam or sgd" % kind)


def step(params, training):
    """Clipping to the global L2 norm and one step of the port's optimizer (make_optimizer) with
    the export's trainer options, each tensor in its weight-decay group. Returns {key: parameter
    after the step}."""
    import torch

    t = training["trainer"]
    decay, no_decay = [], []
    for key, p in params.items():
        entry = training["tensors"].get(key)
        if entry is None:
            raise GoldenError(11, "training.json has no entry for '%s'; export again with this mih" % key)
        if p.requires_grad:
            (decay if entry["weight_decay"] else no_decay).append(p)
    trainable = decay + no_decay
    if t["max_grad_norm"] > 0:
        torch.nn.utils.clip_grad_norm_(trainable, t["max_grad_norm"])
    groups = [g for g in ({"params": decay, "weight_decay": t["weight_decay"]},
                          {"params": no_decay, "weight_decay": 0.0}) if g["params"]]
    make_optimizer(groups, t).step()
    return {k: p.detach().clone() for k, p in params.items()}


def collapsed_aliases(description, weights):
    """The ties `mih export` wrote once (mih_export.json "aliases": one tensor the port registers
    under two names, written under the first name's keys only), for the messages of a refusal:
    [(alias, fqn, the alias's own keys (the key map's; none without a rule), those the
    checkpoint lacks, the keys written)]."""
    listed = description.get("aliases")
    out = []
    for a in listed if isinstance(listed, list) else []:
        if not isinstance(a, dict) or not isinstance(a.get("fqn"), str) or not isinstance(a.get("of"), str):
            continue
        keys = [k for k in a.get("keys", []) if isinstance(k, str)]
        written = [k for k in a.get("written_as", []) if isinstance(k, str)]
        out.append((a["fqn"], a["of"], keys, [k for k in keys if k not in weights], written))
    return out


def explain_aliases(error, aliases):
    """`error`, a refusal of the export's weights, with the aliases it comes from: a key the
    original reads that the port wrote once for two names is named with both names."""
    named = [a for a in aliases if any("'%s'" % k in error.message for k in a[3])]
    if not named and "the checkpoint has no" in error.message:
        named = [a for a in aliases if not a[2]]  # an alias without keys of its own may be the missing one
    if not named:
        return error
    parts = []
    for alias, fqn, _, missing, written in named:
        under = ", ".join("'%s'" % k for k in written) or "the key(s) of '%s'" % fqn
        parts.append("'%s' is an alias of '%s' in the port (one tensor registered under both names), so the export "
                     "wrote it once, under %s%s" % (alias, fqn, under, " and not under " +
                                                    ", ".join("'%s'" % k for k in missing) if missing else ""))
    return GoldenError(error.code, error.message + "; " + "; ".join(parts) + ": the original keeps them apart, so give "
                       "the alias its own parameter in the port (and drop the pair from the spec's checkpoint.tied)")


def run_builtin(config_json, weights, batch, training, twin):
    import torch

    import builtin_models

    cfg = builtin_models.Config(config_json)
    frozen = {k for k, e in training["tensors"].items() if not e.get("trainable", True)}
    W = builtin_models.Weights({k: v.to(torch.float64) for k, v in weights.items()}, frozen)
    logits, hidden, aux = builtin_models.forward(cfg, W, batch, builtin_models.Ops(twin=twin))
    loss = cross_entropy(logits, batch["labels"], training["labels_are_shifted"], twin=twin)
    (loss if aux is None else loss + aux).backward()
    grads = {k: p.grad.detach().clone() for k, p in W.tensors.items() if p.grad is not None}
    after = step(W.tensors, training)
    return Run(logits, hidden, loss, aux, grads, after), cfg.defaulted


def run_plugin(plugin, config_json, weights, batch, training, twin):
    import torch

    import mih_golden_api
    import plugin_impl

    module, path = plugin
    cfg = mih_golden_api.Config(config_json, getattr(module, "DEFAULTS", None))
    frozen = {k for k, e in training["tensors"].items() if not e.get("trainable", True)}
    W = mih_golden_api.Weights({k: v.to(torch.float64) for k, v in weights.items()}, frozen)
    if "position_ids" not in batch:  # the export leaves them out when they are 0..S-1
        batch = dict(batch, position_ids=torch.arange(batch["input_ids"].shape[1]).expand_as(batch["input_ids"]))
    logits, hidden, aux = plugin_impl.forward(module, path, cfg, W, batch, mih_golden_api.Ops(twin=twin))
    W.check_all_used()
    loss = cross_entropy(logits, batch["labels"], training["labels_are_shifted"], twin=twin)
    (loss if aux is None else loss + aux).backward()
    grads = {k: p.grad.detach().clone() for k, p in W.tensors.items() if p.grad is not None}
    after = step(W.tensors, training)
    return Run(logits, hidden, loss, aux, grads, after), cfg.defaulted


def run_transformers(export_dir, config_json, batch, training, twin=False):
    """(Run, transformers' version, whether the model computes in float32 inside)."""
    import transformers_impl

    model, version = transformers_impl.load(export_dir, config_json)
    inside = transformers_impl.computes_in_float32(model, batch)
    logits, hidden, aux = transformers_impl.forward(model, config_json.get("model_type"), batch, twin=twin,
                                                    float32_inside=inside)
    loss = cross_entropy(logits, batch["labels"], training["labels_are_shifted"], twin=twin)
    (loss if aux is None else loss + aux).backward()
    params = transformers_impl.saved_parameters(model)
    grads = {k: p.grad.detach().clone() for k, p in params.items() if p.grad is not None}
    after = step(params, training)
    return Run(logits, hidden, loss, aux, grads, after), version, inside


def produce(export_dir, out_dir, impl, noise_twin=True, plugin=None):
    import torch

    import safetensors_io

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    config_json = _read_json(os.path.join(export_dir, "config.json"), "the Hugging Face config")
    training = _read_json(os.path.join(export_dir, "training.json"), "the trainer options (mih export writes it)")
    description = {}
    if os.path.exists(os.path.join(export_dir, "mih_export.json")):
        description = _read_json(os.path.join(export_dir, "mih_export.json"), "mih's description of the export")
    for field in ("trainer", "tensors", "labels_are_shifted"):
        if field not in training:
            raise GoldenError(11, "%s/training.json has no '%s'; export again with this mih" % (export_dir, field))
    weights = read_weights(export_dir)
    batch_tensors, _ = safetensors_io.read(os.path.join(export_dir, "batch.safetensors"))
    for name in ("input_ids", "labels"):
        if name not in batch_tensors:
            raise GoldenError(11, "%s/batch.safetensors has no '%s'" % (export_dir, name))
    batch = {k: v.to(torch.int64) for k, v in batch_tensors.items()
             if k in ("input_ids", "labels", "position_ids", "attention_mask", "document_ids")}
    if "pixel_values" in batch_tensors:  # a vision-language model's images, in the weights' precision
        batch["pixel_values"] = batch_tensors["pixel_values"].to(torch.float64)

    aliases = collapsed_aliases(description, weights)
    noise = {}
    if impl == "plugin":
        import plugin_impl

        module, implementation = plugin_impl.load(plugin)
        implementation.update({"architecture": config_json.get("model_type"), "torch": torch.__version__})
        try:
            main, defaulted = run_plugin((module, plugin), config_json, weights, batch, training, twin=False)
        except GoldenError as e:
            raise explain_aliases(e, aliases)
        epsilon = 2.0 ** -52
        if noise_twin:
            twin, _ = run_plugin((module, plugin), config_json, weights, batch, training, twin=True)
            a, b = twin.tensors(), main.tensors()
            noise = {k: relative_error(a[k], b[k]) for k in b}
    elif impl == "builtin":
        try:
            main, defaulted = run_builtin(config_json, weights, batch, training, twin=False)
        except GoldenError as e:
            raise explain_aliases(e, aliases)
        implementation = {"name": "builtin", "version": PRODUCER_VERSION, "architecture": config_json.get("model_type"),
                          "torch": torch.__version__}
        epsilon = 2.0 ** -52
        if noise_twin:
            twin, _ = run_builtin(config_json, weights, batch, training, twin=True)
            a, b = twin.tensors(), main.tensors()
            noise = {k: relative_error(a[k], b[k]) for k in b}
    else:
        try:
            main, version, float32_inside = run_transformers(export_dir, config_json, batch, training)
        except GoldenError as e:
            raise explain_aliases(e, aliases)
        defaulted = {}
        implementation = {"name": "transformers", "version": version, "architecture": config_json.get("model_type"),
                          "torch": torch.__version__}
        epsilon = 2.0 ** -23 if float32_inside else 2.0 ** -52
        if noise_twin:
            twin, _, _ = run_transformers(export_dir, config_json, batch, training, twin=True)
            a, b = twin.tensors(), main.tensors()
            noise = {k: relative_error(a[k], b[k]) for k in b}
    tensors = main.tensors()
    os.makedirs(out_dir, exist_ok=True)
    tensors_path = os.path.join(out_dir, "golden.safetensors")
    safetensors_io.write(tensors_path + ".tmp", tensors, {"format": FORMAT})
    os.replace(tensors_path + ".tmp", tensors_path)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "implementation": implementation,
        "dtype": "float64",
        "spec": description.get("spec"),
        "checkpoint_sha256": checkpoint_digest(export_dir),
        "batch_sha256": _sha256_file(os.path.join(export_dir, "batch.safetensors")),
        "training_sha256": _sha256_file(os.path.join(export_dir, "training.json")),
        "tensors_file": "golden.safetensors",
        "tensors_sha256": _sha256_file(tensors_path),
        "num_hidden_layers": len(main.hidden) - 2,
        "loss": main.loss.item(),
        "aux_loss": None if main.aux is None else main.aux.item(),
        "compute_epsilon": epsilon,
        "noise": noise,
        "defaulted_config_fields": defaulted,
        "seed": description.get("seed"),
    }
    path = os.path.join(out_dir, "golden.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(path + ".tmp", path)
    return manifest


def main(argv):
    parser = argparse.ArgumentParser(
        prog="mih_golden.py",
        description="Writes the golden of a `mih export` directory: the original architecture's loss, logits, hidden "
                    "states, gradients and parameters after one step, in float64 (docs/golden.md).")
    parser.add_argument("--export", required=True, help="the directory `mih export --dtype float64` wrote")
    parser.add_argument("--out", required=True, help="where golden.json and golden.safetensors go")
    parser.add_argument("--impl", choices=("builtin", "transformers", "plugin"), default="builtin",
                        help="builtin: the producer's own PyTorch implementation of llama, qwen3, mixtral, qwen2_moe, "
                             "qwen3_moe, gpt2, llava "
                             "(default); transformers: Hugging Face transformers' from_pretrained; plugin: the file "
                             "--plugin names")
    parser.add_argument("--plugin", metavar="FILE",
                        help="a golden plug-in (NAME, VERSION, forward(config, weights, batch, ops) on "
                             "mih_golden_api.py); implies --impl plugin")
    parser.add_argument("--no-noise-twin", action="store_true",
                        help="skip the second run in other reduction orders (builtin: every contraction in two "
                             "halves; transformers: the rows reversed, module outputs rounded to its precision), "
                             "the noise mih calibrates from")
    args = parser.parse_args(argv)
    if args.plugin and args.impl == "transformers":
        parser.error("--plugin runs your plug-in, --impl transformers Hugging Face's model: give one of them")
    if args.plugin:
        args.impl = "plugin"
    elif args.impl == "plugin":
        parser.error("--impl plugin needs --plugin FILE")
    try:
        import torch  # noqa: F401
    except ImportError:
        print("mih_golden: %s has no torch; run the producer with a Python that has it (Debian: apt-get install "
              "python3-torch)" % sys.executable, file=sys.stderr)
        return 12
    try:
        manifest = produce(args.export, args.out, args.impl, noise_twin=not args.no_noise_twin, plugin=args.plugin)
    except GoldenError as e:
        print("mih_golden: %s" % e.message, file=sys.stderr)
        return e.code
    except Exception:  # a bug of the producer, never a verdict
        traceback.print_exc()
        print("mih_golden: internal error (a bug of the producer: please report it)", file=sys.stderr)
        return 17
    print("mih_golden: %s golden of %s (%s): loss %.17g, %d layers -> %s"
          % (manifest["implementation"]["name"], manifest["spec"] or args.export,
             manifest["implementation"]["architecture"], manifest["loss"], manifest["num_hidden_layers"],
             os.path.join(args.out, "golden.json")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
