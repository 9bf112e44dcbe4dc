#!/usr/bin/env python3
"""What a hostile user of the installed `mih` found (issue 53) holds now (ctest CliRobustness,
label runtime): black-box runs of the real `mih` binary.

7. `mih golden --out DIR` never overwrites what it did not write: a DIR holding the user's own
   golden.json and golden.safetensors (or any other file) is refused (exit 12, naming
   mih_golden.json) before anything is written; a producer that exits 0 but writes nothing is
   exit 12 naming the missing files, never a success; a golden mih wrote is rewritten, an
   edited one refused.
8. `mih check` of a root writes nothing into it: on a read-only bind mount of the root (as
   root; the tree hash otherwise) it gives the true verdict (exit 0), the tree byte-identical.

Exit status: 0 every check held; 1 otherwise; 2 usage."""
import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check, run  # noqa: E402

LLAMA_REFERENCE = "--gtest_filter=Llama/*.*/Reference"


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def tree(root):
    """Every entry under `root`: relative path -> the SHA-256 of a file, 'dir' or 'link -> target'."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(d, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = "link -> " + os.readlink(path)
            elif os.path.isdir(path):
                out[rel] = "dir"
            else:
                out[rel] = sha256(path)
    return out


def write(path, text, mode=0o644):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


def golden_keeps_what_mih_did_not_write(mih, work):
    """7."""
    base = os.path.join(work, "golden")
    os.makedirs(base)
    # A stand-in producer (run by /bin/sh as --python): writes what mih_golden.py writes.
    producer = write(os.path.join(base, "producer.sh"),
                     'while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done\n'
                     'printf \'{"format": "stand-in"}\\n\' > "$out/golden.json"\n'
                     'printf tensors > "$out/golden.safetensors"\n')

    def golden(out, python="/bin/sh"):
        return run(mih, ["golden", "--spec", "llama", "--out", out, "--python", python, "--producer", producer])

    mine = os.path.join(base, "mine")
    os.makedirs(mine)
    write(os.path.join(mine, "golden.json"), '{"mine": true}\n')
    write(os.path.join(mine, "golden.safetensors"), "my tensors")
    before = tree(mine)
    g = golden(mine)
    check(g.returncode == 12 and "mih_golden.json" in g.stdout and tree(mine) == before,
          f"7: mih golden into a directory holding the user's own golden refuses it, writing nothing (exit "
          f"{g.returncode}; {sorted(set(tree(mine)) ^ set(before)) or 'unchanged'})", g.stdout[-1500:])

    empty = os.path.join(base, "empty")
    g = golden(empty, python="/bin/true")
    check(g.returncode == 12 and "golden.json" in g.stdout and "golden.safetensors" in g.stdout
          and not os.path.exists(os.path.join(empty, "mih_golden.json")),
          f"7: a producer that exits 0 and writes nothing is no success (exit {g.returncode})", g.stdout[-1500:])

    ours = os.path.join(base, "ours")
    first = golden(ours)
    again = golden(ours)
    check(first.returncode == 0 and again.returncode == 0 and os.path.exists(os.path.join(ours, "mih_golden.json")),
          f"7: a golden mih wrote is recorded and rewritten (exit {first.returncode}, then {again.returncode})",
          (first.stdout + again.stdout)[-1500:])
    write(os.path.join(ours, "golden.json"), '{"edited": true}\n')
    g = golden(ours)
    check(g.returncode == 12 and "edited" in g.stdout and open(os.path.join(ours, "golden.json")).read() ==
          '{"edited": true}\n', f"7: an edited golden.json is refused and kept (exit {g.returncode})", g.stdout[-1500:])


def check_on_read_only_evidence(mih, work):
    """8."""
    root = os.path.join(work, "read-only")
    t = run(mih, ["test", "--evidence-root", root, "--no-progress", "--gtest_brief=1", LLAMA_REFERENCE])
    check(t.returncode == 0, f"8: the llama Reference run passes (exit {t.returncode})", t.stdout[-1500:])
    mounted = False
    if os.geteuid() == 0:
        bind = subprocess.run(["mount", "--bind", root, root], capture_output=True, text=True)
        mounted = bind.returncode == 0 and subprocess.run(["mount", "-o", "remount,bind,ro", root]).returncode == 0
    if not mounted:
        print("note: not root (or no bind mount): mih check runs on a writable root, its tree compared")
    try:
        before = tree(root)
        c = run(mih, ["check", root, "--no-progress", "--gtest_brief=1"])
        after = tree(root)
    finally:
        if mounted:
            subprocess.run(["umount", root])
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    check(c.returncode == 0 and not changed,
          f"8: mih check of a {'read-only ' if mounted else ''}root gives its verdict and writes nothing (exit "
          f"{c.returncode}; changed: {changed[:6]})", c.stdout[-2000:])


SECTIONS = {"7": golden_keeps_what_mih_did_not_write, "8": check_on_read_only_evidence}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    ap.add_argument("--only", default=",".join(SECTIONS), help="the sections to run, e.g. 7,8")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    t0 = time.time()
    for section in a.only.split(","):
        SECTIONS[section](os.path.abspath(a.mih), os.path.abspath(a.work))
    print(f"{'all' if not FAILURES else len(FAILURES)} {'checks held' if not FAILURES else 'check(s) failed'} "
          f"in {time.time() - t0:.0f} s")
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
