#!/usr/bin/env python3
"""Fork server (ctest ForkServerFreshRanks, label runtime): a rank the fork server forks starts
in exactly the state of a rank exec'd by posix_spawn, and nothing of one rank reaches the
next.

  1. `mih launch -n 2 state` with MIH_FORK_SERVER=0 (every rank exec'd): the reference state
  2. `mih launch -n 2 --repeat 3 state --mutate 1` (ranks forked; each launch's ranks change
     their environment, RNG seed, intra-op threads, fds, signal dispositions and mask, umask,
     cwd and a process-wide counter after recording them): every launch's state equals the
     reference, rank for rank (environment, fds by kind and path, blocked signals, signals
     not at their default, thread counts, intra-op and BLAS threads, the default generator's
     first draws, the counter, cwd, umask, own process group), values that name the launch
     itself aside (its run directory, port and launcher pid)
  3. run.json says the ranks of a default launch were forked and those of 1 exec'd
  4. the comparison can fail: a launch whose parent exported one more variable differs
     from the reference in exactly that variable

Exit status: 0 every check held; 1 otherwise."""
import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check  # noqa: E402

# What names the launch rather than the process: its run directory (in the rank's command,
# the store and ledger paths), its port, its launcher's pid, and the switch that chose exec.
PER_LAUNCH_ENV = ("MIH_LAUNCHER_PID", "MASTER_PORT", "MIH_STORE_FILE", "MIH_FORK_SERVER")


def launch(mih, root, run_id, args, extra_env=None, fork_server=True):
    env = dict(os.environ)
    env.pop("MIH_FORK_SERVER", None)
    if not fork_server:
        env["MIH_FORK_SERVER"] = "0"
    env.update(extra_env or {})
    r = subprocess.run([mih, "launch", "-n", "2", "--evidence-root", root, "--run-id", run_id] + args,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    check(r.returncode == 0, f"mih launch {' '.join(args)} ({'forked' if fork_server else 'exec'}) exits 0 "
          f"(exit {r.returncode})", r.stdout[-2000:])
    return r


def states(run_dir):
    out = []
    for rank in range(2):
        try:
            out.append(json.load(open(os.path.join(run_dir, f"state_rank{rank}.json"))))
        except (OSError, ValueError) as e:
            check(False, f"{run_dir}: state_rank{rank}.json is readable", str(e))
            out.append({})
    return out


def normalized(state, run_dir):
    s = json.loads(json.dumps(state).replace(run_dir, "<run_dir>"))
    for var in PER_LAUNCH_ENV:
        s.get("env", {}).pop(var, None)
    return s


def differences(a, b):
    keys = sorted(set(a) | set(b))
    out = []
    for k in keys:
        if k == "env":
            ea, eb = a.get("env", {}), b.get("env", {})
            out += [f"env {v}: {ea.get(v)!r} vs {eb.get(v)!r}" for v in sorted(set(ea) | set(eb)) if ea.get(v) != eb.get(v)]
        elif a.get(k) != b.get(k):
            out.append(f"{k}: {a.get(k)!r} vs {b.get(k)!r}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    a = ap.parse_args()
    mih = os.path.abspath(a.mih)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    root = a.work
    launch(mih, root, "exec", ["state"], fork_server=False)
    exec_dir = os.path.join(root, "exec", "state")
    reference = [normalized(s, exec_dir) for s in states(exec_dir)]
    launch(mih, root, "fork", ["--repeat", "3", "state", "--mutate", "1"])
    for k in (1, 2, 3):
        run_dir = os.path.join(root, "fork", "state", f"launch{k}")
        for rank, s in enumerate(states(run_dir)):
            diff = differences(reference[rank], normalized(s, run_dir))
            check(not diff, f"launch {k} (forked, after {k - 1} launch(es) that mutated their state), rank {rank}: "
                  f"its state equals an exec'd rank's ({len(reference[rank])} fields)", "\n".join(diff))
    # Forked or exec'd: run.json says how the launcher started each rank.
    probe = launch(mih, root, "names", ["state"])
    names_dir = os.path.join(root, "names", "state")
    run_json = json.load(open(os.path.join(names_dir, "run.json")))
    ranks = run_json.get("launch", {}).get("ranks", [])
    check(len(ranks) == 2 and all(r.get("started_by") == "fork_server" for r in ranks),
          f"the ranks of a default launch are forked by the fork server ({[r.get('started_by') for r in ranks]})",
          probe.stdout[-1500:])
    run_json = json.load(open(os.path.join(exec_dir, "run.json")))
    ranks = run_json.get("launch", {}).get("ranks", [])
    check(len(ranks) == 2 and all(r.get("started_by") == "exec" for r in ranks),
          f"with MIH_FORK_SERVER=0 they are exec'd ({[r.get('started_by') for r in ranks]})")
    # A server that dies with a rank forked but unanswered: the launcher reaps that rank and
    # execs each rank instead; no rank runs twice, none is left.
    launch(mih, root, "died", ["state"], extra_env={"MIH_FORK_SERVER_TEST_DIE": "after_fork"})
    run_json = json.load(open(os.path.join(root, "died", "state", "run.json")))
    ranks = run_json.get("launch", {}).get("ranks", [])
    left = subprocess.run(["pgrep", "-f", os.path.join(root, "died")], capture_output=True, text=True).stdout.split()
    check(len(ranks) == 2 and all(r.get("started_by") == "exec" for r in ranks) and not left,
          f"a fork server that dies mid-start: its ranks are exec'd instead ({[r.get('started_by') for r in ranks]}), "
          f"none left running ({left})")
    # The comparison can fail.
    launch(mih, root, "extra", ["state"], extra_env={"MIH_TEST_EXTRA": "1"})
    extra_dir = os.path.join(root, "extra", "state")
    diff = differences(reference[0], normalized(states(extra_dir)[0], extra_dir))
    check(diff == ["env MIH_TEST_EXTRA: None vs '1'"],
          f"a parent that exported one more variable differs in exactly that variable ({diff})")
    print(f"{'all checks held' if not FAILURES else str(len(FAILURES)) + ' check(s) failed'}")
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
