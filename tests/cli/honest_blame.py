#!/usr/bin/env python3
"""A port that never declares its module outputs gets an honest blame (ctest HonestBlame, label
runtime), black box through the real `mih`: llama_unobserved (the llama without a single
ParallelContext::observe call) with fault F21 (the causal mask in local coordinates under
context parallelism) on Cp2Zz fails NumericParity with the loss blamed and the reason it can
go no further ("no module outputs were observed (the port never calls
ParallelContext::observe): the blame cannot go below 'loss'", and how to observe them), never
the vacuous "every module's forward output matches"; its activation probes recorded no module.
The llama that observes its modules, with the same fault, still names the attention; and
its evidence with every activation probe line emptied (what a port without observe calls
records), checked again with `mih check --allow-edited-evidence`, gets the same honest blame.

Exit status: 0 every check held; 1 otherwise."""
import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check  # noqa: E402

HONEST = ("no module outputs were observed (the port never calls ParallelContext::observe): "
          "the blame cannot go below 'loss'")


def mih_test(mih, root, prefix):
    cmd = [mih, "test", "--prefixes", prefix, "--evidence-root", root, "--no-progress", "--gtest_brief=1",
           "--fault", "F21", "--fault-cases", "Cp2Zz", f"--gtest_filter={prefix}/NumericParity.LossMatchesReference/Cp2Zz"]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    root = os.path.join(a.work, "unobserved")
    r = mih_test(a.mih, root, "LlamaUnobserved")
    blamed = [line.strip() for line in r.stdout.splitlines() if line.strip().startswith("localized to")]
    print("      " + (blamed[0] if blamed else "(no localization printed)")[:400])
    check(r.returncode == 1 and blamed and blamed[0].startswith("localized to 'loss': " + HONEST),
          f"llama_unobserved/Cp2Zz with F21: the loss is blamed and the reason says nothing was observed "
          f"(exit {r.returncode})", r.stdout[-3000:])
    check("every module's forward output matches" not in r.stdout and "add ctx.observe(module, output, layout)" in r.stdout,
          "no vacuous claim about module outputs, and the fix is named")
    probes = os.path.join(root, "llama_unobserved", "Cp2Zz", "probes", "rank0.jsonl")
    try:
        with open(probes) as f:
            lines = [json.loads(x) for x in f if x.strip()]
        activation = [x for x in lines if x["stage"] in ("forward_output", "output_grad")]
        check(activation and all(x["order"] == [] for x in activation),
              f"its activation probes recorded no module ({len(activation)} activation lines, all empty)")
    except (OSError, ValueError, KeyError) as e:
        check(False, "llama_unobserved/Cp2Zz probes are readable", str(e))
    # The same fault in the port that observes its modules: the attention is named.
    r = mih_test(a.mih, os.path.join(a.work, "observed"), "Llama")
    check(r.returncode == 1 and "localized to 'layers.0.self_attn'" in r.stdout and HONEST not in r.stdout,
          f"llama/Cp2Zz with F21: localized to 'layers.0.self_attn' (exit {r.returncode})", r.stdout[-3000:])
    # The same evidence as a port that observes nothing would write it: the activation probe
    # lines of the case and of its reference hold no module.
    blind = os.path.join(a.work, "blind")
    shutil.copytree(os.path.join(a.work, "observed"), blind, symlinks=True)
    try:
        for case in ("Cp2Zz", "Reference"):
            path = os.path.join(blind, "llama", case, "probes", "rank0.jsonl")
            with open(path) as f:
                lines = [json.loads(x) for x in f if x.strip()]
            for x in lines:
                if x["stage"] in ("forward_output", "output_grad"):
                    x["order"], x["tensors"] = [], {}
            with open(path, "w") as f:
                f.writelines(json.dumps(x) + "\n" for x in lines)
    except (OSError, ValueError, KeyError) as e:
        check(False, "llama/Cp2Zz evidence is readable", str(e))
    r = subprocess.run([a.mih, "check", os.path.join(blind, "llama", "Cp2Zz"), "--allow-edited-evidence", "--no-progress",
                        "--gtest_brief=1"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    blamed = [line.strip() for line in r.stdout.splitlines() if line.strip().startswith("localized to")]
    print("      " + (blamed[0] if blamed else "(no localization printed)")[:400])
    check(r.returncode == 1 and blamed and blamed[0].startswith("localized to 'loss': " + HONEST)
          and "every module's forward output matches" not in r.stdout,
          f"llama/Cp2Zz with F21, its activation probes emptied, checked again: the loss is blamed, nothing observed "
          f"said (exit {r.returncode})", r.stdout[-3000:])
    print(f"{'all checks held' if not FAILURES else str(len(FAILURES)) + ' check(s) failed'}")
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
