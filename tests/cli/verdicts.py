#!/usr/bin/env python3
"""Verdicts that tell the truth (ctest RunnerVerdicts, label runtime): black-box runs of the real
`mih` binary (and of a conformance binary) on real evidence.

1. What the matrix lists is what a run checks: a matrix file without "dtype" is the float64
   lane (no LaneReference, no NoiseTwin); a selected spec none of whose listed cases can run is
   bad input (exit 11) naming every rejection, before anything launches, whatever references
   mih would add: `mih matrix`, `mih test` over every spec, a run where one spec can and one
   cannot, and a conformance binary.
2. The state and the exit status agree: a case run as ctest runs it (one case per process)
   whose every test passed is MATRIX_PASSED; a case whose integration_state.json is FAILED
   while every test passes makes `mih test` and `mih check` exit 1, naming the state.
3. Every finding code of harness/findings/codes.h is asserted by a suite: an error finding of
   each code, added to clean evidence where its check ran, fails a test of the suite table that
   names it (the code -> test table is printed); MIH-STRUCT-007 among them.
4. ActivationCheckpointEquivalence.RegionsRecomputed counts what the runtime recomputed: the
   evidence holds, per step and region, the checkpointed forwards and the recomputes backward
   ran; evidence of a run that recomputed nothing fails it.
5. `mih faults` gates the localization: a fault detected but blamed elsewhere than the catalog
   expects makes it exit 1, naming the row (made so on every CPU: the float64 lane, the row's
   expected place replaced through the test hook MIH_TEST_EXPECTED_BLAME; a malformed hook
   value is bad input).

Exit status: 0 every check held; 1 otherwise; 2 usage."""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check  # noqa: E402

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(mih, args, timeout=600):
    """`mih args`: its exit status and output (returncode None when it ran past `timeout`)."""
    try:
        return subprocess.run([mih] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return subprocess.CompletedProcess(e.cmd, None, out + f"\n(killed after {timeout} s)")


def write_json(path, j):
    with open(path, "w") as f:
        json.dump(j, f)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def state(case_dir):
    try:
        return read_json(os.path.join(case_dir, "integration_state.json"))
    except (OSError, ValueError):
        return {}


def failed_tests(gtest_json):
    """{test name: failure messages} of a --gtest_output=json file."""
    out = {}
    try:
        j = read_json(gtest_json)
    except (OSError, ValueError):
        return out
    for suite in j.get("testsuites", []):
        for t in suite.get("testsuite", []):
            if t.get("failures"):
                out[suite["name"] + "." + t["name"]] = "\n".join(f.get("failure", "") for f in t["failures"])
    return out


def matrices(a):
    """1. The matrix's listed cases are what a run checks."""
    tp3 = os.path.join(a.work, "tp3.json")
    # The file had tp=4, which the GQA specs now take (KV heads replicated): tp=3 for no spec.
    write_json(tp3, {"name": "tp3", "cases": [{"tp": 3}]})
    r = run(a.mih, ["matrix", "--spec", "llama", "--matrix", tp3])
    check(r.returncode == 11 and "lists no case spec 'llama' can run" in r.stdout and "Tp3 (tp=3 does not divide" in r.stdout,
          f"1: mih matrix of a file whose only case the spec rejects: exit 11 naming the rejection (got {r.returncode})",
          r.stdout[-1500:])
    plain = os.path.join(a.work, "dp.json")
    write_json(plain, {"name": "dp", "cases": [{"dp_shard": 2}]})
    r = run(a.mih, ["matrix", "--spec", "llama", "--matrix", plain, "--json"])
    try:
        m = json.loads(r.stdout)
        dtypes = {c["name"]: c["config"]["dtype"] for c in m["cases"]}
        listed = m["listed"]
    except (ValueError, KeyError) as e:
        dtypes, listed = {"unreadable": str(e)}, None
    check(r.returncode == 0 and dtypes == {"Reference": "float64", "DpShard2": "float64"} and listed == ["DpShard2"],
          f"1: a file without dtype is the float64 lane, no LaneReference or NoiseTwin, DpShard2 listed ({dtypes}, "
          f"listed {listed})", r.stdout[-1500:])

    root = os.path.join(a.work, "tp3-all")
    r = run(a.mih, ["test", "--matrix", tp3, "--evidence-root", root, "--no-progress"], timeout=900)
    named = all(f"spec '{s}' ({p}) can run; rejected: Tp3 (tp=3" in r.stdout for s, p in
                (("llama", "Llama"), ("moe", "Moe"), ("vlm", "Vlm")))
    launched = [d for d in ("llama", "moe", "vlm") if os.path.exists(os.path.join(root, d))]
    check(r.returncode == 11 and named and "no case the matrix lists can run" in r.stdout and not launched,
          f"1: mih test --matrix tp3.json: exit 11 naming every spec's rejection, nothing launched (got "
          f"{r.returncode}; launched {launched})", r.stdout[-3000:])

    # One spec can run the listed case and one cannot: the one that cannot is named, and the
    # run is refused as a whole (a green that checked only the other spec's references would lie).
    ep = os.path.join(a.work, "ep.json")
    write_json(ep, {"name": "ep", "cases": [{"dp_shard": 2, "ep": 2}]})
    root = os.path.join(a.work, "ep-mixed")
    r = run(a.mih, ["test", "--matrix", ep, "--prefixes", "Llama,Moe", "--evidence-root", root, "--no-progress"],
            timeout=900)
    check(r.returncode == 11 and "spec 'llama' (Llama) can run; rejected: DpShard2Ep2 (ep=2 shards routed experts" in r.stdout
          and "spec 'moe'" not in r.stdout and "--only-spec" in r.stdout and not os.path.exists(os.path.join(root, "moe")),
          f"1: a run where llama cannot run the listed ep case and moe can: exit 11 naming llama only, the fix said, "
          f"nothing launched (got {r.returncode})", r.stdout[-3000:])

    if a.plain:
        root = os.path.join(a.work, "tp3-plain")
        r = run(a.plain, ["--matrix", tp3, "--evidence-root", root, "--no-progress"], timeout=900)
        check(r.returncode == 11 and "spec 'llama' (PlainLlama) can run; rejected: Tp3" in r.stdout
              and not os.path.exists(os.path.join(root, "llama")),
              f"1: a conformance binary (mih_plain_conformance) with the same matrix: exit 11, nothing launched "
              f"(got {r.returncode})", r.stdout[-2000:])


def states(a):
    """2. The state and the exit status agree. Returns the evidence root of the clean run."""
    root = os.path.join(a.work, "ctest-style")
    # What ctest runs for one case (cmake/MihDiscoverCases.cmake): the case's tests alone.
    cmd = ["test", "--evidence-root", root, "--no-progress", "--gtest_brief=1", "--gtest_filter=Llama/*.*/DpShard2Ac"]
    r = run(a.mih, cmd, timeout=900)
    case = os.path.join(root, "llama", "DpShard2Ac")
    got = state(case).get("state")
    check(r.returncode == 0 and got == "MATRIX_PASSED",
          f"2: a case run alone as ctest runs it, every test passed: exit 0 and MATRIX_PASSED (got exit {r.returncode}, "
          f"{got})", r.stdout[-3000:])
    if r.returncode != 0:
        return None
    # The session failed the case (what it writes for an error finding) while every test passes.
    session_failed = {"schema_version": 1, "state": "FAILED", "previous_state": "STRUCTURE_VALIDATED",
                      "evidence": ["check/findings.json"],
                      "reason": "findings with errors:\nMIH-STRUCT-007 layers.1.mlp.experts.gate_up_proj: expert "
                                "parameter in the root FSDP unit"}
    failed_root = os.path.join(a.work, "ctest-style-failed")
    shutil.copytree(root, failed_root, symlinks=True)
    write_json(os.path.join(failed_root, "llama", "DpShard2Ac", "integration_state.json"), session_failed)
    r = run(a.mih, ["test", "--evidence-root", failed_root] + cmd[3:], timeout=900)
    check(r.returncode == 1 and "every test passed, but its integration_state.json is FAILED" in r.stdout
          and "launching" not in r.stdout,
          f"2: mih test reusing a case whose state is FAILED while every test passes: exit 1 naming the state (got "
          f"{r.returncode})", r.stdout[-3000:])
    r = run(a.mih, ["check", os.path.join(failed_root, "llama", "DpShard2Ac"), "--no-progress", "--gtest_brief=1"])
    check(r.returncode == 1 and "every test passed, but its integration_state.json is FAILED" in r.stdout,
          f"2: mih check of that case: exit 1 naming the state (got {r.returncode})", r.stdout[-3000:])
    r = run(a.mih, ["check", case, "--no-progress", "--gtest_brief=1"])
    check(r.returncode == 0, f"2: mih check of the MATRIX_PASSED case: exit 0 (got {r.returncode})", r.stdout[-3000:])
    return root


def error_finding(code):
    return {"code": code, "phase": "runtime", "owner": "norm.weight", "severity": "error",
            "message": f"mutation: an error finding {code}", "facts": {}, "why_unsafe": "mutation",
            "remediation": "mutation"}


def codes_of_header():
    """Every finding code of harness/findings/codes.h, and the size kAllCodes declares."""
    with open(os.path.join(SOURCE, "harness", "findings", "codes.h")) as f:
        text = f.read()
    codes = re.findall(r'inline constexpr const char\* k\w+ = "(MIH-[A-Z]+-\d+)"', text)
    size = re.search(r"std::array<CodeRow, (\d+)> kAllCodes", text)
    return codes, int(size.group(1)) if size else -1


def codes_asserted(a, clean_root):
    """3. Every code of codes.h fails a test of the suite table that names it."""
    codes, declared = codes_of_header()
    check(len(codes) == declared and len(set(codes)) == len(codes),
          f"3: codes.h defines {len(codes)} distinct codes, kAllCodes lists {declared}")
    # The clean base: cases where every check runs (FSDP, AC, tp, cp over a cp-replicated field,
    # a modality, frozen and tied parameters, and pp with a tie, where mih's session records no
    # digests and ReplicaConsistency asserts MIH-PROBE-001), beside the ctest-style case of section 2.
    base = os.path.join(a.work, "codes-base")
    extra = ["Llama/*.*/Tp2Sp", "Vlm/*.*/Cp2Zz", "VlmFrozenVision/*.*/DpShard2", "LlamaTied/*.*/DpShard2",
             "LlamaTied/*.*/Pp2Mb2"]
    r = run(a.mih, ["test", "--evidence-root", base, "--no-progress", "--gtest_brief=1", "--prefixes",
                    "Llama,Vlm,VlmFrozenVision,LlamaTied", "--gtest_filter=" + ":".join(extra)], timeout=900)
    check(r.returncode == 0, f"3: the clean base run passes (exit {r.returncode})", r.stdout[-3000:])
    targets = [(clean_root, "llama", "DpShard2Ac"), (base, "llama", "Tp2Sp"), (base, "vlm", "Cp2Zz"),
               (base, "vlm_frozen_vision", "DpShard2"), (base, "llama_tied", "DpShard2"), (base, "llama_tied", "Pp2Mb2")]
    asserted = {}  # code -> the tests that failed naming it
    for i, (root, spec, case) in enumerate(targets):
        if not root or not os.path.isdir(os.path.join(root, spec, case)):
            check(False, f"3: clean evidence of {spec}/{case} exists")
            continue
        copy = os.path.join(a.work, f"codes-{i}")
        shutil.copytree(os.path.join(root, spec), os.path.join(copy, spec), symlinks=True)
        findings_path = os.path.join(copy, spec, case, "check", "findings.json")
        j = read_json(findings_path)
        j["findings"] += [error_finding(c) for c in codes]
        j["status"] = "FAIL"
        write_json(findings_path, j)
        out = os.path.join(copy, "gtest.json")
        r = run(a.mih, ["check", os.path.join(copy, spec, case), "--allow-edited-evidence", "--no-progress",
                        "--gtest_brief=1", "--gtest_output=json:" + out])
        for test, message in failed_tests(out).items():
            for c in codes:
                if f"{c} " in message or f"{c}:" in message:
                    asserted.setdefault(c, set()).add(test.split("/")[1] if "/" in test else test)
    width = max(len(c) for c in codes)
    for c in codes:
        print(f"      {c:<{width}}  {', '.join(sorted(asserted.get(c, []))) or 'ASSERTED BY NO SUITE'}")
    missing = [c for c in codes if c not in asserted]
    check(not missing, f"3: every code of codes.h fails a test of the suite table that names it "
          f"({len(codes) - len(missing)}/{len(codes)}; none for {', '.join(missing) or '-'})",
          "" if not missing else
          "a code no test names is emitted but never fails a run: assert it in the suite of its check "
          "(suites/*.cpp, no_error_findings); if a suite does and applies only where none of these cases is ("
          + ", ".join(f"{s}/{c}" for _, s, c in targets) + "), add such a case to `targets` here")
    check("MIH-STRUCT-007" in asserted and any(t.startswith("FsdpUnits.") for t in asserted.get("MIH-STRUCT-007", [])),
          "3: MIH-STRUCT-007 (experts in the root FSDP unit) fails FsdpUnits")


def recomputes(a, clean_root):
    """4. RegionsRecomputed reads what the runtime recomputed, not the config flag."""
    case = os.path.join(clean_root, "llama", "DpShard2Ac") if clean_root else ""
    try:
        ac = read_json(os.path.join(case, "check", "activation_checkpoint.json"))
    except (OSError, ValueError) as e:
        check(False, "4: check/activation_checkpoint.json is readable", str(e))
        return
    steps = ac.get("steps", [])
    per_step = [sum(c.get("recomputed", 0) for c in s.get("regions", {}).values()) for s in steps]
    whole = all(c.get("recomputed") == c.get("checkpointed") and c.get("checkpointed", 0) > 0
                for s in steps for c in s.get("regions", {}).values())
    check(len(steps) == 3 and whole and all(n > 0 for n in per_step) and len(steps[0].get("regions", {})) == len(ac["regions"]),
          f"4: the runtime recorded, per step and region, the checkpointed forwards and their recomputes "
          f"(recomputes per step {per_step}, regions {ac.get('regions')})", json.dumps(ac)[:1500])
    for name, mutate in (("nothing recomputed", lambda r: r.update(recomputed=0)),
                         ("nothing checkpointed", lambda r: r.update(recomputed=0, checkpointed=0))):
        copy = os.path.join(a.work, "ac-" + name.replace(" ", "-"))
        shutil.copytree(os.path.join(clean_root, "llama"), os.path.join(copy, "llama"), symlinks=True)
        path = os.path.join(copy, "llama", "DpShard2Ac", "check", "activation_checkpoint.json")
        j = read_json(path)
        for s in j.get("steps", []):
            for region in s.get("regions", {}).values():
                mutate(region)
        write_json(path, j)
        out = os.path.join(copy, "gtest.json")
        r = run(a.mih, ["check", os.path.join(copy, "llama", "DpShard2Ac"), "--allow-edited-evidence", "--no-progress",
                        "--gtest_brief=1", "--gtest_output=json:" + out])
        failed = failed_tests(out)
        mine = failed.get("Llama/ActivationCheckpointEquivalence.RegionsRecomputed/DpShard2Ac", "")
        check(r.returncode == 1 and ("recomputed it 0 time(s)" in mine or "recomputed nothing" in mine),
              f"4: evidence of a run with AC configured and {name}: RegionsRecomputed fails (exit {r.returncode}; "
              f"failed {sorted(failed)})", mine[-1500:] or r.stdout[-1500:])


def faults_gate(a):
    """5. A fault detected but not localized where the catalog expects fails `mih faults`.

    Deterministic: the float64 lane (no reduced-precision kernel decides anything) with the
    row's expected place replaced by a deliberately wrong one through the test hook
    MIH_TEST_EXPECTED_BLAME (harness/cases/faults.cpp), so the fault is detected and blamed
    elsewhere than "expected" on every CPU."""
    hook = "MIH_TEST_EXPECTED_BLAME"
    env = dict(os.environ)
    env.pop(hook, None)
    # A malformed hook value is bad input naming the variable, before anything runs.
    r = subprocess.run([a.mih, "faults", "--fault", a.mislocalized_fault, "--out", os.path.join(a.work, "faults-bad"),
                        "--no-progress"], env=dict(env, **{hook: "F99=lm_head"}), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    check(r.returncode == 11 and f"{hook}='F99=lm_head'" in r.stdout and "ID=place" in r.stdout
          and not os.path.exists(os.path.join(a.work, "faults-bad", "fault-free")),
          f"5: {hook} naming no catalog row is bad input naming the variable, nothing run (got {r.returncode})",
          r.stdout[-1500:])
    out = os.path.join(a.work, "faults")
    wrong = f"{a.mislocalized_fault}={a.wrong_blame}"
    try:
        r = subprocess.run([a.mih, "faults", "--fault", a.mislocalized_fault, "--out", out, "--no-progress"],
                           env=dict(env, **{hook: wrong}), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=900)
    except subprocess.TimeoutExpired as e:
        check(False, "5: mih faults ended within 900 s", str(e))
        return
    try:
        row = read_json(os.path.join(out, "faults.json"))["faults"][0]
    except (OSError, ValueError, KeyError, IndexError) as e:
        check(False, "5: mih faults wrote faults.json", str(e) + r.stdout[-2000:])
        return
    print(f"      {row['id']} (float64, {hook}={wrong}): detected {row['detected']} by {row['caught_by']}, blamed "
          f"'{row['blamed']}', expected '{row['expected_blame']}'")
    check(row["detected"] and row["blamed"] and row["blamed"] != a.wrong_blame and not row["localized"]
          and row["expected_blame"] == a.wrong_blame and row.get("expected_blame_from") == hook
          and r.returncode == 1 and f"NOT LOCALIZED {row['id']}" in r.stdout and f"expects '{a.wrong_blame}'" in r.stdout
          and f"{hook} is set" in r.stdout,
          f"5: mih faults --fault {row['id']} with its expected place made wrong ({wrong}), detected and blamed "
          f"elsewhere: exit 1 naming the row and saying the hook is set (got {r.returncode})", r.stdout[-2000:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mih", required=True)
    ap.add_argument("--plain", help="a conformance binary (mih_plain_conformance)")
    ap.add_argument("--work", required=True)
    ap.add_argument("--mislocalized-fault", default="F08",
                    help="a catalog fault the float64 lane detects, made mislocalized by ...")
    ap.add_argument("--wrong-blame", default="lm_head", help="... expecting it blamed here instead (not where it lives)")
    ap.add_argument("--only", help="comma-separated sections to run (matrices,states,codes,recomputes,faults)")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    only = set(a.only.split(",")) if a.only else None
    want = lambda s: only is None or s in only  # noqa: E731
    if want("matrices"):
        matrices(a)
    clean = states(a) if (want("states") or want("codes") or want("recomputes")) else None
    if want("codes"):
        codes_asserted(a, clean)
    if want("recomputes"):
        recomputes(a, clean)
    if want("faults"):
        faults_gate(a)
    print(f"{'all checks held' if not FAILURES else str(len(FAILURES)) + ' check(s) failed'}")
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
