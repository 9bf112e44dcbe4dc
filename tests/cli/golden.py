#!/usr/bin/env python3
"""Goldens of the original model through the real `mih` (ctest GoldenOriginal, label golden;
docs/golden.md): `mih golden --spec llama` writes the builtin Llama's golden of the float64
export; MatchesOriginal passes on the llama's Reference against it and against the build's own
goldens (llama and moe, the main job's), and on a float32 lane's LaneReference; every
comparison can fail: a golden with one layer's hidden state perturbed fails naming that layer
(and only the hidden-state test), one gradient perturbed fails naming that parameter (a fused
one through the key map too); goldens that do not belong to the run are refused before any rank
starts, exit 11 naming the hash (another checkpoint: the run's seed 1; another batch; other
trainer options; a stale tensors file), as is an unknown format version (exit 11), a golden of a
spec the run does not select, a compute_epsilon or noise that would loosen the tolerances, a
tensor holding NaN or of another shape (exit 11, naming it); a missing directory is exit 12. The producer refuses an export
whose key map renamed a weight, naming it, and one missing a weight the port wrote once for two names (a tie the
original does not have), naming both. Prints the float64 agreement figures (the largest
relative error per quantity kind) of llama and moe against the builtin.

Exit status: 0 every check held; 1 otherwise; 2 usage."""
import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check  # noqa: E402

REFERENCE = "--gtest_filter=Llama/MatchesOriginal.*/Reference"
TESTS = ["LossAndLogitsMatchOriginal", "HiddenStatesMatchOriginal", "GradientsMatchOriginal", "StepMatchesOriginal"]


def run(cmd, timeout=300):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def results(root):
    """test name -> (status, message) of a run's results.jsonl."""
    out = {}
    path = os.path.join(root, "results.jsonl")
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            if "name" in j and "status" in j:
                out[j["name"]] = (j["status"], j.get("message", ""), j.get("examined", ""))
    return out


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def copy_golden(src, dst, edit_manifest=None, edit_tensor=None, rehash=True):
    """A copy of golden `src`: `edit_tensor(name, values)` changes float64 tensors in place,
    then tensors_sha256 is updated (rehash) unless a stale file is wanted; `edit_manifest(m)`."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    tensors = os.path.join(dst, "golden.safetensors")
    if edit_tensor:
        with open(tensors, "rb") as f:
            data = bytearray(f.read())
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            count = (end - begin) // 8
            values = list(struct.unpack_from("<%dd" % count, data, 8 + n + begin))
            if edit_tensor(name, values):
                struct.pack_into("<%dd" % count, data, 8 + n + begin, *values)
        with open(tensors, "wb") as f:
            f.write(bytes(data))
    with open(os.path.join(dst, "golden.json")) as f:
        m = json.load(f)
    if rehash:
        m["tensors_sha256"] = sha256(tensors)
    if edit_manifest:
        edit_manifest(m)
    with open(os.path.join(dst, "golden.json"), "w") as f:
        json.dump(m, f, indent=2)
    return dst


def perturb(target, index=0, scale=1e-6):
    """Multiplies element `index` of tensor `target` by (1 + scale)."""
    def edit(name, values):
        if name != target:
            return False
        values[index] *= 1 + scale
        return True
    return edit


def scale_all(target, scale):
    """Multiplies every element of tensor `target` by (1 + scale): a relative error of `scale`."""
    def edit(name, values):
        if name != target:
            return False
        values[:] = [v * (1 + scale) for v in values]
        return True
    return edit


def set_nan(target):
    """Sets element 0 of tensor `target` to NaN."""
    def edit(name, values):
        if name != target:
            return False
        values[0] = float("nan")
        return True
    return edit


def reshape(dst, target, shape):
    """Rewrites the header of golden `dst`'s tensors so that `target` has `shape` (the same
    bytes), and its tensors_sha256."""
    tensors = os.path.join(dst, "golden.safetensors")
    with open(tensors, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header[target]["shape"] = shape
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(tensors, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data[8 + n:])
    with open(os.path.join(dst, "golden.json")) as f:
        m = json.load(f)
    m["tensors_sha256"] = sha256(tensors)
    with open(os.path.join(dst, "golden.json"), "w") as f:
        json.dump(m, f, indent=2)
    return dst


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    ap.add_argument("--goldens", required=True, help="the build's goldens (build/goldens)")
    ap.add_argument("--producer", required=True, help="golden/mih_golden.py")
    ap.add_argument("--python", required=True, help="a Python with torch, to run the producer")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    w = lambda *p: os.path.join(a.work, *p)  # noqa: E731

    # The golden, and MatchesOriginal passing against it.
    golden = w("golden")
    rc, out = run([a.mih, "golden", "--spec", "llama", "--out", golden])
    check(rc == 0 and os.path.exists(os.path.join(golden, "golden.json")), "mih golden --spec llama writes a golden", out)
    manifest = json.load(open(os.path.join(golden, "golden.json")))
    check(manifest.get("format") == "mih-golden" and manifest.get("version") == 1 and
          manifest["implementation"]["name"] == "builtin" and manifest["num_hidden_layers"] == 2 and
          len(manifest["noise"]) > 20, "its manifest: format, version, builtin, 2 layers, a noise per quantity",
          json.dumps(manifest)[:600])
    test = [a.mih, "test", "--only-spec", "llama", "--no-progress", "--gtest_brief=1"]
    ok = w("ok")
    rc, out = run(test + ["--golden", golden, "--evidence-root", ok, REFERENCE])
    r = results(ok)
    names = ["Llama/MatchesOriginal.%s/Reference" % t for t in TESTS]
    check(rc == 0 and all(r.get(n, ("",))[0] == "passed" for n in names),
          "MatchesOriginal's 4 tests pass on the llama's Reference against `mih golden`'s golden", out[-3000:])
    evidence = os.path.join(ok, "llama", "Reference", "compare", "golden.json")
    ev = json.load(open(evidence)) if os.path.exists(evidence) else {}
    check(ev.get("passed") is True and len(ev.get("quantities", [])) > 40 and
          set(ev.get("largest_relative_error", {})) == {"loss", "logits", "hidden_states", "gradients", "parameters_after_step"},
          "compare/golden.json records every quantity's error, noise and tolerance and the largest per kind",
          json.dumps(ev)[:800])
    examined = r.get(names[1], ("", "", ""))[2]
    check("largest error / tolerance" in examined, "a pass says its largest error / tolerance: " + examined[:200])

    def expect_fails(golden_dir, failing, pattern, what):
        root = w("p-" + failing)
        shutil.rmtree(root, ignore_errors=True)  # a second perturbation of the same quantity reuses the name
        shutil.copytree(os.path.join(ok, "llama"), os.path.join(root, "llama"))  # the same evidence, reused
        record = os.path.join(root, "llama", "Reference", "case_run.json")
        before = open(record, "rb").read() if os.path.exists(record) else None
        rc, out = run(test + ["--golden", golden_dir, "--evidence-root", root, REFERENCE])
        reused = before is not None and os.path.exists(record) and open(record, "rb").read() == before
        r = results(root)
        failed = sorted(n for n, v in r.items() if v[0] == "failed")
        message = r.get("Llama/MatchesOriginal.%s/Reference" % failing, ("", ""))[1]
        check(rc == 1 and failed == ["Llama/MatchesOriginal.%s/Reference" % failing] and all(p in message for p in pattern)
              and reused,
              what + " (only %s fails: %s)" % (failing, failed), message[-1500:] or out[-2000:])
        return message

    msg = expect_fails(copy_golden(golden, w("hidden"), edit_tensor=perturb("hidden_states.2")), "HiddenStatesMatchOriginal",
                       ["localized to 'layers.1'", "hidden_states.2", "forward output of module 'layers.1'"],
                       "one layer's hidden state perturbed by 1e-6 of one element fails naming that layer")
    print("      " + msg.splitlines()[0][:300] if msg else "")
    expect_fails(copy_golden(golden, w("grad"), edit_tensor=perturb("grad.model.layers.0.mlp.down_proj.weight")),
                 "GradientsMatchOriginal",
                 ["localized to 'layers.0.mlp.down_proj'", "parameter 'layers.0.mlp.down_proj.weight'",
                  "grad.model.layers.0.mlp.down_proj.weight"],
                 "one gradient perturbed fails naming that parameter")
    expect_fails(copy_golden(golden, w("fused"), edit_tensor=perturb("grad.model.layers.1.mlp.up_proj.weight", 7)),
                 "GradientsMatchOriginal",
                 ["parameter 'layers.1.mlp.gate_up_proj.weight'", "grad.model.layers.1.mlp.up_proj.weight"],
                 "a gradient of a fused parameter perturbed names the port's parameter and the golden's key")
    expect_fails(copy_golden(golden, w("step"), edit_tensor=perturb("param_after_step.model.norm.weight", 3, 1e-3)),
                 "StepMatchesOriginal", ["parameter 'norm.weight'", "after_optimizer"],
                 "a parameter after the step perturbed fails the step test naming it")
    expect_fails(copy_golden(golden, w("logits"), edit_tensor=perturb("logits", 11)), "LossAndLogitsMatchOriginal",
                 ["localized to 'lm_head'"], "the logits perturbed fail naming the head")

    # Refused before any rank starts.
    def refused(args, code, pattern, what):
        root = w("r-%d" % len(FAILURES) + "-" + what[:12].replace(" ", "_"))
        rc, out = run(test + args + ["--evidence-root", root, REFERENCE])
        check(rc == code and all(p in out for p in pattern) and not os.path.exists(os.path.join(root, "llama")),
              what + " (exit %d, no case started)" % code, out[-2000:])

    refused(["--golden", golden, "--seed", "1"], 11, ["its checkpoint_sha256 is " + manifest["checkpoint_sha256"]],
            "a golden of another checkpoint (the run's seed 1) is refused naming checkpoint_sha256")
    refused(["--golden", copy_golden(golden, w("batch"), lambda m: m.update(batch_sha256="0" * 64))], 11,
            ["its batch_sha256 is " + "0" * 64, "batch.safetensors, the first global batch"],
            "a golden of another batch is refused naming batch_sha256")
    refused(["--golden", copy_golden(golden, w("training"), lambda m: m.update(training_sha256="1" * 64))], 11,
            ["its training_sha256 is " + "1" * 64], "a golden of other trainer options is refused naming training_sha256")
    refused(["--golden", copy_golden(golden, w("stale"), edit_tensor=perturb("loss"), rehash=False)], 11,
            ["tensors_sha256 " + manifest["tensors_sha256"], "a stale or edited golden"],
            "a stale tensors file is refused naming tensors_sha256")
    refused(["--golden", copy_golden(golden, w("v2"), lambda m: m.update(version=2))], 11,
            ["golden format version 2 is not one this mih reads"], "an unknown golden format version is refused")
    # What no hash covers and the tolerances follow from, and tensors a comparison would read.
    refused(["--golden", copy_golden(golden, w("eps"), lambda m: m.update(compute_epsilon=0.5))], 11,
            ["\"compute_epsilon\" is 0.5"], "a compute_epsilon that is not float64's is refused")
    refused(["--golden", copy_golden(golden, w("eps32"), lambda m: (m.update(compute_epsilon=0.5),
                                                                      m["implementation"].update(name="transformers")))],
            11, ["\"compute_epsilon\" is 0.5", "float32's 1.19209e-07"],
            "a transformers golden's compute_epsilon that is neither float64's nor float32's is refused, naming both")
    refused(["--golden", copy_golden(golden, w("noisy"), lambda m: m["noise"].update({k: 1e10 for k in m["noise"]}))],
            11, ["must be a number in [0, "], "a noise larger than a float64 noise twin's is refused")
    refused(["--golden", copy_golden(golden, w("nan"), edit_tensor=set_nan("hidden_states.1"))], 11,
            ["'hidden_states.1' holds 1 non-finite value"], "a golden tensor holding NaN is refused, naming it")
    refused(["--golden", reshape(copy_golden(golden, w("shape")), "hidden_states.1", [512, 64])], 11,
            ["'hidden_states.1' has shape [512,64]"], "a golden hidden state of another shape is refused, naming it")
    refused(["--golden", w("nope")], 12, ["is not a directory"], "a missing golden directory is an environment error")
    rc, out = run([a.mih, "test", "--only-spec", "moe", "--golden", golden, "--evidence-root", w("moe-llama"),
                   "--gtest_filter=Moe/MatchesOriginal.*/Reference"])
    check(rc == 11 and "is a golden of spec 'llama', which this run does not select" in out,
          "a golden of another spec is refused", out[-1500:])

    # The build's goldens: the main job runs MatchesOriginal on llama and moe.
    rc, out = run([a.mih, "test", "--gtest_list_tests"])
    listed, suite = set(), ""
    for line in out.splitlines():  # GoogleTest's list: "Prefix/Suite." then "  Test/Case  # GetParam() = ..."
        if line and not line.startswith(" "):
            suite = line.strip()
        elif suite:
            listed.add(suite + line.split()[0])
    for prefix in ("Llama", "Moe"):
        check(rc == 0 and all("%s/MatchesOriginal.%s/Reference" % (prefix, t) in listed for t in TESTS),
              "the main job's test list holds %s/MatchesOriginal (the build's golden in %s)" % (prefix, a.goldens),
              out[-1500:])
    main = w("main")
    rc, out = run([a.mih, "test", "--evidence-root", main, "--no-progress", "--gtest_brief=1",
                   "--gtest_filter=Llama/MatchesOriginal.*/Reference:Moe/MatchesOriginal.*/Reference"])
    check(rc == 0 and len([v for v in results(main).values() if v[0] == "passed"]) == 8,
          "MatchesOriginal passes on the llama and moe Reference against the build's goldens", out[-3000:])
    # Which original each build golden is (transformers where the build had it, else the builtin).
    impl = {s: json.load(open(os.path.join(a.goldens, s, "golden.json")))["implementation"]["name"]
            for s in ("llama", "moe")}
    for spec in ("llama", "moe"):
        path = os.path.join(main, spec, "Reference", "compare", "golden.json")
        if os.path.exists(path):
            e = json.load(open(path))
            print("      %s float64 agreement with the %s original, largest relative error per kind: %s; largest error / "
                  "tolerance %.3g (%s)" % (spec, impl[spec], json.dumps(e["largest_relative_error"]),
                                           e["max_error_over_tolerance"], e["worst"]))
    # The report shows the comparison with the original model: per case the golden, the largest
    # error / tolerance and the largest relative error per kind.
    rc, out = run([a.mih, "report", main, "--format", "md", "-o", w("report.md")])
    text = open(w("report.md")).read() if os.path.exists(w("report.md")) else ""
    rows = [l for l in text.splitlines()
            if any(l.startswith("| %s/Reference | %s" % (s, impl[s])) for s in ("llama", "moe"))]
    check(rc == 0 and "## Against the original model" in text and len(rows) == 2
          and all(" **FAIL**" not in r for r in rows),
          "mih report shows the comparison with the original model for llama and moe (largest error / tolerance, "
          "largest relative error per kind)", text[-2000:])
    for r in rows:
        print("      " + r)
    if impl["llama"] == "transformers":
        # transformers rounds to float32 inside: its twin's noise, not a float32 epsilon per
        # sqrt(element) of the probes' float64 sums, sets the tolerance (a gradient off by
        # 3e-5 passed when it did, 100 times transformers' own rounding).
        build = os.path.join(a.goldens, "llama")
        expect_fails(copy_golden(build, w("tf-grad"), edit_tensor=scale_all("grad.model.layers.0.self_attn.k_proj.weight",
                                                                              3e-5)),
                     "GradientsMatchOriginal", ["parameter 'layers.0.self_attn.k_proj.weight'"],
                     "against transformers' golden, a gradient off by a relative 3e-5 fails")
        refused(["--golden", copy_golden(build, w("tf-noisy"), lambda m: m["noise"].update({k: 1e-3 for k in m["noise"]}))],
                11, ["at most 100 float32 epsilons"], "a transformers golden's noise above 100 float32 epsilons is refused")
    lane = w("lane")
    rc, out = run(test + ["--dtype", "float32", "--evidence-root", lane,
                          "--gtest_filter=Llama/MatchesOriginal.*/LaneReference"])
    check(rc == 0 and len([v for v in results(lane).values() if v[0] == "passed"]) == 4,
          "on a float32 lane MatchesOriginal passes on the LaneReference at the lane's calibrated tolerances",
          out[-3000:])

    # The producer reads the export as the original does: a weight the key map renamed is named.
    export = w("renamed")
    shutil.copytree(os.path.join(golden, "export"), export)
    path = os.path.join(export, "model.safetensors")
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header["model.layers.0.mlp.gate.weight"] = header.pop("model.layers.0.mlp.gate_proj.weight")
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data[8 + n:])
    p = subprocess.run([a.python, a.producer, "--export", export, "--out", w("renamed-golden")],
                       capture_output=True, text=True, timeout=300)
    check(p.returncode == 11 and "the checkpoint has no 'model.layers.0.mlp.gate_proj.weight'" in p.stderr,
          "the producer refuses an export missing a weight the architecture reads, naming it (exit 11)",
          p.stdout + p.stderr)

    # A tie the original does not have (issue 52): llama_tied's export writes the head once, as
    # the embedding; an original that keeps them apart misses lm_head.weight, named with both
    # of the port's names for it.
    tied = w("tied")
    rc, out = run([a.mih, "export", "--spec", "llama_tied", "--dtype", "float64", "--out", tied])
    check(rc == 0 and "'lm_head.weight' is 'embed_tokens.weight' (a declared tie)" in out,
          "mih export names a declared tie it writes once", out)
    config = json.load(open(os.path.join(tied, "config.json")))
    config["tie_word_embeddings"] = False
    with open(os.path.join(tied, "config.json"), "w") as f:
        json.dump(config, f)
    p = subprocess.run([a.python, a.producer, "--export", tied, "--out", w("tied-golden")],
                       capture_output=True, text=True, timeout=300)
    check(p.returncode == 11 and "the checkpoint has no 'lm_head.weight'" in p.stderr and
          "'lm_head.weight' is an alias of 'embed_tokens.weight' in the port" in p.stderr,
          "the producer refuses an export missing a weight the port wrote once for two names, naming both (exit 11)",
          p.stdout + p.stderr)
    print("%d failure(s)" % len(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
