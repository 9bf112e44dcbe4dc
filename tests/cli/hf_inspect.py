#!/usr/bin/env python3
"""`mih export`, `mih inspect` and `mih run --init-from` as a model author runs them (ctest
HfInspect, label session): an export of the llama spec inspects clean (exit 0, state
DISCOVERED); a changed config field, a weight left as a Git LFS pointer, a URL and a missing
directory each fail with the thing named and nothing downloaded. Cases initialized from a
checkpoint train from its weights (the step-0 loss is the export's), a tp=2 case from it
matches its reference from it, and one from the seed's weights diverges from that reference.

Exit status: 0 every check held; 1 otherwise; 2 usage."""
import argparse
import json
import os
import shutil
import subprocess
import sys

FAILURES = []


def check(ok, what, detail=""):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        FAILURES.append(what)
        if detail:
            print("      " + detail.replace("\n", "\n      ")[-3000:])


def run(mih, *args, cwd=None):
    p = subprocess.run([mih, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout + p.stderr


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
    rc, out = run(a.mih, "export", "--spec", "gpt2", "--out", os.path.join(a.work, "x"))
    check(rc not in (0, 1) and "gpt2" in out and "llama" in out, "export of an unknown spec lists the known ones", out)
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
    print("%d failure(s)" % len(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
