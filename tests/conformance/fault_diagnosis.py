#!/usr/bin/env python3
"""The diagnosis across each catalog fault's cases (ctest FaultDiagnosis, label faults), read from
the detection matrix the `faults` test wrote (`mih faults --json`): no catalog is run again.

For every fault: the diagnosis names the catalog's expected feature (the fault's own case, its
contrast cases run with the same fault, and the Reference), separates the cases (or finds every
case failing, for a fault of the model or the data), and its smallest pair is a failing case that
ran with the fault and a passing one, each with a `mih run` command. Then the pair of one fault
(--rerun, default F23) is rerun with the real binary: the failing `mih run` must exit 1 and the
passing one 0, and its `mih test` of both must exit 1 printing the diagnosis of the two cases above
GoogleTest's list of failures, which `mih report` then shows as Markdown, JUnit and HTML.
Prints one line per fault and `N/N faults diagnosed as expected`.
Exit status: 0 every fault diagnosed and the pair reproduced; 1 otherwise; 2 usage."""
import argparse
import json
import os
import shlex
import subprocess
import sys


def check_row(row):
    """The problems of one row of faults.json (empty when its diagnosis is as expected)."""
    problems = []
    d = row.get("diagnosis")
    expected = row.get("expected_diagnosis", "")
    if not isinstance(d, dict):
        return ["no diagnosis in the row"]
    if not expected:
        problems.append("the catalog row has no expected_diagnosis")
    if expected not in d.get("features", []):
        problems.append(f"the diagnosis names {d.get('features')} ({d.get('kind')}), not the expected '{expected}'")
    if expected == "every_case":
        if d.get("kind") != "every_case" or not any(c.endswith("/Reference") for c in d.get("failing", [])):
            problems.append("a fault of the model or the data must fail every case, the Reference included")
    elif expected == "original_model":
        # A config-invariant fault (the port against the original model): only MatchesOriginal
        # fails, on the Reference; every parallel case agrees with the faulty Reference.
        if d.get("kind") != "original_model" or not any(c.endswith("/Reference") for c in d.get("failing", [])):
            problems.append("a config-invariant fault must fail only MatchesOriginal, on the Reference")
        if f"{row['spec']}/{row['case']}" not in d.get("passing", []):
            problems.append(f"its parallel case {row['spec']}/{row['case']} must pass (it agrees with its Reference)")
        # Said first, with the layer where the Reference leaves the original (issue 52).
        summary = d.get("summary", "")
        if not summary.startswith("the port does not compute the original model") or "localized to '" not in summary:
            problems.append("the diagnosis does not lead with 'the port does not compute the original model' naming "
                            f"the first diverging layer: {summary[:200]}")
    elif expected == "world_size>1":
        # A fault of what every parallel layout shares (a reduction over the whole mesh): every
        # parallel case fails, two of them at least (one is "too few cases to tell").
        if d.get("kind") != "every_parallel" or len(d.get("failing", [])) < 2:
            problems.append(f"kind {d.get('kind')} with {len(d.get('failing', []))} failing case(s): not every "
                            "parallel case of two or more")
    elif d.get("kind") != "separated":
        problems.append(f"kind {d.get('kind')}: the cases are not separated")
    case = f"{row['spec']}/{row['case']}"
    if expected != "original_model" and case not in d.get("failing", []):
        problems.append(f"the faulty case {case} is not among the failing ones: {d.get('failing')}")
    if not row.get("diagnosed"):
        problems.append("mih faults did not count it as diagnosed")
    pair = d.get("pair")
    if expected not in ("every_case", "original_model"):
        if not pair:
            problems.append("no smallest pair to rerun")
        else:
            if pair["failing"] not in d["failing"] or pair["passing"] not in d["passing"]:
                problems.append(f"the pair {pair['failing']} / {pair['passing']} is not failing / passing")
            for key, name in (("failing_command", pair["failing"]), ("passing_command", pair["passing"])):
                spec, case_name = name.split("/", 1)
                if not pair[key].startswith(f"mih run --spec {spec} --case {case_name}"):
                    problems.append(f"{key} '{pair[key]}' does not rerun {name}")
            if f"--fault {row['id']}" not in pair["failing_command"]:
                problems.append(f"the failing command does not inject {row['id']}: {pair['failing_command']}")
    problems += contrast_problems(row)
    return problems


def contrast_problems(row):
    """A contrast must be judged against fault-free cases: a BAD INPUT failure of one case that
    names another (the fault not reached in what it is compared with) means the contrast run
    compared it with a case that ran with the fault."""
    results = os.path.join(os.path.dirname(os.path.dirname(row["evidence"])), "contrast", "results.jsonl")
    if not row.get("contrast") or not os.path.exists(results):
        return [] if not row.get("contrast") else [f"{results} is missing"]
    problems = []
    with open(results) as f:
        for line in f:
            t = json.loads(line)
            message = t.get("message", "")
            if t.get("status") == "failed" and "BAD INPUT" in message and \
                    f"case {t['spec']}/{t['case']} " not in message:
                problems.append(f"contrast {t['spec']}/{t['case']} {t['suite']}.{t['test']} failed as BAD INPUT of "
                                f"another case: {message[message.find('BAD INPUT'):][:160]}")
    return problems[:3]


def run(argv, cwd):
    r = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    print(f"  {' '.join(shlex.quote(a) for a in argv)}\n    -> exit {r.returncode}")
    return r


def rerun(mih, row, work):
    """Runs the pair's commands as a user would; returns the problems (empty when the `mih run`
    commands exit 1 and 0, and `mih test` of both exits 1 printing the diagnosis of the two
    cases above GoogleTest's list of failures, which `mih report` shows in every format)."""
    pair = row["diagnosis"]["pair"]
    problems = []
    os.makedirs(work, exist_ok=True)
    for key, want in (("failing_command", 1), ("passing_command", 0)):
        argv = shlex.split(pair[key])
        assert argv[0] == "mih"
        r = run([mih] + argv[1:] + ["--evidence-root", os.path.join(work, key)], work)
        if r.returncode != want:
            problems.append(f"{pair[key]} exited {r.returncode}, not {want}:\n{r.stdout[-2000:]}")
    if not pair.get("test_command"):
        return problems + ["the pair has no `mih test` command for both verdicts"]
    argv = shlex.split(pair["test_command"])
    root = os.path.join(work, "test_command")
    r = run([mih] + argv[1:] + ["--evidence-root", root, "--no-progress"], work)
    failing, passing = pair["failing"], pair["passing"]
    want = f"[ DIAGNOSIS ] 1 of 2 cases fails: {failing}, the only one with"
    if r.returncode != 1:
        problems.append(f"{pair['test_command']} exited {r.returncode}, not 1:\n{r.stdout[-2000:]}")
    at, summary = r.stdout.find(want), r.stdout.find("tests, listed below:")
    if at < 0 or summary < 0 or at > summary:
        problems.append(f"`mih test` of the pair does not print '{want}' above GoogleTest's list of failures:\n"
                        f"{r.stdout[-3000:]}")
    else:
        print("    " + r.stdout[at:r.stdout.find("\n", at)])
    for fmt in ("md", "junit", "html"):
        rep = subprocess.run([mih, "report", root, "--format", fmt], stdout=subprocess.PIPE, text=True)
        text = rep.stdout.replace("&gt;", ">")
        if rep.returncode != 0 or f"1 of 2 cases fails: {failing}, the only one with" not in text or passing not in text:
            problems.append(f"`mih report --format {fmt}` of that run does not show the diagnosis")
    return problems


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--faults-json", required=True, help="the detection matrix of `mih faults --json`")
    p.add_argument("--mih", required=True, help="the mih binary (reruns the pair)")
    p.add_argument("--work", required=True, help="where the pair's reruns write their evidence")
    p.add_argument("--rerun", default="F23", help="the fault whose pair is rerun ('' for none)")
    a = p.parse_args()
    a.mih = os.path.abspath(a.mih)
    if not os.path.exists(a.faults_json):
        print(f"{a.faults_json} is missing: run the fault catalog first (ctest -R '^faults$', or mih faults --json FILE)")
        return 1
    with open(a.faults_json) as f:
        matrix = json.load(f)
    rows = matrix.get("faults", [])
    failed = 0
    for row in rows:
        problems = check_row(row)
        d = row.get("diagnosis") or {}
        print(f"{row['id']} {'ok ' if not problems else 'BAD'} expected {row.get('expected_diagnosis', '')!r}: "
              f"{d.get('summary', '(none)')}")
        for problem in problems:
            print(f"    {problem}")
        failed += 1 if problems else 0
    print(f"{len(rows) - failed}/{len(rows)} faults diagnosed as expected")
    if not rows:
        print("faults.json holds no fault")
        return 1
    if a.rerun:
        row = next((r for r in rows if r["id"] == a.rerun), None)
        if row is None or not (row.get("diagnosis") or {}).get("pair"):
            print(f"{a.rerun}: no pair to rerun in {a.faults_json}")
            return 1
        print(f"rerunning the smallest pair of {a.rerun}:")
        problems = rerun(a.mih, row, a.work)
        for problem in problems:
            print(f"    {problem}")
        failed += 1 if problems else 0
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
