#!/usr/bin/env python3
"""ctest SlurmNightlyPath (label external): docs/gpu-nightly.md's SLURM path, by hand as the docs
give it, under a real SLURM (tests/slurm/slurm_cluster.py: Debian's slurmctld, slurmd and munge,
started as root in a throwaway configuration and stopped by pid).

  1. `mih run --prepare` writes each case's run/case.json (llama Reference, Tp2Sp, DpShard2);
  2. one sbatch job per case, each starting its ranks with `srun mih worker ... case`, the
     comparisons depending on the Reference's job (afterany);
  3. `mih test --verify-only` over the root: every test of the three cases passes, each case's
     evidence says its ranks ran under SLURM (environment.json launcher);
  4. `mih report` renders the run.

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

CASES = (("Reference", 1), ("Tp2Sp", 2), ("DpShard2", 2))
TALLY = Tally()
fail, FAILED = TALLY.fail, TALLY.failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    mih = os.path.abspath(a.mih)
    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    root = os.path.join(work, "night")
    os.makedirs(root)
    try:
        with SlurmCluster(os.path.join(work, "slurm"), cpus=4) as cluster:
            jobs = {}
            for name, ranks in CASES:
                p = cluster.run([mih, "run", "--prepare", "--spec", "llama", "--case", name, "--evidence-root", root])
                if p.returncode != 0:
                    fail(f"mih run --prepare {name}: exit {p.returncode}\n{p.stdout}")
                    return 1
                case = os.path.join(root, "llama", name)
                script = os.path.join(work, f"{name}.sbatch")
                with open(script, "w") as f:
                    f.write(f"""#!/bin/bash
#SBATCH --ntasks={ranks} --job-name=mih-{name} --output={work}/{name}.log --time=5
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))
srun --ntasks={ranks} {mih} worker --run-dir {case}/run/train --pg-backend gloo --collective-timeout 120 \\
  --case-timeout 150 case --evidence {case} --phase train
""")
                options = [] if name == "Reference" else ["--dependency=afterany:" + jobs["Reference"]]
                jobs[name] = cluster.sbatch(script, *options)
            states = cluster.wait(list(jobs.values()), timeout=240)
            for name, job in jobs.items():
                state, code = states[job]
                if state != "COMPLETED":
                    with open(os.path.join(work, f"{name}.log"), errors="replace") as f:
                        log = f.read()[-3000:]
                    fail(f"SLURM job {job} ({name}) ended {state} (exit {code})\n{log}")
                else:
                    print(f"ok: SLURM job {job} ({name}) COMPLETED", flush=True)
            if FAILED:
                return 1
    except Skip as e:
        print(f"SKIP: {e}", flush=True)
        return 77

    for name, _ in CASES:
        with open(os.path.join(root, "llama", name, "environment.json")) as f:
            launcher = json.load(f).get("launcher")
        if launcher != "slurm":
            fail(f"{name}: environment.json says launcher {launcher!r}, not 'slurm' (the ranks did not see srun's variables)")
    flt = ":".join(f"*/{name}" for name, _ in CASES)
    p = cluster.run([mih, "test", "--verify-only", "--evidence-root", root, "--prefixes", "Llama",
                     f"--gtest_filter={flt}", "--gtest_brief=1", "--no-progress"], timeout=300)
    if p.returncode != 0 or "[  PASSED  ]" not in p.stdout or "FAILED" in p.stdout:
        fail(f"mih test --verify-only: exit {p.returncode}\n{p.stdout[-4000:]}")
    else:
        print("ok: mih test --verify-only: " + [l for l in p.stdout.splitlines() if "PASSED" in l][0], flush=True)
    report = os.path.join(work, "report.md")
    p = cluster.run([mih, "report", root, "--format", "md", "-o", report])
    if p.returncode != 0 or not os.path.exists(report):
        fail(f"mih report: exit {p.returncode}\n{p.stdout}")
    else:
        text = open(report).read()
        missing = [name for name, _ in CASES if name not in text]
        if missing:
            fail(f"the report does not name {missing}")
        else:
            print("ok: mih report names every case", flush=True)
    if FAILED:
        print(f"slurm nightly path: {len(FAILED)} failure(s)")
        return 1
    print("slurm nightly path: every job completed under SLURM and every test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
