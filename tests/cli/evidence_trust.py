#!/usr/bin/env python3
"""Evidence is judged by what mih compiled, and mih touches no file it did not write (ctest
EvidenceTrust, label runtime): black-box runs of the real `mih` binary.

1. A verdict applies the compiled tolerances, spec, matrix and fault. A moe run with catalog
   fault F20 on DpShard2, its tolerances edited in spec.resolved.json (1e-10 -> 1e6) and the
   digests of case_run.json recomputed as the runner computes them (before the edit, `mih check`
   of the root checks it as the F20 run it is and fails it, exit 1): `mih check`, `mih test
   --verify-only` (with and without the fault) refuse it (exit 12) naming the field, and a
   live `mih test` relaunches it instead of reusing it, then fails (exit 1).
2. `mih report` never calls a run passed when a case's record names a fault or its
   integration_state.json says FAILED, though every test line says passed (Markdown verdict,
   JUnit failures).
3. `mih export` into an earlier export beside a file mih did not write (tokenizer.json), or
   with an edited config.json: exit 12 naming the file, every file left as it was; an
   unedited earlier export is rewritten.
4. `mih check` of the root of a filtered run (llama Reference + DpShard2) checks the tests the
   run recorded (exit 0, never the whole default matrix), and of one of its cases too; neither
   modifies or creates any file of the root (the whole tree hashed before and after).

Exit status: 0 every check held; 1 otherwise; 2 usage."""
import argparse
import hashlib
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check, run  # noqa: E402

MOE_TWO = "--gtest_filter=Moe/*.*/Reference:Moe/*.*/DpShard2"
LLAMA_TWO = "--gtest_filter=Llama/*.*/Reference:Llama/*.*/DpShard2"


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


def tree_change(before, after):
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return ", ".join(changed[:8]) + (" ..." if len(changed) > 8 else "")


def recompute_digests(case_dir):
    """case_run.json's "files" recomputed over the files as they are now, as the runner computes
    them (the SHA-256 of each file's bytes): what a user who edits evidence on purpose does."""
    path = os.path.join(case_dir, "case_run.json")
    record = json.load(open(path))
    record["files"] = {rel: sha256(os.path.join(case_dir, rel)) for rel in record["files"]}
    with open(path, "w") as f:
        json.dump(record, f, indent=2)


def compiled_tolerances_decide(mih, work):
    """1 and 2: an F20 run whose tolerances were loosened in its evidence."""
    root = os.path.join(work, "f20")
    t = run(mih, ["test", "--evidence-root", root, "--no-progress", "--gtest_brief=1", "--fault", "F20",
                  "--fault-cases", "DpShard2", MOE_TWO])
    check(t.returncode == 1 and "NumericParity" in t.stdout, f"1: moe DpShard2 with F20 fails its parity (exit "
          f"{t.returncode})", t.stdout[-1500:])
    case = os.path.join(root, "moe", "DpShard2")
    # As it was written, the root is checked as the fault run its record names: F20 is caught
    # (exit 1, as `mih test --fault F20` was), and the failing check writes nothing either.
    before = tree(root)
    c = run(mih, ["check", root, "--no-progress", "--gtest_brief=1"])
    check(c.returncode == 1 and "checked as that fault run" in c.stdout and "NumericParity" in c.stdout
          and tree(root) == before, f"1: mih check of the F20 root checks it as that fault run and fails it, writing "
          f"nothing (exit {c.returncode}; changed: {tree_change(before, tree(root))})", c.stdout[-2500:])
    spec_file = os.path.join(case, "spec.resolved.json")
    spec = json.load(open(spec_file))
    for profile in ("same_topology", "cross_topology"):
        for dtype in spec["tolerances"][profile]:
            spec["tolerances"][profile][dtype] = 1e6
    with open(spec_file, "w") as f:
        json.dump(spec, f, indent=2)
    recompute_digests(case)
    field = "spec.resolved.json: tolerances.cross_topology.float64 is 1000000.0 in the evidence"
    before = tree(root)
    c = run(mih, ["check", root, "--no-progress", "--gtest_brief=1"])
    check(c.returncode == 12 and field in c.stdout and "fault F20" in c.stdout and tree(root) == before,
          f"1: mih check of the root refuses the loosened tolerances naming the field, writing nothing (exit "
          f"{c.returncode}; changed: {tree_change(before, tree(root))})", c.stdout[-2500:])
    c = run(mih, ["check", case, "--no-progress", "--gtest_brief=1"])
    check(c.returncode == 12 and field in c.stdout, f"1: mih check of the case refuses them too (exit {c.returncode})",
          c.stdout[-2500:])
    v = run(mih, ["test", "--verify-only", "--evidence-root", root, "--no-progress", "--gtest_brief=1", MOE_TWO])
    check(v.returncode == 12 and field in v.stdout and "case_run.json: fault is \"F20\" in the evidence" in v.stdout,
          f"1: mih test --verify-only refuses them and the fault-free check of a fault run (exit {v.returncode})",
          v.stdout[-2500:])
    v = run(mih, ["test", "--verify-only", "--evidence-root", root, "--no-progress", "--gtest_brief=1", "--fault", "F20",
                  "--fault-cases", "DpShard2", MOE_TWO])
    check(v.returncode == 12 and field in v.stdout and "fault is" not in v.stdout,
          f"1: ... and with --fault F20 --fault-cases DpShard2, the tolerances alone (exit {v.returncode})",
          v.stdout[-2500:])

    # 2. The report, had the checks passed: every test line passed (what a check that trusted
    # the evidence appended), the record naming F20 and the state FAILED.
    rows = [json.loads(line) for line in open(os.path.join(root, "results.jsonl")) if line.strip()]
    with open(os.path.join(root, "results.jsonl"), "w") as f:
        for row in rows:
            if "status" in row:
                row["status"], row["message"] = "passed", ""
            f.write(json.dumps(row) + "\n")
    state = json.load(open(os.path.join(case, "integration_state.json"))).get("state")
    r = run(mih, ["report", root])
    check(r.returncode == 0 and "Verdict: NOT PASSED" in r.stdout and "fault F20" in r.stdout
          and "Verdict: PASSED" not in r.stdout and " 0 failed" in r.stdout,
          f"2: mih report of all-passed lines does not call the F20 run passed (state {state})", r.stdout[:1500])
    j = run(mih, ["report", root, "--format", "junit"])
    check('failures="0"' not in j.stdout.split("\n")[1] and "CaseRecord" in j.stdout and "F20" in j.stdout,
          "2: its JUnit report has a failure for the case the record fails", j.stdout[:1500])

    # 1. A live run does not reuse the edited evidence (its digests match): it relaunches the case.
    t = run(mih, ["test", "--evidence-root", root, "--gtest_brief=1", "--fault", "F20", "--fault-cases", "DpShard2",
                  MOE_TWO])
    check(t.returncode == 1 and "relaunching moe/DpShard2: its evidence disagrees with this mih: spec.resolved.json: "
          "tolerances." in t.stdout, f"1: mih test relaunches the edited case and fails it (exit {t.returncode})",
          t.stdout[-2500:])


def export_keeps_what_mih_did_not_write(mih, work):
    """3."""
    out = os.path.join(work, "export")
    e = run(mih, ["export", "--spec", "llama", "--out", out])
    check(e.returncode == 0, f"3: a first export (exit {e.returncode})", e.stdout[-800:])
    record = json.load(open(os.path.join(out, "mih_export.json")))
    check(sorted(record.get("files", {})) == sorted(n for n in os.listdir(out) if n != "mih_export.json"),
          "3: mih_export.json lists every other file it wrote with its SHA-256", json.dumps(record.get("files")))
    tokenizer = os.path.join(out, "tokenizer.json")
    with open(tokenizer, "w") as f:
        f.write('{"mine": true}\n')
    before = tree(out)
    e = run(mih, ["export", "--spec", "llama", "--out", out, "--seed", "3"])
    check(e.returncode == 12 and "'tokenizer.json', which mih_export.json does not list" in e.stdout
          and tree(out) == before and not any(n.startswith(".export.mih-export") for n in os.listdir(work)),
          f"3: export beside a tokenizer.json mih did not write is exit 12, every file as it was (exit "
          f"{e.returncode}; changed: {tree_change(before, tree(out))})", e.stdout[-800:])
    if os.path.exists(tokenizer):
        os.remove(tokenizer)
    config = os.path.join(out, "config.json")
    with open(config, "a") as f:
        f.write("\n")
    before = tree(out)
    e = run(mih, ["export", "--spec", "llama", "--out", out, "--seed", "3"])
    check(e.returncode == 12 and "'config.json' in " in e.stdout and "was edited since mih wrote it" in e.stdout
          and tree(out) == before, f"3: export over an edited config.json is exit 12, the edit kept (exit "
          f"{e.returncode}; changed: {tree_change(before, tree(out))})", e.stdout[-800:])
    with open(config) as f:
        text = f.read()
    with open(config, "w") as f:
        f.write(text[:-1])
    e = run(mih, ["export", "--spec", "llama", "--out", out, "--seed", "3"])
    check(e.returncode == 0 and json.load(open(os.path.join(out, "mih_export.json"))).get("seed") == 3,
          f"3: an unedited earlier export is rewritten (exit {e.returncode})", e.stdout[-800:])


def check_writes_nothing(mih, work):
    """4, and 2 for a FAILED state."""
    root = os.path.join(work, "llama")
    t = run(mih, ["test", "--evidence-root", root, "--no-progress", "--gtest_brief=1", LLAMA_TWO])
    check(t.returncode == 0, f"4: the filtered llama run passes (exit {t.returncode})", t.stdout[-1500:])
    recorded = set()  # what the run said it would run (its start line)
    for line in open(os.path.join(root, "results.jsonl")):
        row = json.loads(line)
        if row.get("run", {}).get("event") == "start":
            recorded.update(row["run"]["tests"])
    for target in (root, os.path.join(root, "llama", "DpShard2")):
        before = tree(root)
        c = run(mih, ["check", target, "--no-progress", "--gtest_brief=1"])
        ran = [line for line in c.stdout.splitlines() if line.startswith("[==========]") and " ran" in line]
        check(c.returncode == 0 and tree(root) == before and "Tp2" not in c.stdout,
              f"4: mih check {os.path.relpath(target, work)} passes on what the run ran, writing nothing (exit "
              f"{c.returncode}; {ran[-1] if ran else 'no tests ran'}; changed: {tree_change(before, tree(root))})",
              c.stdout[-2000:])
    report = os.path.join(work, "check.json")
    c = run(mih, ["check", root, "--no-progress", "--gtest_output=json:" + report])
    checked = set()
    if os.path.exists(report):
        for s in json.load(open(report)).get("testsuites", []):
            checked.update(s["name"] + "." + t["name"] for t in s.get("testsuite", []) if t.get("status") == "RUN")
    check(c.returncode == 0 and recorded and checked == recorded,
          f"4: mih check of the root checks exactly the {len(recorded)} tests its run recorded ({len(checked)} checked)",
          str(sorted(checked ^ recorded))[:800])

    # 2. A case whose state is FAILED is no pass, whatever its test lines say.
    state_file = os.path.join(root, "llama", "DpShard2", "integration_state.json")
    state = json.load(open(state_file))
    state.update(state="FAILED", reason="2 of 30 tests failed (see results.jsonl of the run)")
    with open(state_file, "w") as f:
        json.dump(state, f)
    r = run(mih, ["report", root])
    check("Verdict: NOT PASSED" in r.stdout and "integration state FAILED" in r.stdout and " 0 failed" in r.stdout,
          "2: mih report does not call a run passed when a case's integration_state.json says FAILED", r.stdout[:1500])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    t0 = time.time()
    compiled_tolerances_decide(a.mih, a.work)
    export_keeps_what_mih_did_not_write(a.mih, a.work)
    check_writes_nothing(a.mih, a.work)
    print(f"{'all' if not FAILURES else len(FAILURES)} {'checks held' if not FAILURES else 'check(s) failed'} "
          f"in {time.time() - t0:.0f} s")
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
