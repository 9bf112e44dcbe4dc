#!/usr/bin/env python3
"""The builtin original (golden/builtin_models.py) agrees with Hugging Face transformers, quantity
by quantity (ctest BuiltinMatchesTransformers, label golden; issue 54 item 2).

For each spec both implementations take (its export names a transformers causal-LM class, its
model_type is one of the builtin's and the builtin does not refuse it (exit 11, printed with the
reason; ExportsLoadInTransformers holds its loading); identical exports compared once;
transformers refusing one is a failure), the golden producer
golden/mih_golden.py runs with --impl builtin and --impl transformers on one `mih export --dtype
float64` directory, and every tensor of the two golden.safetensors is compared by relative L2
error: loss, aux_loss, logits, hidden_states.<i>, grad.<key>, param_after_step.<key>. A
per-spec, per-kind table of the largest relative error and error / tolerance is printed and
written to <work>/agreement.json.

Tolerance. eps is the precision transformers computes in (golden.json's compute_epsilon): 2^-23
for the architectures it casts to float32 inside a float64 model (RMSNorm, rotary tables,
routers: llama, qwen2_moe, ...), 2^-52 for gpt2 (float64 throughout). The forward and backward
quantities take 16 eps: one rounding to eps at each cast, carried through a few well-conditioned
layers (measured: at most ~2 eps). param_after_step takes what that gradient tolerance implies
through AdamW's first step, p - lr g / (|g| + eps_adam) (both goldens run the same step code):
each element's update moves by at most lr |dg| / eps_adam, so the tolerance is 16 eps x
max(1, lr ||g|| / (eps_adam ||p||)).

The check fails where it must, every run: golden/*.py copied into the work directory with one
equation of the builtin perturbed (RMSNorm's eps outside the square root; rotary embeddings on
interleaved pairs instead of halves) must fail on llama, the first diverging quantity in
forward order named.

Exit status: 0 every check held; 1 otherwise; 2 usage."""
import contextlib
import glob
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(os.path.dirname(os.path.dirname(HERE)), "golden")
sys.path.insert(0, HERE)
import golden_kit as kit  # noqa: E402
from golden_kit import check  # noqa: E402

K = 16
KINDS = ("loss", "aux_loss", "logits", "hidden_states", "grad", "param_after_step")
# Equations of the builtin to perturb in a copy: (what, the text as builtin_models.py has it, the
# perturbed text).
PERTURBATIONS = [
    ("RMSNorm's eps outside the square root", "x * torch.rsqrt(ops.mean_last(x * x) + eps)",
     "x / (torch.sqrt(ops.mean_last(x * x)) + eps)"),
    ("rotary embeddings on interleaved pairs instead of halves",
     "rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)",
     "rotated = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)"),
]


def forward_order(names):
    """Quantities in the order a divergence is localized: hidden states by layer, logits, loss,
    aux loss, gradients, parameters after the step."""
    def key(n):
        kind = n.split(".")[0]
        rank = {"hidden_states": 0, "logits": 1, "loss": 2, "aux_loss": 3, "grad": 4, "param_after_step": 5}
        index = int(n.split(".")[1]) if kind == "hidden_states" else 0
        return rank.get(kind, 6), index, n
    return sorted(names, key=key)


def compare(builtin_dir, transformers_dir, training):
    """{quantity: (relative error, tolerance)} of two golden directories; a quantity one side
    lacks has an infinite error."""
    from safetensors.torch import load_file

    b = load_file(os.path.join(builtin_dir, "golden.safetensors"))
    t = load_file(os.path.join(transformers_dir, "golden.safetensors"))
    eps = kit.read_json(os.path.join(transformers_dir, "golden.json"))["compute_epsilon"]
    lr, eps_adam = training["trainer"]["step_lr"], training["trainer"]["eps"]
    out = {}
    # A gradient zero in exact arithmetic (CLIP's key bias, which softmax ignores) is rounding
    # residue on both sides: compared against the whole gradient's norm when transformers' is
    # below the tolerance of it, as mih's comparisons do (cancellation_scale).
    all_grads = sum(v.double().norm().item() ** 2 for k, v in t.items() if k.startswith("grad.")) ** 0.5
    for name in forward_order(set(b) | set(t)):
        tol = K * eps
        if name not in b or name not in t:
            out[name] = (float("inf"), tol)
            continue
        ref = t[name].double()
        norm = ref.norm().item()
        if name.startswith("grad.") and norm <= tol * all_grads:
            norm = all_grads
        err = (b[name].double() - ref).norm().item() / norm if norm > 0 else (b[name].double() - ref).norm().item()
        if name.startswith("param_after_step."):
            g = t.get("grad." + name[len("param_after_step."):])
            if g is not None and norm > 0:
                tol *= max(1.0, lr * g.double().norm().item() / (eps_adam * norm))
        out[name] = (err, tol)
    return out


def by_kind(errors):
    table = {}
    for name, (err, tol) in errors.items():
        kind = name.split(".")[0]
        row = table.get(kind)
        if row is None or err / tol > row["error_over_tolerance"]:
            table[kind] = {"quantity": name, "relative_error": err, "tolerance": tol, "error_over_tolerance": err / tol}
    return table


def produce(export_dir, out, impl):
    """Runs the producer's command line (in this process: one import of torch and transformers
    for every spec); (exit status, what it printed)."""
    import mih_golden

    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        rc = mih_golden.main(["--export", export_dir, "--out", out, "--impl", impl, "--no-noise-twin"])
    return rc, text.getvalue()


def digest(export_dir):
    h = hashlib.sha256()
    for f in sorted(glob.glob(os.path.join(export_dir, "*.safetensors")) + [os.path.join(export_dir, "config.json")]):
        if not f.endswith("reference.safetensors"):
            with open(f, "rb") as fh:
                h.update(os.path.basename(f).encode() + hashlib.sha256(fh.read()).digest())
    return h.hexdigest()


def both_take(mih, work):
    """[(spec, export dir)] of the distinct float64 exports both implementations take; the
    others printed with the reason."""
    import builtin_models

    loadable, known = kit.classify(mih, os.path.join(work, "exports"), ("--dtype", "float64"))
    for spec, _, arch, reason in known:
        print("skipped %s (%s): transformers does not load it whole: %s" % (spec, arch, reason))
    chosen, seen = [], {}
    for spec, out in loadable:
        model_type = kit.read_json(os.path.join(out, "config.json"))["model_type"]
        d = digest(out)
        if model_type not in builtin_models.DEFAULTS:
            print("skipped %s: the builtin has no %s (transformers only)" % (spec, model_type))
        elif d in seen:
            print("%s: the same export as %s, compared once" % (spec, seen[d]))
        else:
            seen[d] = spec
            chosen.append((spec, out))
    return chosen


def print_table(table):
    print("\n%-14s %-17s %-11s %-11s %-9s %s" % ("spec", "kind", "rel error", "tolerance", "err/tol", "largest at"))
    for spec, kinds in table.items():
        for kind in KINDS:
            if kind in kinds:
                r = kinds[kind]
                print("%-14s %-17s %-11.3g %-11.3g %-9.3g %s" % (spec, kind, r["relative_error"], r["tolerance"],
                                                                 r["error_over_tolerance"], r["quantity"]))


def compare_specs(chosen, work):
    table, goldens = {}, {}
    for spec, out in chosen:
        dirs = {impl: os.path.join(work, "goldens", spec, impl) for impl in ("builtin", "transformers")}
        rc, text = produce(out, dirs["builtin"], "builtin")
        if rc == 11:  # the builtin refuses the export (e.g. dropout in its config): it does not take it
            print("skipped %s: the builtin does not take it: %s" % (spec, text.strip()))
            continue
        check(rc == 0, "%s: the builtin producer writes its golden" % spec, text)
        rc, text = produce(out, dirs["transformers"], "transformers")
        check(rc == 0, "%s: the transformers producer writes its golden" % spec, text)
        if not os.path.exists(os.path.join(dirs["builtin"], "golden.json")) or rc != 0:
            continue
        errors = compare(dirs["builtin"], dirs["transformers"], kit.read_json(os.path.join(out, "training.json")))
        over = [(n, e, t) for n, (e, t) in errors.items() if not e <= t]
        check(not over, "%s: builtin and transformers agree on all %d quantities" % (spec, len(errors)),
              "; ".join("%s %.3g > %.3g" % o for o in over[:8]))
        table[spec] = by_kind(errors)
        goldens[spec] = (out, dirs["transformers"])
    return table, goldens


def check_perturbed(work, goldens):
    """A copy of the producer with one builtin equation perturbed must fail on llama."""
    if "llama" not in goldens:
        check(False, "llama is compared, so the perturbed builtin has a golden to fail against")
        return
    export_dir, transformers_dir = goldens["llama"]
    training = kit.read_json(os.path.join(export_dir, "training.json"))
    for i, (what, text, perturbed) in enumerate(PERTURBATIONS):
        copy_dir = kit.fresh_dir(os.path.join(work, "perturbed-%d" % i, "golden"))
        for f in glob.glob(os.path.join(GOLDEN, "*.py")):
            shutil.copy(f, copy_dir)
        path = os.path.join(copy_dir, "builtin_models.py")
        with open(path, encoding="utf-8") as f:
            source = f.read()
        check(source.count(text) == 1, "builtin_models.py has the equation to perturb once: %s" % text)
        with open(path, "w", encoding="utf-8") as f:
            f.write(source.replace(text, perturbed))
        out = os.path.join(work, "perturbed-%d" % i, "builtin")
        p = subprocess.run([sys.executable, os.path.join(copy_dir, "mih_golden.py"), "--export", export_dir, "--out", out,
                            "--impl", "builtin", "--no-noise-twin"], capture_output=True, text=True, timeout=120)
        check(p.returncode == 0, "the perturbed producer (%s) runs" % what, p.stdout + p.stderr)
        if p.returncode != 0:
            continue
        errors = compare(out, transformers_dir, training)
        over = [n for n, (e, t) in errors.items() if not e <= t]
        first = over[0] if over else None
        check(first is not None and first.startswith("hidden_states."),
              "llama with %s FAILS against transformers, first at %s" % (what, first),
              "no quantity diverges" if first is None else "")
        if first:
            print("      first divergence %s: relative error %.3g > tolerance %.3g (%d of %d quantities diverge)"
                  % (first, errors[first][0], errors[first][1], len(over), len(errors)))


def main():
    a = kit.parse_args(__doc__)
    kit.run_under(a.python)
    sys.path.insert(0, GOLDEN)
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    print("transformers %s, torch %s, %s" % (transformers.__version__, torch.__version__, sys.executable))
    work = kit.fresh_dir(a.work)
    table, goldens = compare_specs(both_take(a.mih, work), work)
    print_table(table)
    with open(os.path.join(work, "agreement.json"), "w", encoding="utf-8") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__, "k": K, "specs": table},
                  f, indent=2, sort_keys=True)
    print("written: %s\n" % os.path.join(work, "agreement.json"))
    check_perturbed(work, goldens)
    return kit.finish()


if __name__ == "__main__":
    sys.exit(main())
