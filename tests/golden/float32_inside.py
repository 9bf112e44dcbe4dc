#!/usr/bin/env python3
"""A transformers golden's precision is what the model computes in, for every architecture
(ctest TransformersPrecisionByModel, label golden): transformers' Llama-derived models (and many
others) cast their norms and rotary tables to float32 inside a float64 model, which makes the
golden float32-floored (compute_epsilon float32's, a noise twin rounded to float32). A porter's
model_type outside a hand-kept list of seven got float64's epsilon and a float64-level noise
for the same float32-rounded numbers, failing a correct port. The llama float64 export is
relabelled as transformers' ministral and seed_oss (Llama's layout, other classes): each golden
must equal the llama golden's numbers and carry float32's epsilon and a float32-level noise;
GPT-2, float64 throughout, must keep float64's.

Exit status: 0 every check held; 1 otherwise."""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_kit as kit  # noqa: E402

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "golden")
EPS32, EPS64 = 2.0 ** -23, 2.0 ** -52


def produce(python, export_dir, out):
    """The producer's transformers golden of `export_dir` (noise twin included): its manifest, or None."""
    p = subprocess.run([python, os.path.join(GOLDEN, "mih_golden.py"), "--export", export_dir, "--out", out,
                        "--impl", "transformers"], capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    kit.check(p.returncode == 0, "the transformers golden of %s" % os.path.basename(export_dir), p.stdout + p.stderr)
    return kit.read_json(os.path.join(out, "golden.json")) if p.returncode == 0 else None


def relabelled(source, dst, model_type, architecture):
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(source, dst)
    path = os.path.join(dst, "config.json")
    config = kit.read_json(path)
    config["model_type"], config["architectures"] = model_type, [architecture]
    with open(path, "w") as f:
        json.dump(config, f)
    return dst


def logits(golden_dir):
    sys.path.insert(0, GOLDEN)
    import safetensors_io

    tensors, _ = safetensors_io.read(os.path.join(golden_dir, "golden.safetensors"))
    return tensors["logits"]


def main():
    a = kit.parse_args(__doc__)
    kit.run_under(a.python)
    work = kit.fresh_dir(a.work)
    llama = kit.export(a.mih, "llama", os.path.join(work, "llama"), "--dtype", "float64")
    gpt2 = kit.export(a.mih, "gpt2", os.path.join(work, "gpt2"), "--dtype", "float64")
    if llama is None or gpt2 is None:
        return kit.finish()
    base = produce(a.python, llama, os.path.join(work, "llama-golden"))
    kit.check(base is not None and base["compute_epsilon"] == EPS32, "llama's golden is float32-floored")
    for model_type, architecture in (("ministral", "MinistralForCausalLM"), ("seed_oss", "SeedOssForCausalLM")):
        out = os.path.join(work, model_type + "-golden")
        m = produce(a.python, relabelled(llama, os.path.join(work, model_type), model_type, architecture), out)
        if m is None or base is None:
            continue
        same = bool((logits(out) - logits(os.path.join(work, "llama-golden"))).abs().max() == 0)
        kit.check(same, "%s computes the llama export's logits exactly as llama does" % model_type)
        noise = max(m["noise"].values())
        kit.check(m["compute_epsilon"] == EPS32 and noise > 1e3 * EPS64,
                  "%s's golden is float32-floored as llama's: compute_epsilon %.3g (float32's %.3g), largest noise %.3g"
                  % (model_type, m["compute_epsilon"], EPS32, noise))
    m = produce(a.python, gpt2, os.path.join(work, "gpt2-golden"))
    kit.check(m is not None and m["compute_epsilon"] == EPS64,
              "gpt2's golden (float64 throughout) keeps float64's epsilon: %s" % (m or {}).get("compute_epsilon"))
    return kit.finish()


if __name__ == "__main__":
    sys.exit(main())
