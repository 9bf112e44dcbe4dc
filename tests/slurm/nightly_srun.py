#!/usr/bin/env python3
"""ctest SlurmNightlyPath (label external): the nightly matrix under a real SLURM
(tests/slurm/slurm_cluster.py: Debian's slurmctld, slurmd and munge, started as root in a
throwaway one-node configuration and stopped by pid).

  1. `mih submit --dry-run` prints the dependency graph the night must have: each case after its
     reference (afterany), a resume's load after its save (afterok), the verify job after all;
  2. `mih submit` submits llama's Reference, Tp2Sp, DpShard2 and ResumeDpShard2 (its save and load
     phases) with a site file; every job completes under SLURM, each case's evidence says its
     ranks ran under SLURM (environment.json launcher), and the final job's `mih test
     --verify-only` passes every test and writes report.md, report.html and junit.xml naming
     every case;
  3. a second night whose Tp2Sp job is cancelled: the final job fails (the night is incomplete)
     and its run says Tp2Sp's outcome is infrastructure, naming the job and its state; `mih
     submit` again keeps the completed Reference, resubmits Tp2Sp, and the night completes.

Skipped (exit 77) with the reason when not root or when the daemons cannot start.

Usage: nightly_srun.py --mih build/bin/mih --work DIR
"""
import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slurm_cluster import Skip, SlurmCluster  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from testkit import Tally  # noqa: E402

TALLY = Tally()
fail, ok = TALLY.fail, TALLY.ok
CASES = ("Reference", "Tp2Sp", "DpShard2", "ResumeDpShard2")
GRAPH = [  # (job, its dependencies as `mih submit` prints them)
    "llama/Reference:train\n",
    "llama/DpShard2:train after afterany:llama/Reference:train\n",
    "llama/Tp2Sp:train after afterany:llama/Reference:train\n",
    "llama/ResumeDpShard2:save after afterany:llama/DpShard2:train\n",
    "llama/ResumeDpShard2:load after afterok:llama/ResumeDpShard2:save\n",
    "llama:verify after afterany:llama/Reference:train, afterany:llama/DpShard2:train, afterany:llama/Tp2Sp:train, "
    "afterany:llama/ResumeDpShard2:save, afterany:llama/ResumeDpShard2:load\n",
]


def submit_night(cluster, cmd, root, what):
    """Runs `mih submit` (cmd) under the cluster; returns its output and the jobs it recorded in
    <root>/.mih-submit/llama/jobs.json, or (output, None) after saying the failure."""
    p = cluster.run(cmd, timeout=120)
    if p.returncode != 0:
        fail(f"mih submit ({what}): exit {p.returncode}\n{p.stdout}")
        return p.stdout, None
    with open(os.path.join(root, ".mih-submit", "llama", "jobs.json")) as f:
        return p.stdout, json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    mih = os.path.abspath(a.mih)
    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    root = os.path.join(work, "night")
    os.makedirs(work)
    site = os.path.join(work, "site.json")
    with open(site, "w") as f:
        json.dump({"partition": "debug", "time_minutes": 10}, f)
    submit = [mih, "submit", "--spec", "llama", "--cases", ",".join(CASES), "--evidence-root", root, "--site", site]

    # The graph, without a scheduler: nothing written.
    out = TALLY.expect("mih submit --dry-run", submit + ["--dry-run"], 0,
                       ["dependency graph of llama's night (6 jobs):", "#SBATCH --partition=debug", "#SBATCH --time=10",
                        "--phase load", "test --verify-only"])
    if out is not None:
        lines = [l.strip() + "\n" for l in out.splitlines() if l.startswith("  llama")]
        if lines != GRAPH:
            fail("mih submit --dry-run: the graph is\n" + "".join(lines) + "want\n" + "".join(GRAPH))
        else:
            ok("mih submit --dry-run: reference -> case, save -> load, everything -> verify")
        if os.path.exists(root):
            fail(f"mih submit --dry-run wrote {root}")

    try:
        with SlurmCluster(os.path.join(work, "slurm"), cpus=4) as cluster:
            _, jobs = submit_night(cluster, submit, root, "the first night")
            if jobs is None:
                return 1
            states = cluster.wait(list(jobs.values()), timeout=300)
            for name, job in jobs.items():
                state, code = states[job]
                if state != "COMPLETED":
                    logs = os.path.join(root, ".mih-submit", "llama")
                    tails = "".join(open(os.path.join(logs, f), errors="replace").read()[-1500:]
                                    for f in sorted(os.listdir(logs)) if f.endswith(f".{job}.log"))
                    fail(f"SLURM job {job} ({name}) ended {state} (exit {code})\n{tails}")
                else:
                    ok(f"SLURM job {job} ({name}) COMPLETED")
            # A second night with one job cancelled (while it waits for its reference): the verify
            # job's run says that case is an infrastructure outcome naming the job, the night is
            # incomplete (the verify job fails); submitted again, only that case reruns and the
            # night completes.
            night2 = os.path.join(work, "night2")
            again = [mih, "submit", "--spec", "llama", "--cases", "Tp2Sp", "--evidence-root", night2, "--site", site]
            _, jobs2 = submit_night(cluster, again, night2, "the second night")
            if jobs2 is None:
                return 1
            cancelled = jobs2["llama/Tp2Sp:train"]
            cluster.run(["/usr/bin/scancel", cancelled])
            states = cluster.wait(list(jobs2.values()), timeout=300)
            if states[cancelled][0] != "CANCELLED":
                fail(f"job {cancelled} ended {states[cancelled]}, not CANCELLED")
            verify_state = states[jobs2["llama:verify"]]
            if verify_state[0] != "FAILED":
                fail(f"the verify job of a night with a cancelled job ended {verify_state}, want FAILED (incomplete)")
            else:
                ok(f"the night with job {cancelled} cancelled: its verify job FAILED (exit {verify_state[1]}): incomplete")
            logs = os.path.join(night2, ".mih-submit", "llama")
            vlog = open(os.path.join(logs, f"verify.{jobs2['llama:verify']}.log"), errors="replace").read()
            want = f"SLURM job {cancelled} (llama/Tp2Sp:train) ended CANCELLED"
            if want not in vlog or "INFRASTRUCTURE" not in vlog:
                fail(f"the verify log does not say {want!r} as an infrastructure outcome\n{vlog[-3000:]}")
            else:
                ok(f"the verify run says {want!r}, an infrastructure outcome")
            blamed = [l for l in vlog.splitlines() if "DIAGNOSIS" in l and "Tp2Sp" in l]
            if blamed:
                fail("the diagnosis across the matrix treats the cancelled case as a failing one:\n" + "\n".join(blamed))
            report = open(os.path.join(night2, "report.md"), errors="replace").read()
            if "transport_failure" not in report and "infrastructure" not in report.lower():
                fail("report.md of the incomplete night does not say the infrastructure outcome\n" + report[-2000:])
            else:
                ok("report.md of the incomplete night says the infrastructure outcome")
            out, jobs3 = submit_night(cluster, again, night2, "the second night again")
            if jobs3 is None:
                return 1
            if "llama/Reference: complete in an earlier submission" not in out:
                fail(f"mih submit again: the Reference not kept\n{out}")
            else:
                ok("mih submit again keeps the completed Reference and resubmits Tp2Sp")
            fresh = [jobs3["llama/Tp2Sp:train"], jobs3["llama:verify"]]
            states = cluster.wait(fresh, timeout=300)
            if any(states[j][0] != "COMPLETED" for j in fresh):
                fail(f"the resubmitted night's jobs ended {states}")
            else:
                ok("the resubmitted night completed")
            junit = open(os.path.join(night2, "junit.xml")).read() if os.path.exists(os.path.join(night2, "junit.xml")) else ""
            if 'failures="0"' not in junit or "Tp2Sp" not in junit:
                fail("the resubmitted night's junit.xml has failures or lacks Tp2Sp")
            else:
                ok("the resubmitted night's junit.xml: every test of Reference and Tp2Sp passed")
    except Skip as e:
        print(f"SKIP: {e}", flush=True)
        return 77

    for name in CASES:
        with open(os.path.join(root, "llama", name, "environment.json")) as f:
            launcher = json.load(f).get("launcher")
        if launcher != "slurm":
            fail(f"{name}: environment.json says launcher {launcher!r}, not 'slurm' (the ranks did not see srun's variables)")
    for report in ("report.md", "report.html", "junit.xml"):
        path = os.path.join(root, report)
        text = open(path).read() if os.path.exists(path) else ""
        missing = [name for name in CASES if name not in text]
        if not text or missing:
            fail(f"{report}: missing, or it does not name {missing}")
        else:
            ok(f"{report} names every case")
    if os.path.exists(os.path.join(root, "junit.xml")) and 'failures="0"' not in open(os.path.join(root, "junit.xml")).read():
        fail("junit.xml records failures")
    return TALLY.summary("slurm nightly path")


if __name__ == "__main__":
    sys.exit(main())
