#!/usr/bin/env python3
"""Hostile input and a hostile environment get their documented outcome (ctest RunnerHostile,
label runtime): black-box runs of the real `mih` binary, real rank processes, real signals, a
real small tmpfs and a read-only mount (as root; skipped with the reason otherwise).

5. A full disk: exit 12 naming the path and the free space, whole lines in results.jsonl,
   the report saying "incomplete: K of N tests", the case not relaunched test after test;
   SIGINT/SIGTERM of the parent: the ranks stopped, what is done written and said (exit
   128 + the signal), the report incomplete, a rerun finishing the run.
6. No abort and the right exit code: an evidence root that is a file, a symlink loop or
   read-only (12); malformed option values (2, naming the option); `mih compare` with a bad
   tolerance (2), of two specs (12), of directories that do not exist (12, nothing created);
   `mih check` of a directory holding another case's evidence or of a damaged case record
   (12, naming it); a truncated or FIFO evidence file (12, never a divergence or a hang); a
   timeout too large to count (2); an unknown --only-spec (11); 100000 local ranks (11,
   before any starts); a report never counting an older result of a test the last run did
   not finish. A forged record or evidence (a float world_size, another case's name, no
   digests, an unreached fault without a fault, a link out of the case, a resolved spec or
   case request of the wrong shape with its digest recomputed) is exit 12 naming it; JUnit
   fails a case whose record cannot be read; mih test relaunches over a damaged state.
7. Strict JSON: floats, booleans, strings and overflow where integers go, duplicate keys,
   two different cases under one name,
   an empty case list, max_world_size < 1, a missing file or a directory (11, naming the
   file and the field); more ranks than the local launcher can carry is warned about.
8. Exposure: an inherited GLOO_SOCKET_IFNAME does not move a local run off loopback; the
   TCPStore of `mih launch --rendezvous tcp` listens on loopback only (every listening socket
   of the launcher, read from /proc while it runs); a --run-id that is a path is refused; an exported MIH_FAULT changes no run (the worker says
   it ignores it) and a fault given with --fault is printed on the rank's first line and in
   every failing test.

Exit status: 0 every check held; 1 otherwise; 2 usage."""
import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check, rank_pids, run, wait_for  # noqa: E402

LLAMA_TWO = "--gtest_filter=Llama/*.*/Reference:Llama/*.*/DpShard2"


def is_root():
    return os.geteuid() == 0


def mount_tmpfs(path, size, options=""):
    os.makedirs(path, exist_ok=True)
    opts = f"size={size}" + ("," + options if options else "")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", path], capture_output=True, text=True)
    return r.returncode == 0, r.stderr.strip()


def umount(path):
    subprocess.run(["umount", "-l", path], capture_output=True)


def jsonl_whole(path):
    """(every line is JSON and ends with a newline, the lines)."""
    if not os.path.exists(path):
        return True, []
    data = open(path, "rb").read()
    if data and not data.endswith(b"\n"):
        return False, []
    rows = []
    for line in data.decode("utf-8", "replace").splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            return False, rows
    return True, rows


def full_disk(mih, work):
    if not is_root():
        print("skip  5a: a full disk needs a tmpfs mount, which needs root")
        return
    mnt = os.path.join(work, "full")
    ok, err = mount_tmpfs(mnt, "1m")
    if not ok:
        print(f"skip  5a: cannot mount a tmpfs ({err})")
        return
    try:
        root = os.path.join(mnt, "root")
        r = run(mih, ["test", "--evidence-root", root, "--gtest_brief=1", LLAMA_TWO])
        out = r.stdout
        check(r.returncode == 12, f"5a: a full disk is exit 12 (got {r.returncode})", out[-3000:])
        check("No space left on device" in out and "MiB free" in out, "5a: the error names the cause and the free space",
              out[-3000:])
        check(out.count("llama/Reference: launching") <= 1 and out.count("llama/DpShard2: launching") <= 1,
              "5a: no case is launched more than once", out[-3000:])
        whole, rows = jsonl_whole(os.path.join(root, "results.jsonl"))
        check(whole, "5a: results.jsonl holds whole lines only")
        for dirpath, _, files in os.walk(root):
            for f in files:
                if f.endswith(".jsonl"):
                    w, _ = jsonl_whole(os.path.join(dirpath, f))
                    check(w, f"5a: {os.path.relpath(os.path.join(dirpath, f), root)} holds whole lines only")
        starts = [row["run"] for row in rows if "run" in row and row["run"].get("event") == "start"]
        expected = len(starts[-1]["tests"]) if starts else 0
        recorded = len({row["name"] for row in rows if "name" in row})
        rep = run(mih, ["report", root, "--format", "md"])
        if recorded < expected:
            check(f"incomplete: {recorded} of {expected} tests" in rep.stdout,
                  f"5a: the report says incomplete: {recorded} of {expected} tests", rep.stdout[:1500])
        else:
            check("incomplete" not in rep.stdout, "5a: every test was recorded and the report says complete")
        # Space again: the rerun relaunches what did not complete and passes.
        os.makedirs(os.path.join(work, "moved"), exist_ok=True)
        shutil.copytree(root, os.path.join(work, "moved", "root"))
    finally:
        umount(mnt)
    root = os.path.join(work, "moved", "root")
    again = run(mih, ["test", "--evidence-root", root, "--gtest_brief=1", "--no-progress", LLAMA_TWO])
    check(again.returncode == 0, f"5a: with space again the rerun passes (exit {again.returncode})", again.stdout[-3000:])
    rep = run(mih, ["report", root, "--format", "md"])
    check(rep.returncode == 0 and "incomplete" not in rep.stdout, "5a: and the report of the root is complete",
          rep.stdout[:1500])


def interrupted(mih, work, sig):
    name = signal.Signals(sig).name
    root = os.path.join(work, "int-" + name)
    p = subprocess.Popen([mih, "test", "--evidence-root", root, "--gtest_brief=1", LLAMA_TWO],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    case_dir = os.path.join(root, "llama", "DpShard2")
    pids = wait_for(lambda: len(rank_pids(case_dir)) == 2 and rank_pids(case_dir), 90)
    p.send_signal(sig)
    out, _ = p.communicate(timeout=60)
    check(pids is not None, f"5b: {name}: the run was signalled while a 2-rank case trained", out[-2000:])
    check(p.returncode == 128 + sig, f"5b: {name} exits {128 + sig} (got {p.returncode})", out[-2000:])
    check(f"interrupted by {name}" in out and "rerun the same command" in out, f"5b: {name}: it says so and what to do",
          out[-2000:])
    check(wait_for(lambda: not rank_pids(case_dir), 10) is not None or not rank_pids(case_dir),
          f"5b: {name}: no rank outlives it")
    whole, rows = jsonl_whole(os.path.join(root, "results.jsonl"))
    ends = [row["run"] for row in rows if "run" in row and row["run"].get("event") == "end"]
    check(whole and ends and ends[-1].get("interrupted") == name,
          f"5b: {name}: results.jsonl is whole and its end line says interrupted", json.dumps(ends)[:500])
    rep = run(mih, ["report", root, "--format", "md"])
    check("incomplete:" in rep.stdout and f"interrupted by {name}" in rep.stdout,
          f"5b: {name}: the report says incomplete and why", rep.stdout[:1500])
    run_json = os.path.join(case_dir, "case_run.json")
    if os.path.exists(run_json):
        check(json.load(open(run_json)).get("outcome") == "interrupted", f"5b: {name}: the case is recorded as interrupted")
    again = run(mih, ["test", "--evidence-root", root, "--gtest_brief=1", "--no-progress", LLAMA_TWO])
    check(again.returncode == 0, f"5b: {name}: the rerun finishes the run (exit {again.returncode})", again.stdout[-2000:])
    rep = run(mih, ["report", root, "--format", "md"])
    check("incomplete" not in rep.stdout, f"5b: {name}: and its report is complete", rep.stdout[:1000])


def bad_inputs(mih, work):
    target = os.path.join(work, "afile")
    open(target, "w").close()
    sel = "--gtest_filter=Llama/*.*/Reference"
    r = run(mih, ["test", "--evidence-root", target, "--no-progress", sel])
    check(r.returncode == 12 and target in r.stdout, f"6: an evidence root that is a file is exit 12 naming it "
          f"(got {r.returncode})", r.stdout[-1500:])
    loop = os.path.join(work, "loop1")
    if not os.path.lexists(loop):
        os.symlink(os.path.join(work, "loop2"), loop)
        os.symlink(loop, os.path.join(work, "loop2"))
    r = run(mih, ["test", "--evidence-root", os.path.join(loop, "x"), "--no-progress", sel])
    check(r.returncode == 12 and "symbolic links" in r.stdout, f"6: a symlink loop is exit 12 (got {r.returncode})",
          r.stdout[-1500:])
    if is_root():
        ro = os.path.join(work, "ro")
        ok, err = mount_tmpfs(ro, "1m", "ro")
        if ok:
            try:
                r = run(mih, ["test", "--evidence-root", os.path.join(ro, "root"), "--no-progress", sel])
                check(r.returncode == 12 and "Read-only file system" in r.stdout,
                      f"6: a read-only evidence root is exit 12, not a verdict (got {r.returncode})", r.stdout[-1500:])
            finally:
                umount(ro)
        else:
            print(f"skip  6: read-only mount: {err}")
    else:
        print("skip  6: a read-only mount needs root")
    for value in ("abc", "1e400", "0", "-5", "nan"):
        r = run(mih, ["test", "--case-timeout", value, sel])
        check(r.returncode == 2 and "--case-timeout" in r.stdout, f"6: --case-timeout {value} is a usage error (exit 2, "
              f"got {r.returncode})", r.stdout[-600:])


def evidence_inputs(mih, work):
    root = os.path.join(work, "evidence")
    r = run(mih, ["test", "--evidence-root", root, "--gtest_brief=1", "--no-progress",
                  "--gtest_filter=Llama/*.*/Reference:Moe/*.*/Reference"])
    check(r.returncode == 0, f"6: the evidence for the compare and check inputs is made (exit {r.returncode})",
          r.stdout[-2000:])
    ref, moe = os.path.join(root, "llama", "Reference"), os.path.join(root, "moe", "Reference")
    for tol in ("-1", "nan"):
        c = run(mih, ["compare", "--tolerance", tol, ref, ref])
        check(c.returncode == 2 and "--tolerance" in c.stdout, f"6: compare --tolerance {tol} is exit 2 "
              f"(got {c.returncode})", c.stdout[-600:])
    c = run(mih, ["compare", ref, moe])
    check(c.returncode == 12 and "spec 'llama'" in c.stdout and "spec 'moe'" in c.stdout,
          f"6: compare of two specs says so (exit 12, got {c.returncode})", c.stdout[-600:])
    missing = os.path.join(work, "nothing", "here")
    c = run(mih, ["compare", missing, ref])
    check(c.returncode == 12 and not os.path.exists(missing), f"6: compare of a missing directory is exit 12 and "
          f"creates nothing (got {c.returncode})", c.stdout[-600:])
    copy = os.path.join(work, "copy", "llama", "DpShard2")
    shutil.copytree(ref, copy)
    c = run(mih, ["check", copy])
    check(c.returncode == 12 and "holds the evidence of llama/Reference" in c.stdout,
          f"6: check of a directory holding another case's evidence is exit 12 naming it (got {c.returncode})",
          c.stdout[-800:])
    damaged = os.path.join(work, "damaged")
    shutil.copytree(root, damaged, ignore=shutil.ignore_patterns("moe"))
    with open(os.path.join(damaged, "llama", "Reference", "case_run.json"), "wb") as f:
        f.write(os.urandom(3000))
    c = run(mih, ["check", damaged])
    check(c.returncode == 12 and "case_run.json" in c.stdout and "rerun the case" in c.stdout,
          f"6: check of a damaged case record is exit 12 naming the file (got {c.returncode})", c.stdout[-800:])


def options_and_records(mih, work):
    """Help for the pass-through commands, option values checked as such (2) or as names of
    nothing (11), digests of case_run.json honoured by `mih check`, `mih run` evidence reused by
    `mih test`, and an incomplete run saying whether its process ended or died."""
    for cmd, expect in ((["test", "--help"], "--allow-edited-evidence"), (["check", "--help"], "mih check <evidence>")):
        r = run(mih, cmd)
        check(r.returncode == 0 and expect in r.stdout, f"6: `mih {' '.join(cmd)}` lists the options (exit "
              f"{r.returncode})", r.stdout[-800:])
    r = run(mih, ["test", "--fault", "F03", "--fault-cases", "Bogus", "--gtest_filter=Llama/*.*/Reference"])
    check(r.returncode == 11 and "'Bogus'" in r.stdout, f"6: --fault-cases of no case is exit 11 naming it (got "
          f"{r.returncode})", r.stdout[-600:])
    r = run(mih, ["test", "--fault", "", "--fault-cases", "DpShard2", "--gtest_filter=Llama/*.*/Reference"])
    check(r.returncode == 2 and "--fault" in r.stdout, f"6: an empty --fault is exit 2 (got {r.returncode})",
          r.stdout[-600:])
    root = os.path.join(work, "evidence")
    ref = os.path.join(root, "llama", "Reference")
    r = run(mih, ["report", root, "--format", "bogus"])
    check(r.returncode == 2 and "--format" in r.stdout, f"6: report --format bogus is exit 2 (got {r.returncode})",
          r.stdout[-600:])
    r = run(mih, ["compare", ref, ref, "--from-step", "99999999999999999999"])
    check(r.returncode == 2 and "--from-step" in r.stdout, f"6: an overflowing --from-step is exit 2, not clamped "
          f"(got {r.returncode})", r.stdout[-600:])
    r = run(mih, ["compare", ref, ref, "--tolerance", "1e-400"])
    check(r.returncode == 2 and "out of the range" in r.stdout, f"6: --tolerance 1e-400 is exit 2, said out of range "
          f"(got {r.returncode})", r.stdout[-600:])
    odd = os.path.join(work, "odd")
    os.makedirs(os.path.join(odd, "results.jsonl"), exist_ok=True)
    r = run(mih, ["report", odd])
    check(r.returncode == 12 and "results.jsonl" in r.stdout, f"6: a results.jsonl that is a directory is exit 12, "
          f"not 0 tests (got {r.returncode})", r.stdout[-600:])
    # A start line with no end line after it: the process died (a SIGKILL leaves exactly this).
    dead = os.path.join(work, "dead")
    os.makedirs(dead, exist_ok=True)
    with open(os.path.join(dead, "results.jsonl"), "w") as f:
        f.write(json.dumps({"run": {"event": "start", "tests": ["A.b/Reference"]}}) + "\n")
    r = run(mih, ["report", dead])
    check("incomplete: 0 of 1 tests (the last run has no end line: its process died" in r.stdout,
          "6: an incomplete run with no end line says its process died", r.stdout[-600:])
    # mih check trusts no file its run did not write: an edit is exit 12 unless asked for.
    edited = os.path.join(work, "edited", "llama", "Reference")
    shutil.copytree(ref, edited)
    # An edit the contract cannot see (a number changed, the file still valid): the digest.
    metrics = os.path.join(edited, "cases", "runtime", "metrics.jsonl")
    rows = [json.loads(l) for l in open(metrics)]
    rows[-1]["loss"] += 1.0
    with open(metrics, "w") as f:
        f.write("".join(json.dumps(row) + "\n" for row in rows))
    r = run(mih, ["check", edited])
    check(r.returncode == 12 and "metrics.jsonl changed after its run wrote it" in r.stdout,
          f"6: check of an edited evidence file is exit 12 naming it (got {r.returncode})", r.stdout[-800:])
    r = run(mih, ["check", edited, "--allow-edited-evidence", "--gtest_brief=1"])
    check(r.returncode in (0, 1) and "changed after" not in r.stdout, f"6: --allow-edited-evidence checks it as it "
          f"is (exit {r.returncode})", r.stdout[-800:])
    # An edit that breaks the file (an empty line): the evidence contract, whatever the flags.
    with open(metrics, "a") as f:
        f.write("\n")
    r = run(mih, ["check", edited, "--allow-edited-evidence"])
    check(r.returncode == 12 and "cases/runtime/metrics.jsonl: field line 4: is not JSON" in r.stdout,
          f"6: check of a broken evidence file is exit 12 naming its line, even with --allow-edited-evidence "
          f"(got {r.returncode})", r.stdout[-800:])
    # `mih run` writes the fingerprint `mih test` computes: the case is reused, not relaunched.
    reuse = os.path.join(work, "reuse")
    r = run(mih, ["run", "--spec", "llama", "--case", "Reference", "--evidence-root", reuse])
    t = run(mih, ["test", "--evidence-root", reuse, "--gtest_brief=1", "--gtest_filter=Llama/*.*/Reference"])
    check(r.returncode == 0 and t.returncode == 0 and "launching" not in t.stdout,
          f"6: `mih test` reuses the evidence of `mih run` (exits {r.returncode}, {t.returncode})", t.stdout[-800:])
    # A test run that passed every suite advances integration_state.json: still reused after.
    t = run(mih, ["test", "--evidence-root", reuse, "--gtest_brief=1", "--gtest_filter=Llama/*.*/Reference"])
    check(t.returncode == 0 and "launching" not in t.stdout, f"6: a case that passed is reused by the next run "
          f"(exit {t.returncode})", t.stdout[-800:])
    # The record copies the request (both hold the timeouts): a record edited alone is refused,
    # and a case run under another timeout is relaunched saying which (issue 36's trial).
    lying = os.path.join(work, "lying", "llama", "Reference")
    shutil.copytree(os.path.join(reuse, "llama", "Reference"), lying)
    record_file = os.path.join(lying, "case_run.json")
    record = json.load(open(record_file))
    record["case_timeout_ms"] = 200000
    open(record_file, "w").write(json.dumps(record))
    r = run(mih, ["check", lying])
    check(r.returncode == 12 and "case_timeout_ms is 200000, but run/case.json, the request its ranks read, says "
          "300000" in r.stdout, f"6: a record whose timeout disagrees with its request is exit 12 (got {r.returncode})",
          r.stdout[-800:])
    r = run(mih, ["run", "--spec", "llama", "--case", "Reference", "--evidence-root", reuse, "--timeout", "200"])
    t = run(mih, ["test", "--evidence-root", reuse, "--gtest_brief=1", "--gtest_filter=Llama/*.*/Reference"])
    check(t.returncode == 0 and "another case timeout (200000 ms, this run 300000 ms)" in t.stdout,
          f"6: a case run under another timeout is relaunched naming it (exits {r.returncode}, {t.returncode})",
          t.stdout[-800:])
    # Evidence is never deleted behind the user's back (a new-user trial lost both ways):
    # `mih run --prepare` over a finished case refuses, and `mih test` does not relaunch over
    # an external launch's evidence (no case_run.json, launcher not mih's).
    case_dir = os.path.join(reuse, "llama", "Reference")
    before = sum(len(files) for _, _, files in os.walk(case_dir))
    r = run(mih, ["run", "--prepare", "--spec", "llama", "--case", "Reference", "--evidence-root", reuse])
    after = sum(len(files) for _, _, files in os.walk(case_dir))
    check(r.returncode == 12 and "which preparing would delete" in r.stdout and after == before,
          f"6: --prepare over a finished case refuses and deletes nothing (exit {r.returncode}, {before} -> {after} "
          f"files)", r.stdout[-800:])
    ext = os.path.join(work, "external")
    r = run(mih, ["run", "--prepare", "--spec", "llama", "--case", "Reference", "--evidence-root", ext])
    line = next((l for l in r.stdout.splitlines() if l.startswith("train (")), "")
    argv = [mih] + shlex.split(line.split("): ", 1)[1])[1:] if "): " in line else [mih, "--no-such-command"]
    env = dict(os.environ, WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(29000 + os.getpid() % 700))
    w = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
    check(w.returncode == 0, f"6: the prepared rank command runs as printed (exit {w.returncode})", w.stdout[-800:])
    t = run(mih, ["test", "--evidence-root", ext, "--gtest_brief=1", "--gtest_filter=Llama/*.*/Reference"])
    check(t.returncode == 12 and "holds the evidence of an external launch (launcher env" in t.stdout and
          os.path.exists(os.path.join(ext, "llama", "Reference", "environment.json")),
          f"6: mih test does not relaunch over an external launch's evidence (exit {t.returncode})", t.stdout[-800:])
    v = run(mih, ["check", os.path.join(ext, "llama", "Reference"), "--gtest_brief=1"])
    check(v.returncode == 0, f"6: mih check judges it (exit {v.returncode})", v.stdout[-800:])


def damaged_evidence(mih, work):
    """Evidence damaged the ways a disk, an editor or a copy damages it: exit 12, never a hang,
    never a verdict; a report never counts an older result for a test a later run did not finish."""
    ref = os.path.join(work, "evidence", "llama", "Reference")
    a, b = os.path.join(work, "dmg", "a", "llama", "Reference"), os.path.join(work, "dmg", "b", "llama", "Reference")
    shutil.copytree(ref, a)
    shutil.copytree(ref, b)
    metrics = os.path.join(b, "cases", "runtime", "metrics.jsonl")
    data = open(metrics, "rb").read()
    with open(metrics, "wb") as f:
        f.write(data[: len(data) - len(data.splitlines()[-1]) // 2 - 1])  # the last line cut in half
    c = run(mih, ["compare", a, b])
    check(c.returncode == 12 and "metrics.jsonl: field line 3: the last line has no newline: the file was truncated"
          in c.stdout, f"6: compare of a truncated metrics.jsonl "
          f"is exit 12 naming it, not a divergence (got {c.returncode})", c.stdout[-600:])
    os.remove(metrics)
    os.mkfifo(metrics)
    try:
        c = run(mih, ["compare", a, b], timeout=60)
        check(c.returncode == 12, f"6: compare of a FIFO in place of metrics.jsonl is exit 12, no hang (got "
              f"{c.returncode})", c.stdout[-600:])
    except subprocess.TimeoutExpired:
        check(False, "6: compare of a FIFO in place of metrics.jsonl hangs")
    # A case record that says the case did not complete for an environment reason is exit 12
    # (outcome_code, as a live run), not a crashed rank's 16; one that is JSON but not an
    # object is bad evidence (12), not an internal error (17) or a test failure (1).
    d = os.path.join(work, "dmg", "c", "llama", "Reference")
    shutil.copytree(ref, d)
    record = os.path.join(d, "case_run.json")
    rec = json.load(open(record))
    rec["outcome"] = "environment_failure"
    json.dump(rec, open(record, "w"))
    c = run(mih, ["check", d])
    check(c.returncode == 12 and "ENVIRONMENT" in c.stdout, f"6: a recorded environment failure is exit 12 in a "
          f"check (got {c.returncode})", c.stdout[-600:])
    with open(record, "w") as f:
        f.write("[1, 2]\n")
    c = run(mih, ["check", d])
    check(c.returncode == 12 and "case_run.json: Value type not permitted by 'type' constraint (the value is array [1,2])"
          in c.stdout, f"6: a case_run.json that is no object is exit 12 "
          f"naming it (got {c.returncode})", c.stdout[-600:])
    rep = os.path.join(work, "stale")
    os.makedirs(rep)
    names = ["Llama/NumericParity.LossMatchesReference/Reference", "Llama/Structure.A/Reference"]
    lines = [{"run": {"event": "start", "tests": names}}]
    lines += [{"name": n, "status": "passed"} for n in names] + [{"run": {"event": "end", "completed": 2}}]
    lines += [{"run": {"event": "start", "tests": names}}, {"name": names[0], "status": "passed"},
              {"run": {"event": "end", "completed": 1, "interrupted": "SIGTERM"}}]
    with open(os.path.join(rep, "results.jsonl"), "w") as f:
        f.write("".join(json.dumps(l) + "\n" for l in lines))
    r = run(mih, ["report", rep, "--format", "md"])
    check("incomplete: 1 of 2 tests (interrupted by SIGTERM" in r.stdout, "6: a report does not count an older result "
          "for a test the last run did not finish", r.stdout[:800])
    for args, what in ((["run", "--spec", "llama", "--case", "Reference", "--timeout", "1e10"], "--timeout 1e10"),
                       (["test", "--case-timeout", "1e10", "--gtest_filter=Llama/*.*/Reference"], "--case-timeout 1e10")):
        r = run(mih, args + ["--evidence-root", os.path.join(work, "big")])
        check(r.returncode == 2 and what.split()[0] in r.stdout, f"6: {what} is a usage error, not a false timeout "
              f"(got {r.returncode})", r.stdout[-600:])
    r = run(mih, ["test", "--only-spec", "nope", "--evidence-root", os.path.join(work, "nope")])
    check(r.returncode == 11 and "unknown spec 'nope'" in r.stdout, f"6: --only-spec of an unknown spec is exit 11 "
          f"(got {r.returncode})", r.stdout[-600:])
    t0 = time.time()
    p = subprocess.Popen([mih, "launch", "-n", "100000", "--evidence-root", os.path.join(work, "many"), "ping"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=30)
        check(p.returncode == 11 and "more than this machine can run" in out and time.time() - t0 < 20,
              f"6: 100000 local ranks are refused before any starts (got {p.returncode})", out[-600:])
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the ranks it started, with it
        p.communicate()
        check(False, "6: 100000 local ranks are refused before any starts (it started them)")


def rehash(case_dir, relative):
    """case_run.json's digest of `relative` recomputed as the runner computes it: an edit that
    the digests no longer reveal, so that what is checked is the reader of the edited file."""
    import hashlib
    record = os.path.join(case_dir, "case_run.json")
    rec = json.load(open(record))
    rec["files"][relative] = hashlib.sha256(open(os.path.join(case_dir, relative), "rb").read()).hexdigest()
    json.dump(rec, open(record, "w"))


def forged_records(mih, work):
    """A case record and evidence forged the ways a hostile user forges them (a trial of this
    round found each one passing, or failing with the wrong exit status): exit 12 naming what is
    wrong, never 0 (a pass of evidence nobody ran), 1 (a model failure), 11 or 17; mih test
    relaunches such a case; a JUnit report fails a case whose record cannot be read."""
    src = os.path.join(work, "evidence")

    def copy(name):
        root = os.path.join(work, "forged", name)
        shutil.copytree(src, root)
        return root, os.path.join(root, "llama", "Reference")

    def edit_record(case_dir, change):
        record = os.path.join(case_dir, "case_run.json")
        rec = json.load(open(record))
        change(rec)
        json.dump(rec, open(record, "w"))

    def expect_12(case_dir, words, what):
        c = run(mih, ["check", case_dir], timeout=120)
        check(c.returncode == 12 and all(w in c.stdout for w in words), f"6: {what}: mih check is exit 12 naming "
              f"{words} (got {c.returncode})", c.stdout[-800:])

    _, d = copy("world-size")
    edit_record(d, lambda r: r.update({"world_size": 1.7}))
    expect_12(d, ["case_run.json", "world_size"], "a float world_size in the record")
    _, d = copy("other-case")
    edit_record(d, lambda r: r.update({"case": "DpShard2", "spec": "vlm"}))
    expect_12(d, ["record of vlm/DpShard2"], "a record naming another case")
    _, d = copy("no-digests")
    edit_record(d, lambda r: r.update({"files": {}}))
    expect_12(d, ["files", "no evidence digest"], "a record without digests")
    _, d = copy("not-reached")
    edit_record(d, lambda r: r.update({"outcome": "fault_not_reached"}))
    expect_12(d, ["fault_not_reached", "without a fault"], "a fault-free record claiming an unreached fault")
    _, d = copy("forged-failure")
    edit_record(d, lambda r: r.update({"outcome": "failed"}))
    expect_12(d, ["outcome 'failed'", "no reason"], "a passing case's record edited to say it failed")
    _, d = copy("symlink")
    findings = os.path.join(d, "check", "findings.json")
    outside = os.path.join(work, "forged", "outside-findings.json")
    shutil.copyfile(findings, outside)
    os.remove(findings)
    os.symlink(outside, findings)
    expect_12(d, ["check/findings.json: is a symlink"], "an evidence file replaced by a link out of the case")
    _, d = copy("spec-array")
    with open(os.path.join(d, "spec.resolved.json"), "w") as f:
        f.write("[1]\n")
    rehash(d, "spec.resolved.json")
    expect_12(d, ["spec.resolved.json: Value type not permitted", "array [1]"], "a resolved spec that is an array")
    _, d = copy("request-field")
    request = os.path.join(d, "run", "case.json")
    req = json.load(open(request))
    req["fault"] = 3
    json.dump(req, open(request, "w"))
    rehash(d, "run/case.json")
    expect_12(d, ["run/case.json: field fault: Value type not permitted", "number 3"], "a case request with a mistyped field")
    # The report of a root whose record lost its outcome: JUnit fails the case.
    root, d = copy("junit")
    edit_record(d, lambda r: r.pop("outcome"))
    j = run(mih, ["report", root, "--format", "junit"])
    check(j.returncode == 0 and 'failures="0"' not in j.stdout.split("<testsuite", 1)[0] and "outcome" in j.stdout,
          "6: a JUnit report fails a case whose record cannot be read, naming the field", j.stdout[:1500])
    # A damaged integration state is relaunched over by mih test, which then passes.
    root, d = copy("state")
    with open(os.path.join(d, "integration_state.json"), "w") as f:
        f.write("[]\n")
    t = run(mih, ["test", "--evidence-root", root, "--gtest_brief=1", "--no-progress",
                  "--gtest_filter=Llama/*.*/Reference"], timeout=300)
    check(t.returncode == 0 and "relaunching llama/Reference" in t.stdout and "integration state" in t.stdout,
          f"6: mih test relaunches a case whose integration state is damaged, and passes (got {t.returncode})",
          t.stdout[-1500:])


def strict_json(mih, work):
    base = {"name": "m", "dtype": "float64", "device": "cpu", "pg_backend": "gloo", "steps": 3, "max_world_size": 4}
    bad = {
        "float": (dict(base, cases=[{"dp_shard": 2.5}]), "'dp_shard' must be an integer"),
        "bool": (dict(base, cases=[{"dp_shard": True}]), "'dp_shard' must be an integer"),
        "overflow": (dict(base, cases=[{"dp_shard": 2147483648}]), "fits in 32 bits"),
        "steps": (dict(base, steps="three", cases=[{"dp_shard": 2}]), "'steps' must be an integer"),
        "world": (dict(base, max_world_size=-1, cases=[{"dp_shard": 2}]), "'max_world_size' must be an integer in [1"),
        "empty": (dict(base, cases=[]), "'cases' is empty"),
        "reference": (dict(base, reference=1, cases=[{"dp_shard": 2}]), "'reference' must be true or false"),
        "nul": (dict(base, name="a\u0000b", cases=[{"dp_shard": 2}]), "control character"),
    }
    for name, (matrix, expect) in bad.items():
        path = os.path.join(work, name + ".json")
        with open(path, "w") as f:
            json.dump(matrix, f)
        r = run(mih, ["matrix", "--spec", "llama", "--matrix", path])
        check(r.returncode == 11 and expect in r.stdout and path in r.stdout,
              f"7: matrix {name}: exit 11 naming the file and the field (got {r.returncode})", r.stdout[-600:])
    dup = os.path.join(work, "dup.json")
    with open(dup, "w") as f:
        f.write('{"name": "d", "steps": 3, "steps": 4, "cases": [{"dp_shard": 2}]}')
    r = run(mih, ["matrix", "--spec", "llama", "--matrix", dup])
    check(r.returncode == 11 and "'steps' appears twice" in r.stdout, f"7: a duplicate key is exit 11 (got "
          f"{r.returncode})", r.stdout[-600:])
    r = run(mih, ["matrix", "--spec", "llama", "--matrix", os.path.join(work, "absent.json")])
    check(r.returncode == 11 and "does not exist" in r.stdout, f"7: a missing matrix file is said as such (got "
          f"{r.returncode})", r.stdout[-600:])
    os.makedirs(os.path.join(work, "dir.json"), exist_ok=True)
    r = run(mih, ["matrix", "--spec", "llama", "--matrix", os.path.join(work, "dir.json")])
    check(r.returncode == 11 and "not a file" in r.stdout, f"7: a directory is said as such (got {r.returncode})",
          r.stdout[-600:])
    twins = os.path.join(work, "twins.json")
    with open(twins, "w") as f:
        json.dump(dict(base, cases=[{"dp_shard": 2, "seed": 1}, {"dp_shard": 2, "seed": 2}]), f)
    r = run(mih, ["matrix", "--spec", "llama", "--matrix", twins])
    check(r.returncode == 11 and "both named DpShard2 but differ" in r.stdout, f"7: two different cases under one "
          f"name are exit 11, not one silently dropped (got {r.returncode})", r.stdout[-600:])
    rejected = os.path.join(work, "rejected.json")
    with open(rejected, "w") as f:
        json.dump(dict(base, cases=[{"tp": 3}]), f)
    r = run(mih, ["matrix", "--spec", "llama", "--matrix", rejected])
    check(r.returncode == 11 and "rejected Tp3" in r.stdout, f"7: a matrix with no runnable case is exit 11 with the "
          f"arithmetic (got {r.returncode})", r.stdout[-600:])
    many = os.path.join(work, "many.json")
    with open(many, "w") as f:
        json.dump(dict(base, max_world_size=64, cases=[{"dp_shard": 8}]), f)
    r = run(mih, ["matrix", "--spec", "llama", "--matrix", many])
    cores = os.cpu_count() or 1
    if 8 > 2 * cores:
        check(r.returncode == 0 and "warning" in r.stdout and "CPU cores" in r.stdout,
              f"7: 8 ranks on {cores} cores is warned about", r.stdout[-600:])


# /proc/net/tcp{,6} local addresses (hex, 32-bit words in host order) that are loopback.
LOOPBACK_HEX = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}


def listening_addresses(pid):
    """The local addresses (hex, as /proc/net/tcp{,6} writes them) of pid's listening TCP sockets."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return set()
    found = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                lines = f.readlines()[1:]
        except OSError:  # it ended meanwhile
            return found
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # state LISTEN
                found.add(cols[1])
    return found


def processes_naming(text):
    """The pids whose command line contains `text`: the launch, wherever it runs (the `mih` front
    forks it from its warm server, not as its own child), and its ranks."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    out.append(int(pid))
        except OSError:
            pass
    return out


def tcp_store_on_loopback(mih, work):
    root = os.path.join(work, "tcp")
    p = subprocess.Popen([mih, "launch", "--rendezvous", "tcp", "-n", "2", "--evidence-root", root, "selftest"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = set()
    while p.poll() is None:
        for pid in processes_naming(root):
            seen |= listening_addresses(pid)
        time.sleep(0.01)
    out = p.stdout.read()
    wide = sorted(a for a in seen if a.split(":")[0] not in LOOPBACK_HEX)
    check(p.returncode == 0 and seen and not wide,
          f"8: the TCPStore of `launch --rendezvous tcp` listens on loopback only (exit {p.returncode}; listening: "
          f"{sorted(seen)}; not loopback: {wide})", out[-800:])


def exposure(mih, work):
    tcp_store_on_loopback(mih, work)
    root = os.path.join(work, "exposure")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="mihnosuch0", MIH_FAULT="F03")
    r = subprocess.run([mih, "run", "--spec", "llama", "--case", "DpShard2", "--evidence-root", root], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check(r.returncode == 0, f"8: an inherited GLOO_SOCKET_IFNAME and MIH_FAULT change nothing of a local run "
          f"(exit {r.returncode})", r.stdout[-2000:])
    record = json.load(open(os.path.join(root, "llama", "DpShard2", "case_run.json")))
    check(record.get("fault") == "", "8: the case ran fault-free", json.dumps(record)[:300])
    r = run(mih, ["launch", "--world-size", "1", "--evidence-root", os.path.join(work, "launch"), "--run-id", "../../x",
                  "selftest"])
    check(r.returncode in (2, 11) and "--run-id" in r.stdout and not os.path.exists(os.path.join(work, "..", "x")),
          f"8: a --run-id that is a path is refused (got {r.returncode})", r.stdout[-600:])
    # The torchrun path: a worker started with an ambient MIH_FAULT says it ignores it.
    rundir = os.path.join(work, "worker")
    env = dict(os.environ, MIH_FAULT="F03", WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT="29731")
    w = subprocess.run([mih, "worker", "--run-dir", rundir, "--gloo-host", "127.0.0.1", "selftest", "--dtypes",
                        "float32"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    check("ignoring MIH_FAULT=F03" in w.stdout, f"8: a worker under an outside launcher ignores MIH_FAULT, saying so "
          f"(exit {w.returncode})", w.stdout[-1500:])
    # A fault given on the command line is printed on the rank's first line and in every failure.
    root = os.path.join(work, "fault")
    t = run(mih, ["test", "--evidence-root", root, "--gtest_brief=1", "--no-progress", "--fault", "F03",
                  "--fault-cases", "DpShard2", LLAMA_TWO])
    log = os.path.join(root, "llama", "DpShard2", "run", "train", "logs", "rank0.log")
    first = open(log).readline() if os.path.exists(log) else ""
    check("FAULT F03 IN EFFECT" in first, "8: the faulty rank's log says so on its first line", first)
    _, rows = jsonl_whole(os.path.join(root, "results.jsonl"))
    failed = [row for row in rows if row.get("status") == "failed"]
    check(t.returncode == 1 and failed and all("fault F03 is injected" in row["message"] for row in failed),
          f"8: every failing test of the faulty case names the fault ({len(failed)} failed, exit {t.returncode})",
          t.stdout[-1500:])
    # A fault whose code the case never runs (F26 is in dropout; the llama has none) checked
    # nothing: bad input (exit 11) naming where the catalog runs it, never a pass. Rerun, the
    # case is relaunched, not reused, and says it again.
    root = os.path.join(work, "unreached")
    for attempt in ("first run", "rerun"):
        t = run(mih, ["test", "--evidence-root", root, "--gtest_brief=1", "--no-progress", "--fault", "F26",
                      "--fault-cases", "DpShard2", LLAMA_TWO])
        record = os.path.join(root, "llama", "DpShard2", "case_run.json")
        rec = json.load(open(record)) if os.path.exists(record) else {}
        check(t.returncode == 11 and "no rank reached its fault point" in t.stdout and "llama_dropout" in t.stdout
              and "BAD INPUT" in t.stdout and rec.get("fault_reached") is False
              and rec.get("outcome") == "fault_not_reached",
              f"8: an unreached fault is exit 11 naming where it runs, recorded in case_run.json ({attempt}: exit "
              f"{t.returncode}, fault_reached {rec.get('fault_reached')})", t.stdout[-1500:])
    rec = json.load(open(os.path.join(work, "fault", "llama", "DpShard2", "case_run.json")))
    check(rec.get("fault_reached") is True, "8: a fault that fired is recorded as reached", str(rec.get("fault_reached")))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    a = ap.parse_args()
    for sub in ("full", "ro"):
        umount(os.path.join(a.work, sub))
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    t0 = time.time()
    full_disk(a.mih, a.work)
    interrupted(a.mih, a.work, signal.SIGINT)
    interrupted(a.mih, a.work, signal.SIGTERM)
    bad_inputs(a.mih, a.work)
    evidence_inputs(a.mih, a.work)
    options_and_records(a.mih, a.work)
    damaged_evidence(a.mih, a.work)
    forged_records(a.mih, a.work)
    strict_json(a.mih, a.work)
    exposure(a.mih, a.work)
    print(f"{'all' if not FAILURES else len(FAILURES)} {'checks held' if not FAILURES else 'check(s) failed'} "
          f"in {time.time() - t0:.0f} s")
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
