#!/usr/bin/env python3
"""Chaos (ctest RunnerChaos, label runtime): N runs of the 2-rank case llama/DpShard2 through the
real `mih` binary, each with one fault injected at a random moment of its training:

  kill-rank    SIGKILL of a random rank        -> an infrastructure exit (14-16)
  stop-rank    SIGSTOP of a random rank        -> an infrastructure exit (14-16) at the timeout
  kill-parent  SIGKILL of `mih run` itself     -> no rank outlives it; the rerun relaunches
  fill-disk    the evidence disk filled        -> exit 12 (as root, on a tmpfs; else kill-rank)

A fault that lands after the case finished may leave it complete (exit 0 with outcome "ran");
any other outcome is a misclassification: never a conformance verdict (1), never an internal
error (17). After each run: no rank process is left, every JSON file of the evidence parses
(atomic writes) and every JSONL file holds whole lines, and a rerun on the same root with
`mih test` reaches the true verdict (exit 0: the port has no bug), relaunching the case unless the
fault landed after its complete record was written (then the record is reused unchanged). Prints
the counts.

Exit status: 0 every run was classified correctly; 1 otherwise; 2 usage."""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check, rank_pids, run, wait_for  # noqa: E402


def evidence_intact(root):
    """Names of the evidence files that are half-written: a JSON file that does not parse, a
    JSONL file with a torn or non-JSON line. Temp files of a killed writer are not evidence."""
    bad = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            path = os.path.join(dirpath, f)
            if ".tmp." in f:
                continue
            if f.endswith(".json"):
                try:
                    json.load(open(path))
                except ValueError:
                    bad.append(os.path.relpath(path, root))
            elif f.endswith(".jsonl"):
                data = open(path, "rb").read()
                ok = not data or data.endswith(b"\n")
                for line in data.decode("utf-8", "replace").splitlines():
                    if line.strip():
                        try:
                            json.loads(line)
                        except ValueError:
                            ok = False
                if not ok:
                    bad.append(os.path.relpath(path, root))
    return bad


def read_bytes(path):
    """The file's bytes, or None when it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def mount_tmpfs(path, size):
    os.makedirs(path, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                          capture_output=True).returncode == 0


def umount(path):
    subprocess.run(["umount", "-l", path], capture_output=True)


def one_run(mih, root, kind, rng):
    """Runs llama/DpShard2 with fault `kind`; returns (exit status, output, what happened)."""
    case_dir = os.path.join(root, "llama", "DpShard2")
    cmd = [mih, "run", "--spec", "llama", "--case", "DpShard2", "--evidence-root", root]
    filler = None
    if kind == "fill-disk":
        # Leave a little room: the case starts, then runs out of space at some point.
        st = os.statvfs(root)
        free = st.f_bavail * st.f_frsize
        room = rng.randint(20, 600) * 1024
        filler = os.path.join(root, "filler")
        with open(filler, "wb") as f:
            try:
                f.write(b"\0" * max(0, free - room))
            except OSError:
                pass
    if kind == "stop-rank":
        cmd += ["--timeout", "6"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    landed = "n/a"
    if kind in ("kill-rank", "stop-rank", "kill-parent"):
        pids = wait_for(lambda: len(rank_pids(case_dir)) == 2 and rank_pids(case_dir), 60)
        time.sleep(rng.uniform(0.0, 0.6))  # a forked rank lives about 0.8 s: most land while it runs
        try:
            if kind == "kill-parent":
                p.kill()
            elif pids:
                os.kill(rng.choice(pids), signal.SIGKILL if kind == "kill-rank" else signal.SIGSTOP)
            landed = "yes"
        except ProcessLookupError:
            landed = "no (already gone)"
    out, _ = p.communicate(timeout=120)
    if filler and os.path.exists(filler):
        os.remove(filler)
    return p.returncode, out, landed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    a = ap.parse_args()
    mih = a.mih
    umount(os.path.join(a.work, "disk"))
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    rng = random.Random(a.seed)
    can_fill = os.geteuid() == 0 and mount_tmpfs(os.path.join(a.work, "disk"), "64m")
    kinds = ["kill-rank", "stop-rank", "kill-parent", "fill-disk"]
    print(f"seed {a.seed}; {a.runs} runs; disk filling {'on a tmpfs' if can_fill else 'skipped (needs root)'}")
    counts = {}
    t0 = time.time()
    # The reference once: every run's root starts with a copy (complete and intact, so the
    # reruns reuse it and the runs differ only in their fault).
    template = os.path.join(a.work, "template")
    r = run(mih, ["run", "--spec", "llama", "--case", "Reference", "--evidence-root", template])
    check(r.returncode == 0, f"the reference runs (exit {r.returncode})", r.stdout[-2000:])
    try:
        for i in range(a.runs):
            kind = kinds[i % len(kinds)]
            if kind == "fill-disk" and not can_fill:
                kind = "kill-rank"
            base = os.path.join(a.work, "disk") if kind == "fill-disk" else a.work
            root = os.path.join(base, f"run{i:02d}")
            shutil.copytree(os.path.join(template, "llama", "Reference"), os.path.join(root, "llama", "Reference"))
            rc, out, landed = one_run(mih, root, kind, rng)
            case_dir = os.path.join(root, "llama", "DpShard2")
            record = {}
            try:
                record = json.load(open(os.path.join(case_dir, "case_run.json")))
            except (OSError, ValueError):
                pass
            outcome = record.get("outcome", "none")
            if kind == "kill-parent":
                ok = rc == -signal.SIGKILL or (rc == 0 and outcome == "ran")  # killed as it exited
            elif kind == "fill-disk":
                ok = rc == 12 or (rc == 0 and outcome == "ran")
            else:
                ok = rc in (14, 15, 16) or (rc == 0 and outcome == "ran")
            key = f"{kind}: exit {rc}"
            counts[key] = counts.get(key, 0) + 1
            check(ok, f"run {i:2d} {kind:11s} (landed {landed}): exit {rc}, outcome {outcome}", out[-2500:])
            gone = wait_for(lambda: not rank_pids(case_dir), 10)
            check(gone is not None or not rank_pids(case_dir), f"run {i:2d}: no rank outlives it")
            bad = evidence_intact(root)
            check(not bad, f"run {i:2d}: no half-written evidence file", ", ".join(bad))
            before = read_bytes(os.path.join(case_dir, "case_run.json"))
            # The rerun's options match the run's (the timeout is part of a case's fingerprint).
            same = ["--case-timeout", "6"] if kind == "stop-rank" else []
            again = run(mih, ["test", "--evidence-root", root, "--gtest_brief=1",
                              "--gtest_filter=Llama/*.*/Reference:Llama/*.*/DpShard2"] + same)
            check(again.returncode == 0, f"run {i:2d}: the rerun on the same root passes (exit {again.returncode})",
                  again.stdout[-2500:])
            after = read_bytes(os.path.join(case_dir, "case_run.json"))
            launched = "llama/DpShard2: launching" in again.stdout and after is not None and after != before
            if outcome != "ran":
                # No record, or one of a run that did not complete: never trusted, always rerun.
                check(launched and (before is None or "relaunching llama/DpShard2" in again.stdout),
                      f"run {i:2d}: the rerun relaunches the incomplete case", again.stdout[-1500:])
            else:
                # The record was complete before the fault landed (its digests verify): reused as is.
                check(not launched and after == before,
                      f"run {i:2d}: the rerun reuses the case completed before the fault", again.stdout[-1500:])
            shutil.rmtree(root, ignore_errors=True)
    finally:
        if can_fill:
            umount(os.path.join(a.work, "disk"))
    print("outcomes: " + "; ".join(f"{k} x{v}" for k, v in sorted(counts.items())))
    print(f"{'all' if not FAILURES else len(FAILURES)} {'checks held' if not FAILURES else 'check(s) failed'} "
          f"in {time.time() - t0:.0f} s")
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
