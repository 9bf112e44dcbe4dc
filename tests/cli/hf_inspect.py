#!/usr/bin/env python3
"""`mih export`, `mih inspect`, `mih run --init-from` and `mih test --init-from` as a model
author runs them (ctest HfInspect, label session): an export of the llama spec inspects clean
(exit 0, state DISCOVERED); a changed config field, a weight left as a Git LFS pointer, a URL
and a missing directory each fail with the thing named and nothing downloaded. Cases
initialized from a checkpoint train from its weights (the step-0 loss is the export's), a
tp=2 case from it matches its reference from it, and one from the seed's weights diverges
from that reference. `mih test --init-from` starts a few cases and their reference from an
export of another seed and passes every suite (SourceCheckpoint on the export's keys); one
changed byte of a weight relaunches the memoized cases; a missing key fails before any case
starts, an unexpected key fails the source-key test, a NaN weight fails the finite check on
the loaded weights.

Exit status: 0 every check held; 1 otherwise; 2 usage."""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check  # noqa: E402


def run(mih, *args, cwd=None):
    p = subprocess.run([mih, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


def read_safetensors(path):
    """(header dict, data bytes) of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        return header, f.read()


def write_safetensors(path, header, data):
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def results(root):
    """name -> passed of every test in a run's results.jsonl."""
    out = {}
    with open(os.path.join(root, "results.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if "name" in j and "status" in j:
                out[j["name"]] = j["status"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    export = os.path.join(a.work, "llama-hf")
    rc, out = run(a.mih, "export", "--spec", "llama", "--out", export)
    check(rc == 0 and "config.json (llama)" in out, "export --spec llama writes a Hugging Face checkpoint", out)
    rc, out = run(a.mih, "inspect", "--spec", "llama", "--hf-dir", export, cwd=a.work)
    state = os.path.join(a.work, "mih-evidence", "inspect", "llama", "integration_state.json")
    check(rc == 0 and "0 differences" in out and "state DISCOVERED" in out, "the export inspects clean (exit 0)", out)
    check(os.path.exists(state) and json.load(open(state))["state"] == "DISCOVERED",
          "inspect's default evidence directory is under where it runs, state DISCOVERED")
    sums = os.path.join(a.work, "mih-evidence", "inspect", "llama", "inventory", "fingerprints.sha256")
    p = subprocess.run(["sha256sum", "-c", sums], cwd=export, capture_output=True, text=True)
    check(p.returncode == 0, "fingerprints.sha256 verifies with sha256sum -c in the checkpoint directory",
          p.stdout + p.stderr)

    changed = os.path.join(a.work, "changed")
    shutil.copytree(export, changed)
    cfg = json.load(open(os.path.join(changed, "config.json")))
    cfg["num_key_value_heads"] = 4
    json.dump(cfg, open(os.path.join(changed, "config.json"), "w"))
    rc, out = run(a.mih, "inspect", "--spec", "llama", "--hf-dir", changed, "--out", os.path.join(a.work, "e2"))
    check(rc == 1 and "config field    num_key_value_heads: the port has 2, config.json 4" in out,
          "a changed config field: exit 1 naming the field and both values", out)
    check(not os.path.exists(os.path.join(a.work, "e2", "integration_state.json")),
          "a checkpoint that differs does not move the state")

    lfs = os.path.join(a.work, "lfs")
    shutil.copytree(export, lfs)
    with open(os.path.join(lfs, "model.safetensors"), "w") as f:
        f.write("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize 1234\n" % ("0" * 64))
    rc, out = run(a.mih, "inspect", "--spec", "llama", "--hf-dir", lfs, "--out", os.path.join(a.work, "e3"))
    check(rc not in (0, 1) and "model.safetensors is a Git LFS pointer" in out and "git lfs pull" in out,
          "a Git LFS pointer is bad input naming the file and the fix (not a difference)", out)
    for url in ("https://huggingface.co/meta-llama/Llama-3.2-1B", "hf://meta-llama/Llama-3.2-1B"):
        rc, out = run(a.mih, "inspect", "--spec", "llama", "--hf-dir", url, "--out", os.path.join(a.work, "e4"))
        check(rc not in (0, 1) and "mih never downloads" in out, "a URL is refused: " + url, out)
    rc, out = run(a.mih, "inspect", "--spec", "llama", "--hf-dir", os.path.join(a.work, "nope"),
                  "--out", os.path.join(a.work, "e5"))
    check(rc not in (0, 1) and "does not exist" in out, "a missing directory is named", out)
    rc, out = run(a.mih, "export", "--spec", "gpt3", "--out", os.path.join(a.work, "x"))
    check(rc not in (0, 1) and "gpt3" in out and "llama" in out, "export of an unknown spec lists the known ones", out)
    # Cases initialized from a checkpoint (another seed's float64 export).
    hf5 = os.path.join(a.work, "hf-seed5")
    rc, out = run(a.mih, "export", "--spec", "llama", "--seed", "5", "--dtype", "float64", "--out", hf5)
    check(rc == 0, "export --seed 5 --dtype float64", out)
    exported_loss = json.load(open(os.path.join(hf5, "mih_export.json")))["loss"]
    roots = {"with": os.path.join(a.work, "with"), "without": os.path.join(a.work, "without")}
    for case in ("Reference", "Tp2Sp"):
        rc, out = run(a.mih, "run", "--spec", "llama", "--case", case, "--init-from", hf5, "--evidence-root", roots["with"])
        check(rc == 0, "mih run --case %s --init-from" % case, out)
    rc, out = run(a.mih, "run", "--spec", "llama", "--case", "Tp2Sp", "--evidence-root", roots["without"])
    check(rc == 0, "mih run --case Tp2Sp from the seed", out)

    def step0_loss(root, case):
        with open(os.path.join(root, "llama", case, "cases", "runtime", "metrics.jsonl")) as f:
            return json.loads(f.readline())["loss"]
    loss = step0_loss(roots["with"], "Reference")
    check(abs(loss - exported_loss) <= 1e-9 * abs(exported_loss),
          "the step-0 loss of a case initialized from the export is the export's (%.12f vs %.12f)" % (loss, exported_loss))
    seed = step0_loss(roots["without"], "Tp2Sp")
    check(abs(seed - exported_loss) > 1e-6, "from the seed's weights the step-0 loss differs (%.6f)" % seed)
    case_json = json.load(open(os.path.join(roots["with"], "llama", "Reference", "run", "case.json")))
    check(case_json.get("init_from") == os.path.abspath(hf5), "case.json names the checkpoint", json.dumps(case_json)[:300])
    ref = os.path.join(roots["with"], "llama", "Reference")
    rc, out = run(a.mih, "compare", ref, os.path.join(roots["with"], "llama", "Tp2Sp"))
    check(rc == 0 and "match:" in out, "Tp2Sp from the checkpoint matches its reference from the checkpoint", out)
    rc, out = run(a.mih, "compare", ref, os.path.join(roots["without"], "llama", "Tp2Sp"))
    check(rc == 1 and "embed_tokens" in out, "Tp2Sp from the seed diverges from the checkpoint's reference", out)
    rc, out = run(a.mih, "run", "--spec", "llama", "--case", "Reference", "--init-from", lfs,
                  "--evidence-root", os.path.join(a.work, "e6"))
    check(rc not in (0, 1) and "Git LFS pointer" in out and not os.path.exists(os.path.join(a.work, "e6", "llama")),
          "run --init-from an LFS pointer fails before any rank starts", out)
    init_from_tests(a, hf5, exported_loss)
    print("%d failure(s)" % len(FAILURES))
    return 1 if FAILURES else 0


def init_from_tests(a, hf5, exported_loss):
    """`mih test --init-from`: a whole selection of cases and its reference from a checkpoint."""
    ckpt = os.path.join(a.work, "ckpt")
    shutil.copytree(hf5, ckpt)
    some = "Llama/*.*/Reference:Llama/*.*/Tp2Sp:Llama/*.*/DpShard2"
    rc, out = run(a.mih, "test", "--init-from", ckpt, "--evidence-root", os.path.join(a.work, "t0"), "--gtest_filter=" + some)
    check(rc == 11 and "add --only-spec NAME" in out and not os.path.exists(os.path.join(a.work, "t0", "llama")),
          "test --init-from with several specs selected is bad input naming --only-spec, before any case", out)
    # A spec that names no source checkpoint: from a checkpoint, SourceCheckpoint applies to its cases.
    listed = {}
    for extra in ([], ["--init-from", ckpt]):
        rc, out = run(a.mih, "test", "--only-spec", "llama_tied", *extra, "--gtest_list_tests")
        listed[bool(extra)] = rc == 0 and "LlamaTied/SourceCheckpoint." in out
    check(listed == {False: False, True: True},
          "SourceCheckpoint applies to the cases of a spec without checkpoint.source exactly when they start from "
          "a checkpoint (%s)" % listed)
    t1 = os.path.join(a.work, "t1")
    test = [a.mih, "test", "--only-spec", "llama", "--init-from", ckpt, "--evidence-root", t1]
    rc, out = run(*test, "--gtest_filter=" + some)
    r = results(t1) if os.path.exists(os.path.join(t1, "results.jsonl")) else {}
    parity = [n for n in r if n.startswith("Llama/NumericParity.")]
    source = [n for n in r if n.startswith("Llama/SourceCheckpoint.")]
    check(rc == 0 and len(parity) >= 4 and all(r[n] == "passed" for n in r) and len(source) == 3,
          "test --only-spec llama --init-from: Reference, Tp2Sp and DpShard2 from another seed's export pass every "
          "suite, NumericParity (%d tests) and SourceCheckpoint on the export's keys (%d) included" % (len(parity), len(source)),
          out[-3000:])
    for case in ("Reference", "Tp2Sp", "DpShard2"):
        cj = json.load(open(os.path.join(t1, "llama", case, "run", "case.json")))
        spec = json.load(open(os.path.join(t1, "llama", case, "spec.resolved.json")))["checkpoint"]
        check(cj.get("init_from") == os.path.abspath(ckpt) and len(cj.get("init_from_sha256", "")) == 64 and
              spec.get("source") == os.path.abspath(ckpt), case + " started from the checkpoint, which is "
              "its source checkpoint too", json.dumps(cj)[:300])

    def step0(root, case):
        with open(os.path.join(root, "llama", case, "cases", "runtime", "metrics.jsonl")) as f:
            return json.loads(f.readline())["loss"]
    loss = step0(t1, "Reference")
    check(abs(loss - exported_loss) <= 1e-9 * abs(exported_loss), "the reference's step-0 loss is the export's")
    seed_root = os.path.join(a.work, "t1-seed")
    rc, out = run(a.mih, "test", "--only-spec", "llama", "--evidence-root", seed_root, "--gtest_filter=" + some)
    check(rc == 0, "the same cases without --init-from pass", out[-2000:])
    for case in ("Reference", "Tp2Sp", "DpShard2"):
        seed = step0(seed_root, case) if os.path.exists(os.path.join(seed_root, "llama", case)) else None
        check(seed is not None and abs(seed - step0(t1, case)) > 1e-6,
              "%s without --init-from has another step-0 loss (%s vs %.9f)" % (case, seed, step0(t1, case)))
    values = os.path.join(t1, "llama", "Tp2Sp", "check", "loaded_values.json")
    inv = json.load(open(values)) if os.path.exists(values) else {}
    check(inv.get("weights", "").startswith("checkpoint " + os.path.abspath(ckpt)) and inv.get("non_finite") == [],
          "the finite check examined the loaded weights, and says which", json.dumps(inv))
    rc, out = run(a.mih, "check", os.path.join(t1, "llama", "Tp2Sp"))
    check(rc == 0 and "SourceCheckpoint.NoUnexpectedOrMissingSourceKey/Tp2Sp" in out,
          "mih check of a case from a checkpoint checks its source keys too", out[-2000:])

    # The memoized reference is reused only for the same bytes.
    parity_only = "--gtest_filter=Llama/NumericParity.*/Tp2Sp"
    rc, out = run(*test, parity_only)
    check(rc == 0 and "0 case(s) launched" in out and "relaunching" not in out,
          "a rerun from the same checkpoint reuses the reference and the case", out[-2000:])
    header, data = read_safetensors(os.path.join(ckpt, "model.safetensors"))
    data = bytes([data[0] ^ 1]) + data[1:]  # the lowest byte of the first weight's first element
    write_safetensors(os.path.join(ckpt, "model.safetensors"), header, data)
    rc, out = run(*test, parity_only)
    check(rc == 0 and "mih: relaunching llama/Reference: it started from a checkpoint with SHA-256" in out
          and "2 case(s) launched" in out,
          "one changed byte of a weight relaunches the memoized reference (and the case), never reuses it", out[-2000:])

    # A checkpoint missing a key the port loads: bad input before any case starts, naming it.
    missing = os.path.join(a.work, "missing-key")
    shutil.copytree(ckpt, missing)
    header, data = read_safetensors(os.path.join(missing, "model.safetensors"))
    header["model.layers.1.mlp.down.weight"] = header.pop("model.layers.1.mlp.down_proj.weight")
    write_safetensors(os.path.join(missing, "model.safetensors"), header, data)
    t2 = os.path.join(a.work, "t2")
    rc, out = run(a.mih, "test", "--only-spec", "llama", "--init-from", missing, "--evidence-root", t2,
                  "--gtest_filter=Llama/*.*/Reference")
    check(rc == 11 and "the checkpoint has no 'model.layers.1.mlp.down_proj.weight' (needed for "
          "'layers.1.mlp.down_proj.weight')" in out and not os.path.exists(os.path.join(t2, "llama")),
          "a missing key fails before any case starts, naming it (exit 11)", out[-2000:])
    rc, out = run(a.mih, "run", "--spec", "llama", "--case", "Reference", "--init-from", missing, "--evidence-root", t2)
    check(rc == 11 and "model.layers.1.mlp.down_proj.weight" in out and not os.path.exists(os.path.join(t2, "llama")),
          "mih run --init-from of the same fails before any rank starts", out[-2000:])

    # A key the port does not load: the source-key test fails, naming it.
    extra = os.path.join(a.work, "extra-key")
    shutil.copytree(ckpt, extra)
    header, data = read_safetensors(os.path.join(extra, "model.safetensors"))
    header["model.layers.1.mlp.extra.weight"] = {"dtype": "F64", "shape": [2], "data_offsets": [len(data), len(data) + 16]}
    write_safetensors(os.path.join(extra, "model.safetensors"), header, data + bytes(16))
    rc, out = run(a.mih, "test", "--only-spec", "llama", "--init-from", extra, "--evidence-root", os.path.join(a.work, "t3"),
                  "--gtest_filter=Llama/SourceCheckpoint.*/Reference")
    check(rc == 1 and "model.layers.1.mlp.extra.weight" in out and "[  FAILED  ] Llama/SourceCheckpoint" in out,
          "a key of the checkpoint the port does not load fails SourceCheckpoint, naming it", out[-2000:])

    # A NaN weight: the finite check of the materialized weights sees the loaded values.
    nan = os.path.join(a.work, "nan-weight")
    shutil.copytree(ckpt, nan)
    header, data = read_safetensors(os.path.join(nan, "model.safetensors"))
    begin = header["model.norm.weight"]["data_offsets"][0]
    data = data[:begin] + struct.pack("<d", float("nan")) + data[begin + 8:]
    write_safetensors(os.path.join(nan, "model.safetensors"), header, data)
    rc, out = run(a.mih, "test", "--only-spec", "llama", "--init-from", nan, "--evidence-root", os.path.join(a.work, "t4"),
                  "--gtest_filter=Llama/Structure.ParametersAndBuffersFinite/Reference")
    check(rc == 1 and "norm.weight" in out and "in the weights of checkpoint " + os.path.abspath(nan) in out,
          "a NaN weight of the checkpoint fails the finite check, naming the parameter and the checkpoint", out[-2000:])
    seed_values = os.path.join(seed_root, "llama", "Reference", "check", "loaded_values.json")
    check(not os.path.exists(seed_values), "a case from the seed has no loaded weights to check again")


if __name__ == "__main__":
    sys.exit(main())
