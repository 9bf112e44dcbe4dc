#!/usr/bin/env python3
"""The runner's outcome is the true one (ctest RunnerOutcomes, label runtime): black-box runs
of the real `mih` binary with real rank processes and real signals.

1. A rank SIGKILLed mid-training, and a rank SIGSTOPped until the case timeout, are
   infrastructure failures (exit 14-16, "infrastructure failure", the rank and the signal
   named), never a conformance verdict; no rank process outlives the run.
2. A rerun on the same root relaunches a case whose last run did not complete, whose
   evidence was changed or deleted, or that ran under another timeout, and says why; a
   complete, intact case is reused.
3. A second `mih run` of a case that is running is refused (exit 12) and the running one's
   evidence is left whole.
4. The matrix's `steps` is what every case trains (and what resume_at is checked against).

Exit status: 0 every check held; 1 otherwise; 2 usage."""
import argparse
import glob
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

FAILURES = []


def check(ok, what, detail=""):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        FAILURES.append(what)
        if detail:
            print("      " + str(detail).replace("\n", "\n      ")[-3000:], flush=True)


def live_mih_process(pid):
    """True while `pid` is a running (not zombie) process of a mih binary."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    comm = stat[stat.find("(") + 1:stat.rfind(")")]
    return stat[stat.rfind(")") + 2:].startswith(("R", "S", "D", "T", "t")) and comm.startswith("mih")


def rank_pids(evidence):
    """The pids of the live rank processes working on `evidence`: those its launches recorded
    (run/<phase>/logs/rank<r>.pid; a rank forked by the fork server shows its command cut to
    the launcher's length), and any whose command line names it (ranks of another launcher)."""
    pids = set()
    for path in glob.glob(os.path.join(evidence, "run", "*", "logs", "rank*.pid")):
        try:
            pid = int(open(path).read().strip())
        except (OSError, ValueError):
            continue
        if pid != os.getpid() and live_mih_process(pid):
            pids.add(pid)
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"worker" in argv and b"--evidence" in argv and evidence.encode() in argv and live_mih_process(int(d)):
            pids.add(int(d))
    return sorted(pids)

def wait_for(pred, seconds):
    end = time.time() + seconds
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    return None


def run(mih, args, **kw):
    return subprocess.run([mih] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def prepared_command(mih, root, case, phase="train", spec="llama", extra=()):
    """The rank command `mih run --prepare` (with `extra` flags, e.g. a --fault) prints for
    `phase` of spec/case, `mih` as this binary (what a user runs under torchrun, mpirun or
    srun); None, with a failed check, if it prints none."""
    r = run(mih, ["run", "--prepare", "--spec", spec, "--case", case, "--evidence-root", root] + list(extra))
    check(r.returncode == 0, f"mih run --prepare of {spec}/{case} (exit {r.returncode})", r.stdout[-2000:])
    for line in r.stdout.splitlines():
        if line.startswith(f"{phase} (") and "): " in line:
            return [mih] + shlex.split(line.split("): ", 1)[1])[1:]
    check(False, f"mih run --prepare prints the rank command of phase {phase}", r.stdout[-2000:])
    return None


def metrics_rows(case_dir):
    path = os.path.join(case_dir, "cases", "runtime", "metrics.jsonl")
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for l in f if l.strip())


def signal_mid_training(mih, root, sig, extra):
    """`mih run` of llama/DpShard2 with `sig` sent to rank 1 once step 0 is written."""
    case_dir = os.path.join(root, "llama", "DpShard2")
    p = subprocess.Popen([mih, "run", "--spec", "llama", "--case", "DpShard2", "--evidence-root", root] + extra,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # Training started: the session has written the first step's probes.
    started = wait_for(lambda: os.path.exists(os.path.join(case_dir, "probes", "rank0.jsonl")), 60)
    pids = wait_for(lambda: rank_pids(case_dir) if len(rank_pids(case_dir)) == 2 else None, 30) if started else None
    if pids:
        os.kill(pids[1], sig)
    out, _ = p.communicate(timeout=180)
    if sig == signal.SIGSTOP and pids:
        try:
            os.kill(pids[1], signal.SIGCONT)
        except ProcessLookupError:
            pass
    return p.returncode, out, pids, case_dir


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    a = ap.parse_args()
    mih = a.mih
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)

    # 1. A rank killed mid-training.
    root = os.path.join(a.work, "kill")
    rc, out, pids, case_dir = signal_mid_training(mih, root, signal.SIGKILL, [])
    check(pids is not None, "1a: found the 2 rank processes of a training case", out)
    check(rc in (14, 15, 16), f"1a: SIGKILL of a rank is an infrastructure exit (14-16), got {rc}", out)
    check("infrastructure failure" in out and "SIGKILL" in out, "1a: the report names the signal", out)
    run_json = json.load(open(os.path.join(case_dir, "case_run.json")))
    check(run_json.get("outcome") == "transport_failure", "1a: case_run.json says transport_failure",
          json.dumps(run_json)[:500])
    check(not rank_pids(case_dir), "1a: no rank outlives the run")
    # 2a. The rerun relaunches it (its last run did not complete) and says why.
    out2 = run(mih, ["test", "--evidence-root", root, "--no-progress", "--gtest_brief=1",
                     "--gtest_filter=Llama/*.*/DpShard2:Llama/*.*/Reference"])
    check(out2.returncode == 0, f"2a: the rerun passes (exit {out2.returncode})", out2.stdout)
    check("relaunching llama/DpShard2: its last run did not complete" in out2.stdout,
          "2a: the rerun says why it relaunches", out2.stdout)

    # 1b. A rank stopped (hung) until the case timeout.
    root = os.path.join(a.work, "stop")
    t0 = time.time()
    rc, out, pids, case_dir = signal_mid_training(mih, root, signal.SIGSTOP, ["--timeout", "15"])
    check(pids is not None, "1b: found the 2 rank processes", out)
    check(rc in (14, 15, 16), f"1b: a hung rank is an infrastructure exit (14-16), got {rc} after "
          f"{time.time() - t0:.0f} s", out)
    check("infrastructure failure" in out, "1b: reported as an infrastructure failure", out)
    check(not rank_pids(case_dir), "1b: no rank outlives the run")

    # 2b. Damaged evidence and another timeout are relaunched; an intact case is reused.
    root = os.path.join(a.work, "rerun")
    base = ["test", "--evidence-root", root, "--gtest_brief=1", "--gtest_filter=Llama/*.*/Tp2"]
    first = run(mih, base + ["--no-progress"])
    check(first.returncode == 0, f"2b: a clean run passes (exit {first.returncode})", first.stdout)
    again = run(mih, base)
    check("launching" not in again.stdout and again.returncode == 0, "2b: an intact complete case is reused",
          again.stdout)
    os.remove(os.path.join(root, "llama", "Tp2", "check", "findings.json"))
    damaged = run(mih, base + ["--no-progress"])
    check("relaunching llama/Tp2: evidence file check/findings.json is missing" in damaged.stdout and
          damaged.returncode == 0, "2b: a deleted evidence file is relaunched, saying so", damaged.stdout)
    other = run(mih, base + ["--no-progress", "--case-timeout", "200"])
    check("relaunching llama/Tp2" in other.stdout and "timeout" in other.stdout and other.returncode == 0,
          "2b: another case timeout relaunches", other.stdout)

    # 3. A second run of a running case is refused; the first one's evidence stays whole.
    root = os.path.join(a.work, "concurrent")
    case_dir = os.path.join(root, "llama", "DpShard2")
    cmd = [mih, "run", "--spec", "llama", "--case", "DpShard2", "--evidence-root", root]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids = wait_for(lambda: len(rank_pids(case_dir)) == 2 and rank_pids(case_dir), 60) or []
    # Held still while the second run tries: a forked case can finish before a second
    # process has even loaded libtorch.
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    second = run(mih, cmd[1:])
    for pid in pids:
        os.kill(pid, signal.SIGCONT)
    out, _ = p.communicate(timeout=180)
    check(second.returncode == 12 and "is being run" in second.stdout,
          f"3: the second run is refused with exit 12 (got {second.returncode})", second.stdout)
    check(p.returncode == 0, f"3: the first run completes (exit {p.returncode})", out)
    check(metrics_rows(case_dir) == 3, f"3: the first run's metrics are whole (3 rows, got {metrics_rows(case_dir)})")

    # 4. The matrix's steps are honoured, and resume_at is checked against them.
    root = os.path.join(a.work, "steps")
    matrix = os.path.join(a.work, "steps.json")
    with open(matrix, "w") as f:
        json.dump({"name": "steps", "dtype": "float64", "steps": 5, "max_world_size": 2, "reference": False,
                   "cases": [{"dp_shard": 2}, {"kind": "resume", "config": {"dp_shard": 2}, "resume_at": 3}]}, f)
    for case, rows in (("DpShard2", 5), ("ResumeDpShard2", 2)):
        r = run(mih, ["run", "--spec", "llama", "--case", case, "--matrix", matrix, "--evidence-root", root])
        got = metrics_rows(os.path.join(root, "llama", case))
        check(r.returncode == 0 and got == rows, f"4: {case} of a 5-step matrix trains {rows} steps after its start "
              f"(got {got}, exit {r.returncode})", r.stdout)
    before = metrics_rows(os.path.join(root, "llama", "ResumeDpShard2", "before_save"))
    check(before == 3, f"4: the resume's first run trains resume_at = 3 steps (got {before})")

    print(f"{'all' if not FAILURES else len(FAILURES)} {'checks held' if not FAILURES else 'check(s) failed'}")
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
