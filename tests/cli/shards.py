#!/usr/bin/env python3
"""ctest ShardedRun (label runtime): `mih test --shard i/N`, for CI systems that fan a matrix
out over jobs themselves.

  1. The shares of the whole default matrix (every spec), listed with --gtest_list_tests for
     N = 2 and 3, and of a filtered selection for N = 5: together they are exactly the tests of
     the unsharded run, no test twice, no case split over two shares, the same share when asked
     again; the filter's negative patterns still apply inside a share.
  2. Bad shares: 0/2, 3/2 and "2" are usage errors naming --shard; more shares than cases (4
     of 3) is bad input in every job, never a green; so is --shard under GoogleTest's own
     sharding (GTEST_TOTAL_SHARDS), which would split a share by test, and with --mih-list-cases.
  3. Two jobs at once on one evidence root (llama's Reference, DpShard2 and Tp2Sp): each tests
     its share; the Reference both shares compare with is launched once; one `mih test
     --verify-only` over the root passes every test of the unsharded run, and `mih report`
     counts them.
  4. Two jobs on roots of their own, copied together: the verify-only run over the copy passes
     every test; over one job's root alone it refuses the missing case (exit 12), never a pass.
  5. A job whose Reference's rank is SIGKILLed: an infrastructure exit, the case compared with
     the Reference not judged (not FAILED; the report counts its failed tests as not judged and
     blames nothing), and the job's retry passes.

Usage: shards.py --mih build/bin/mih --work DIR
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from testkit import Tally, mih_and_work, run  # noqa: E402

TALLY = Tally()
fail, ok = TALLY.fail, TALLY.ok
SMALL = "Llama/*.*/Reference:Llama/*.*/DpShard2:Llama/*.*/Tp2Sp"


def listed(mih, *args):
    """The tests `mih test --gtest_list_tests ARGS` lists ("Llama/NumericParity.LossMatches/Tp2"),
    or None after saying the failure."""
    rc, out = run([mih, "test", "--gtest_list_tests", "--no-progress", *args], timeout=120)
    if rc != 0:
        fail(f"mih test --gtest_list_tests {' '.join(args)}: exit {rc}\n{out[-3000:]}")
        return None
    tests, suite = [], None
    for line in out.splitlines():
        if not line.strip() or line.startswith("["):
            continue
        if not line.startswith(" "):
            suite = line.strip()
        elif suite:
            tests.append(suite + line.strip().split()[0])
    return tests


def case_of(test):
    return test.split("/")[0] + "/" + test.rsplit("/", 1)[1]


def check_partition(mih, what, count, extra):
    """The shares 1/count ... count/count of the selection `extra` partition it by case."""
    whole = listed(mih, *extra)
    if whole is None:
        return
    shares = [listed(mih, "--shard", f"{i}/{count}", *extra) for i in range(1, count + 1)]
    if any(s is None for s in shares):
        return
    seen, owner = {}, {}
    for i, share in enumerate(shares, 1):
        if not share:
            fail(f"{what}: share {i}/{count} lists no test")
        for t in share:
            if t in seen:
                fail(f"{what}: {t} is in share {seen[t]} and share {i}")
                return
            seen[t] = i
            if owner.setdefault(case_of(t), i) != i:
                fail(f"{what}: case {case_of(t)} is split over shares {owner[case_of(t)]} and {i}")
                return
    if sorted(seen) != sorted(whole):
        missing = sorted(set(whole) - set(seen))[:5]
        extra_tests = sorted(set(seen) - set(whole))[:5]
        fail(f"{what}: the {count} shares list {len(seen)} tests, the run {len(whole)}; missing {missing}, extra {extra_tests}")
        return
    again = listed(mih, "--shard", f"2/{count}", *extra)
    if again != shares[1]:
        fail(f"{what}: share 2/{count} differs when asked again")
        return
    sizes = [len({case_of(t) for t in s}) for s in shares]
    ok(f"{what}: {count} shares of {len(whole)} tests in {len(owner)} cases ({sizes} cases each), "
       f"every test once, no case split, the same when asked again")
    return whole


def launched(out):
    """How many cases a `mih test` run says it launched."""
    m = re.search(r"(\d+) case\(s\) launched; results in", out)
    return int(m.group(1)) if m else None


def main():
    mih, work = mih_and_work()

    # 1. The shares partition the run by case.
    check_partition(mih, "the default matrix", 2, [])
    check_partition(mih, "the default matrix", 3, [])
    filtered = check_partition(mih, "llama and moe without MatchesOriginal", 5,
                               ["--gtest_filter=Llama/*:Moe/*-*/MatchesOriginal.*"])
    if filtered is not None and any("/MatchesOriginal." in t or t.startswith("Vlm/") for t in filtered):
        fail("the filtered selection lists a test its filter excludes")

    # 2. Bad shares.
    for bad in ("0/2", "3/2", "2"):
        TALLY.expect(f"--shard {bad}", [mih, "test", "--shard", bad, "--evidence-root", os.path.join(work, "bad")], 2,
                     ["--shard"])
    for share in ("1/4", "4/4"):  # every job of too many says so, not only the one left empty
        TALLY.expect(f"{share} of 3 cases", [mih, "test", "--shard", share, "--gtest_filter=" + SMALL,
                                             "--evidence-root", os.path.join(work, "empty")], 11,
                     [f"--shard {share}: the run selects 3 cases", "use at most 3 shares"])
    env = dict(os.environ, GTEST_TOTAL_SHARDS="2", GTEST_SHARD_INDEX="0")
    p = subprocess.run([mih, "test", "--shard", "1/2", "--gtest_filter=" + SMALL, "--evidence-root",
                        os.path.join(work, "gtest-shards")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=env, timeout=120)
    if p.returncode != 11 or "GTEST_TOTAL_SHARDS" not in p.stdout:
        fail(f"--shard under GoogleTest's own sharding (GTEST_TOTAL_SHARDS=2): exit {p.returncode}, want 11 naming it\n"
             f"{p.stdout[-2000:]}")
    else:
        ok("--shard under GoogleTest's own sharding (GTEST_TOTAL_SHARDS=2): exit 11, naming it")
    TALLY.expect("--mih-list-cases with --shard", [mih, "test", "--mih-list-cases", "--shard", "1/2"], 11,
                 ["--mih-list-cases lists every case"])
    small = listed(mih, "--gtest_filter=" + SMALL)
    if not small:
        return TALLY.summary("sharded run")

    # 3. Two jobs at once on one root.
    root = os.path.join(work, "shared")
    jobs = [subprocess.Popen([mih, "test", "--shard", f"{i}/2", "--evidence-root", root, "--gtest_brief=1",
                              "--gtest_filter=" + SMALL], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for i in (1, 2)]
    outs = [j.communicate(timeout=300)[0] for j in jobs]
    for i, (j, out) in enumerate(zip(jobs, outs), 1):
        if j.returncode != 0:
            fail(f"shard {i}/2 on the shared root: exit {j.returncode}\n{out[-3000:]}")
            return TALLY.summary("sharded run")
    counts = [launched(o) for o in outs]
    if None in counts or sum(counts) != 3:
        fail(f"the two shares launched {counts} cases, want 3 in all (the Reference once)\n{outs[0][-1500:]}\n{outs[1][-1500:]}")
    else:
        ok(f"two shares at once on one root launched {counts} cases: Reference, DpShard2 and Tp2Sp once each")
    if not all("--shard" in o and "the cases they compare with run here too where needed" in o for o in outs):
        fail("a share's run does not say which cases it holds")
    out = TALLY.expect("mih test --verify-only over the shared root", [mih, "test", "--verify-only", "--evidence-root", root,
                       "--gtest_filter=" + SMALL], 0, [f"[  PASSED  ] {len(small)} tests."])
    TALLY.expect("mih report of the shared root", [mih, "report", root, "--format", "md"], 0, [" 0 failed,", "3 cases"])

    # 4. Roots of their own, copied together.
    roots = [os.path.join(work, f"job{i}") for i in (1, 2)]
    jobs = [subprocess.Popen([mih, "test", "--shard", f"{i}/2", "--evidence-root", r, "--gtest_brief=1", "--no-progress",
                              "--gtest_filter=" + SMALL], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for i, r in zip((1, 2), roots)]
    for i, j in enumerate(jobs, 1):
        out = j.communicate(timeout=300)[0]
        if j.returncode != 0:
            fail(f"shard {i}/2 on its own root: exit {j.returncode}\n{out[-3000:]}")
            return TALLY.summary("sharded run")
    merged = os.path.join(work, "merged")
    for r in roots:
        shutil.copytree(r, merged, dirs_exist_ok=True)
    TALLY.expect("mih test --verify-only over the copied roots", [mih, "test", "--verify-only", "--evidence-root", merged,
                 "--gtest_filter=" + SMALL], 0, [f"[  PASSED  ] {len(small)} tests."])
    TALLY.expect("mih test --verify-only over one job's root alone", [mih, "test", "--verify-only", "--evidence-root",
                 roots[0], "--gtest_filter=" + SMALL], 12, ["Tp2Sp"], absent=["[  PASSED  ] " + str(len(small))])

    # 5. A job whose Reference dies (a rank SIGKILLed): the case compared with it is not judged
    # (its failed tests counted apart, its state not FAILED), and the job's retry passes.
    root = os.path.join(work, "retry")
    cmd = [mih, "test", "--shard", "2/2", "--evidence-root", root, "--gtest_brief=1", "--gtest_filter=" + SMALL]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed = kill_first_rank(os.path.join(root, "llama", "Reference"))
    out = job.communicate(timeout=300)[0]
    state_file = os.path.join(root, "llama", "Tp2Sp", "integration_state.json")
    state = json.load(open(state_file)).get("state") if os.path.exists(state_file) else None
    if not killed or job.returncode not in (14, 15, 16) or "INCOMPLETE: 1 case did not complete" not in out \
            or "llama/Reference" not in out or state == "FAILED":
        fail(f"a share whose Reference died: killed {killed}, exit {job.returncode}, Tp2Sp's state {state}\n{out[-3000:]}")
    else:
        ok(f"a share whose Reference died: exit {job.returncode}, Tp2Sp not judged (state {state}), said INCOMPLETE")
        # The report reads the Reference too (no test of this share names it): not judged, no blame.
        TALLY.expect("mih report of the share whose Reference died", [mih, "report", root, "--format", "md"], 0,
                     [" 0 failed, ", " not judged (infrastructure: 1 case did not complete)", "Verdict: NOT PASSED"],
                     absent=["fails (llama/Tp2Sp)"])
        TALLY.expect("the share's retry", cmd, 0, ["[  PASSED  ]"])
    return TALLY.summary("sharded run")


def kill_first_rank(case_dir, timeout=60):
    """SIGKILLs rank 0 of case `case_dir` as soon as its launch records its pid
    (run/train/logs/rank0.pid); the pid, or None."""
    path = os.path.join(case_dir, "run", "train", "logs", "rank0.pid")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid = int(open(path).read().strip())
        except (OSError, ValueError):
            time.sleep(0.005)
            continue
        os.kill(pid, signal.SIGKILL)
        return pid
    return None


if __name__ == "__main__":
    sys.exit(main())
