#!/usr/bin/env python3
"""Verdicts that an edit no longer turns into a pass (ctest EditedStateVerdicts, label runtime;
issue 53 items 3, 4 and 10): black-box runs of the real `mih` binary on real evidence, edited
the way a hostile user of the installed package edited it.

1. integration_state.json is outside case_run.json's digests: a case its run left FAILED (the
   session failed it while its ranks exited 0: case_run.json records state FAILED) whose
   integration_state.json is deleted, or says MATRIX_PASSED, is no pass: `mih check` of the
   case, `mih test --verify-only`, a reusing `mih test` exit 1 naming case_run.json's state,
   and `mih report` says NOT PASSED.
2. A case mih's case runner launched (environment.json: launcher mih, its ranks' run directory
   the case's own) whose case_run.json is deleted and one of whose losses is edited within
   tolerance is incomplete, never an external launch's evidence to judge: `mih check` and
   `mih test --verify-only` exit 12 naming the missing record, `mih report` says NOT PASSED.
   The same case launched by another launcher (`mih run --prepare`, ranks by `mih launch`)
   with no record is still checked (exit 0).
3. A `mih submit` night whose job the scheduler no longer knows (no accounting, past
   MinJobAge): a case one of whose ranks never reached its end (run/train/timing_rank1.json
   missing) is an infrastructure outcome (exit 14-16, "never reached its end"), never judged
   from its partial evidence; a case whose job SLURM requeued into the same directory
   (environment.json's SLURM_RESTART_COUNT=1) likewise, even when the job COMPLETED. A
   forgotten job whose ranks all ended is judged (exit 0).

Exit status: 0 every check held; 1 otherwise; 2 usage."""
import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check, run  # noqa: E402

CASE = "DpShard2"
FILTER = f"--gtest_filter=Llama/*.*/Reference:Llama/*.*/{CASE}"
QUIET = ["--no-progress", "--gtest_brief=1"]


def read_json(path):
    with open(path) as f:
        return json.load(f)


def write_json(path, j):
    with open(path, "w") as f:
        json.dump(j, f, indent=2)


def copy_root(src, dst):
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, symlinks=True)
    return os.path.join(dst, "llama", CASE)


def edit_loss_within_tolerance(case):
    """The last step's loss changed in its 15th significant digit: inside every tolerance."""
    path = os.path.join(case, "cases", "runtime", "metrics.jsonl")
    rows = [json.loads(line) for line in open(path) if line.strip()]
    rows[-1]["loss"] = rows[-1]["loss"] * (1 + 1e-14)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def session_failed_state(mih, clean, work):
    """1."""
    case = copy_root(clean, os.path.join(work, "session-failed"))
    root = os.path.dirname(os.path.dirname(case))
    # What run_case records when the session left the case FAILED and every rank exited 0.
    record = read_json(os.path.join(case, "case_run.json"))
    record["state"] = "FAILED"
    write_json(os.path.join(case, "case_run.json"), record)
    state_file = os.path.join(case, "integration_state.json")
    state = read_json(state_file)
    state.update(state="FAILED", previous_state="STRUCTURE_VALIDATED",
                 reason="findings with errors:\nMIH-STRUCT-007 layers.1.mlp.experts.gate_up_proj: mutation")
    write_json(state_file, state)
    c = run(mih, ["check", case] + QUIET)
    check(c.returncode == 1, f"1: mih check of the FAILED case as its run left it: exit 1 (got {c.returncode})",
          c.stdout[-1500:])
    for edit in ("deleted", "MATRIX_PASSED"):
        if edit == "deleted":
            os.remove(state_file)
        else:
            state.update(state="MATRIX_PASSED", previous_state="MODULE_PARITY_PASSED", reason="")
            write_json(state_file, state)
        said = "case_run.json records that its run left the case FAILED"
        c = run(mih, ["check", case] + QUIET)
        check(c.returncode == 1 and said in c.stdout,
              f"1: integration_state.json {edit}: mih check of the case exits 1 naming case_run.json's state "
              f"(got {c.returncode})", c.stdout[-1500:])
        v = run(mih, ["test", "--verify-only", "--evidence-root", root, FILTER] + QUIET)
        check(v.returncode == 1 and said in v.stdout,
              f"1: integration_state.json {edit}: mih test --verify-only exits 1 (got {v.returncode})", v.stdout[-1500:])
        r = run(mih, ["report", root])
        check("Verdict: NOT PASSED" in r.stdout and "Verdict: PASSED" not in r.stdout,
              f"1: integration_state.json {edit}: mih report says NOT PASSED", r.stdout[:1500])
    t = run(mih, ["test", "--evidence-root", root, FILTER] + QUIET)
    check(t.returncode == 1 and said in t.stdout and f"relaunching llama/{CASE}" not in t.stdout,
          f"1: integration_state.json MATRIX_PASSED: a reusing mih test exits 1 (got {t.returncode})", t.stdout[-1500:])


def lost_record(mih, clean, work):
    """2."""
    case = copy_root(clean, os.path.join(work, "lost-record"))
    root = os.path.dirname(os.path.dirname(case))
    os.remove(os.path.join(case, "case_run.json"))
    edit_loss_within_tolerance(case)
    said = "has no case_run.json"
    c = run(mih, ["check", case] + QUIET)
    check(c.returncode == 12 and said in c.stdout,
          f"2: a mih-launched case without case_run.json, a loss edited: mih check exits 12 naming the record "
          f"(got {c.returncode})", c.stdout[-1500:])
    v = run(mih, ["test", "--verify-only", "--evidence-root", root, FILTER] + QUIET)
    check(v.returncode == 12 and said in v.stdout,
          f"2: ... mih test --verify-only exits 12 (got {v.returncode})", v.stdout[-1500:])
    r = run(mih, ["report", root])
    check("Verdict: NOT PASSED" in r.stdout and "case_run.json is missing" in r.stdout,
          "2: ... mih report says NOT PASSED, naming the missing record", r.stdout[:1500])


def night(mih, work):
    """3, and 2's external launch."""
    root = os.path.join(work, "night")
    shutil.rmtree(root, ignore_errors=True)
    for case, ranks in (("Reference", 1), (CASE, 2)):
        p = run(mih, ["run", "--prepare", "--spec", "llama", "--case", case, "--evidence-root", root])
        check(p.returncode == 0, f"3: mih run --prepare llama/{case} (exit {p.returncode})", p.stdout[-800:])
        # The ranks by another launcher, as srun starts them in a night's job.
        ranks_run = run(mih, ["launch", "-n", str(ranks), "--evidence-root", os.path.join(work, "night-runs"), "case",
                              "--evidence", os.path.join(root, "llama", case), "--phase", "train"])
        check(ranks_run.returncode == 0, f"3: the ranks of llama/{case} (exit {ranks_run.returncode})",
              ranks_run.stdout[-800:])
    submit = os.path.join(root, ".mih-submit", "llama")
    os.makedirs(submit, exist_ok=True)
    write_json(os.path.join(submit, "jobs.json"), {"llama/Reference:train": "101", f"llama/{CASE}:train": "102"})
    states = os.path.join(submit, "states.txt")
    with open(states, "w") as f:
        f.write("101|COMPLETED|0:0\n")  # 102: forgotten (no accounting, past MinJobAge)
    verify = ["test", "--verify-only", "--evidence-root", root, FILTER] + QUIET
    v = run(mih, verify)
    check(v.returncode == 0, f"2, 3: a forgotten job whose ranks all ended, of a launch without a record, is judged "
          f"(exit {v.returncode})", v.stdout[-1500:])
    case = os.path.join(root, "llama", CASE)
    timing = os.path.join(case, "run", "train", "timing_rank1.json")
    kept = open(timing).read()
    os.remove(timing)  # rank 1 cancelled before its end
    v = run(mih, verify)
    check(v.returncode in (14, 15, 16) and "never reached its end" in v.stdout and "SLURM job 102" in v.stdout,
          f"3: a forgotten job cancelled mid-case: an infrastructure outcome naming the job (exit {v.returncode})",
          v.stdout[-1500:])
    r = run(mih, ["report", root])
    check("Verdict: PASSED" not in r.stdout and "never reached its end" in r.stdout,
          "3: ... mih report does not call it passed", r.stdout[:2000])
    with open(timing, "w") as f:
        f.write(kept)
    env_file = os.path.join(case, "environment.json")
    env = read_json(env_file)
    env["variables"]["SLURM_RESTART_COUNT"] = "1"  # what a requeued job's rank 0 records
    write_json(env_file, env)
    with open(states, "w") as f:
        f.write("101|COMPLETED|0:0\n102|COMPLETED|0:0\n")
    v = run(mih, verify)
    check(v.returncode in (14, 15, 16) and "SLURM requeued" in v.stdout,
          f"3: a job SLURM requeued into the same case directory: an infrastructure outcome, though COMPLETED (exit "
          f"{v.returncode})", v.stdout[-1500:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    t0 = time.time()
    clean = os.path.join(a.work, "clean")
    t = run(a.mih, ["test", "--evidence-root", clean, FILTER] + QUIET)
    check(t.returncode == 0, f"the clean llama Reference + {CASE} run passes (exit {t.returncode})", t.stdout[-1500:])
    if t.returncode == 0:
        session_failed_state(a.mih, clean, a.work)
        lost_record(a.mih, clean, a.work)
    night(a.mih, a.work)
    print(f"{'all' if not FAILURES else len(FAILURES)} {'checks held' if not FAILURES else 'check(s) failed'} "
          f"in {time.time() - t0:.0f} s")
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
