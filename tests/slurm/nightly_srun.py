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
  3. a second night where three jobs do not complete: Tp2Sp's is cancelled, a rank of DpShard2
     is killed once the case has begun its evidence (srun stops its peer: the job FAILED with a
     signal's status), Tp2's ranks hang (frozen with SIGSTOP) past
     a time limit cut to a minute (TIMEOUT). The final job fails (the night is incomplete); its
     run and report.md say each case's outcome is infrastructure, naming the job and its state,
     and count them apart from the verdicts; `mih submit` again keeps the completed Reference,
     resubmits the three, and the night completes.

Skipped (exit 77) with the reason when not root or when the daemons cannot start.

Usage: nightly_srun.py --mih build/bin/mih --work DIR
"""
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slurm_cluster import Skip, SlurmCluster  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from testkit import Tally, mih_and_work, processes  # noqa: E402

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


def rank_pids(case_dir, n, timeout=120):
    """The pids of the `n` rank processes srun started for the case at `case_dir` (mih worker
    processes whose --run-dir is under it), as soon as all of them exist."""
    run = os.path.join(case_dir, "run") + "/"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [pid for pid, argv in processes() if argv and os.path.basename(argv[0]) in ("mih", "mih-core")
                and "worker" in argv and any(a.startswith(run) for a in argv)]
        if len(pids) >= n:
            return sorted(pids)[:n]
        time.sleep(0.02)
    raise TimeoutError(f"no {n} rank processes of {case_dir} after {timeout} s")


def wait_for(path, timeout=120):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {timeout} s")
        time.sleep(0.01)


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
    mih, work = mih_and_work()
    root = os.path.join(work, "night")
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
        with SlurmCluster(os.path.join(work, "slurm"), cpus=6) as cluster:
            _, jobs = submit_night(cluster, submit, root, "the first night")
            if jobs is None:
                return 1
            # At once, a second night where three jobs do not complete: Tp2Sp's is cancelled while it waits
            # for its reference; a rank of DpShard2 is killed (the failed rank: srun stops its
            # peer); Tp2's ranks are frozen and its time limit cut to a minute (the timed-out job).
            # The verify job's run says each is an infrastructure outcome naming its job and
            # state, its summary counts them apart, the night is incomplete (the verify job
            # fails); submitted again, only those cases rerun and the night completes.
            night2 = os.path.join(work, "night2")
            broken = ("Tp2Sp", "DpShard2", "Tp2")
            again = [mih, "submit", "--spec", "llama", "--cases", ",".join(broken), "--evidence-root", night2, "--site", site]
            _, jobs2 = submit_night(cluster, again, night2, "the second night")
            if jobs2 is None:
                return 1
            job = {name: jobs2[f"llama/{name}:train"] for name in broken}
            cluster.run(["/usr/bin/scancel", job["Tp2Sp"]])
            ranks = {name: rank_pids(os.path.join(night2, "llama", name), 2) for name in ("DpShard2", "Tp2")}
            for pid in ranks["Tp2"]:
                os.kill(pid, signal.SIGSTOP)
            # DpShard2's rank dies once the case has begun writing its evidence (a FAILED job with
            # evidence, which the scheduler's exit status must mark as the infrastructure's).
            wait_for(os.path.join(night2, "llama", "DpShard2", "environment.json"))
            for pid in ranks["DpShard2"]:
                os.kill(pid, signal.SIGSTOP)
            os.kill(ranks["DpShard2"][1], signal.SIGKILL)  # a rank dies
            os.kill(ranks["DpShard2"][0], signal.SIGCONT)
            p = cluster.run(["/usr/bin/scontrol", "update", f"JobId={job['Tp2']}", "TimeLimit=1"])  # a hung rank
            if p.returncode != 0:
                fail(f"scontrol update TimeLimit: {p.stdout}")
            states = cluster.wait(list(jobs.values()), timeout=300)
            for name, jid in jobs.items():
                state, code = states[jid]
                if state != "COMPLETED":
                    logs = os.path.join(root, ".mih-submit", "llama")
                    tails = "".join(open(os.path.join(logs, f), errors="replace").read()[-1500:]
                                    for f in sorted(os.listdir(logs)) if f.endswith(f".{jid}.log"))
                    fail(f"SLURM job {jid} ({name}) ended {state} (exit {code})\n{tails}")
                else:
                    ok(f"SLURM job {jid} ({name}) COMPLETED")
            states = cluster.wait(list(jobs2.values()), timeout=300)
            want_states = {"Tp2Sp": "CANCELLED", "DpShard2": "FAILED", "Tp2": "TIMEOUT"}
            for name, want in want_states.items():
                if states[job[name]][0] != want:
                    fail(f"{name}'s job {job[name]} ended {states[job[name]]}, not {want}")
            verify_state = states[jobs2["llama:verify"]]
            if verify_state[0] != "FAILED" or verify_state[1] != "15:0":
                fail(f"the verify job of a night with three jobs lost ended {verify_state}, want FAILED 15:0 (incomplete)")
            else:
                ok(f"the night with a cancelled job, a dead rank and a timeout: its verify job FAILED (exit 15:0): incomplete")
            logs = os.path.join(night2, ".mih-submit", "llama")
            vlog = open(os.path.join(logs, f"verify.{jobs2['llama:verify']}.log"), errors="replace").read()
            report = open(os.path.join(night2, "report.md"), errors="replace").read()
            for name, want in want_states.items():
                said = f"SLURM job {job[name]} (llama/{name}:train) ended {want}"
                if said not in vlog or said not in report:
                    fail(f"the verify log or report.md does not say {said!r}\n{vlog[-3000:]}\n{report[:3000]}")
                else:
                    ok(f"the verify run and report.md say {said!r}")
            if "INFRASTRUCTURE" not in vlog or "INCOMPLETE: 3 cases did not complete" not in vlog:
                fail(f"the verify run's summary does not count the three cases apart\n{vlog[-3000:]}")
            else:
                ok("the verify run's summary counts the three cases as not judged")
            totals = next((l for l in report.splitlines() if " tests: " in l), "")
            if "not judged (infrastructure: 3 cases did not complete)" not in totals or " 0 failed," not in totals:
                fail(f"report.md's summary line does not count the three cases apart: {totals!r}")
            else:
                ok(f"report.md's summary line: {totals}")
            blamed = [l for l in vlog.splitlines() if "DIAGNOSIS" in l and any(n in l for n in broken)]
            if blamed:
                fail("the diagnosis across the matrix treats a case that did not complete as a failing one:\n" + "\n".join(blamed))
            out, jobs3 = submit_night(cluster, again, night2, "the second night again")
            if jobs3 is None:
                return 1
            if "llama/Reference: complete in an earlier submission" not in out:
                fail(f"mih submit again: the Reference not kept\n{out}")
            else:
                ok("mih submit again keeps the completed Reference and resubmits Tp2Sp, DpShard2 and Tp2")
            fresh = [jobs3[f"llama/{name}:train"] for name in broken] + [jobs3["llama:verify"]]
            states = cluster.wait(fresh, timeout=300)
            if any(states[j][0] != "COMPLETED" for j in fresh):
                fail(f"the resubmitted night's jobs ended {states}")
            else:
                ok("the resubmitted night completed")
            junit = open(os.path.join(night2, "junit.xml")).read() if os.path.exists(os.path.join(night2, "junit.xml")) else ""
            if 'failures="0"' not in junit or 'errors="0"' not in junit or any(n not in junit for n in broken):
                fail("the resubmitted night's junit.xml has failures or errors, or lacks a case")
            else:
                ok("the resubmitted night's junit.xml: every test of Reference, Tp2Sp, DpShard2 and Tp2 passed")
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
