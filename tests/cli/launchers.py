#!/usr/bin/env python3
"""Real launchers (ctest RealTorchrun and RealMpirun, label launchers): the commands of the
README's multi-node section, run with the launchers users run, never an imitation of their
variables:

  torchrun (Debian's python3-torch; its 1.13 release needs `-r 1 -t 1` on Python 3.11)
    1. static rendezvous, the agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True):
       selftest on tp=2 passes
    2. c10d rendezvous, rank 0 hosts the store on the port the agent chose: selftest on
       dp_shard=2 passes
    3. a rank that fails: torchrun exits non-zero and its report quotes mih's error (the rank
       writes TORCHELASTIC_ERROR_FILE), not "<N/A>"
  mpirun (openmpi-bin; rank 0 hosts the store at the exported MASTER_ADDR/MASTER_PORT)
    1. selftest on tp=2 passes
  both
    4. one conformance case (llama/DpShard2, resolved by `mih run --prepare`, its printed rank
       command run under the launcher), then `mih test --verify-only` passes (exit 0, tests
       ran); its environment.json names the launcher, the run id, every rank's host and the
       harness and libtorch versions
    5. the same case prepared with catalog fault F03: a rank started without its --fault refuses;
       run as printed, verify-only refuses it as fault-free (exit 12) and fails it with the
       fault named (exit 1)
    6. evidence that names another harness version: verify-only refuses it (exit 12, naming
       both versions) unless --allow-other-version

A launcher that is not installed is a skip with the reason (exit 77), never a pass.
Exit status: 0 every check held; 1 otherwise; 2 usage; 77 skipped."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check, prepared_command, run  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from testkit import free_port  # noqa: E402

FILTER = "--gtest_filter=Llama/*.*/Reference:Llama/*.*/DpShard2"



def launcher_argv(kind, n, rdzv="static"):
    """The launcher's own command line for `n` local ranks, up to the rank command."""
    if kind == "torchrun":
        argv = [shutil.which("torchrun"), "--nnodes", "1", "--nproc_per_node", str(n), "-r", "1", "-t", "1"]
        if rdzv == "c10d":
            argv += ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{free_port()}", "--rdzv_id", "mih-test"]
        else:
            argv += ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
        return argv + ["--no_python"]
    argv = [shutil.which("mpirun"), "--oversubscribe", "-np", str(n)]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    return argv + ["-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}"]


def launch(kind, n, rank_cmd, rdzv="static", timeout=180):
    env = dict(os.environ)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return subprocess.run(launcher_argv(kind, n, rdzv) + rank_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout, env=env)


def selftest(kind, mih, work, mesh, rdzv="static"):
    d = os.path.join(work, f"selftest_{kind}_{rdzv}_{mesh.replace('=', '')}")
    r = launch(kind, 2, [mih, "worker", "--run-dir", d, "selftest", "--mesh", mesh], rdzv)
    check(r.returncode == 0 and "all checks passed" in r.stdout,
          f"{kind}{f' ({rdzv} rendezvous)' if kind == 'torchrun' else ''}: selftest on {mesh} passes "
          f"(exit {r.returncode})", r.stdout[-3000:])


def verify(mih, root, extra=()):
    return run(mih, ["test", "--verify-only", "--evidence-root", root, "--gtest_brief=1", "--no-progress", FILTER]
               + list(extra))


def case_under(kind, mih, work):
    """Checks 4-6: one conformance case under `kind`, verify-only, a faulty twin, a version."""
    root = os.path.join(work, f"case_{kind}")
    r = run(mih, ["run", "--spec", "llama", "--case", "Reference", "--evidence-root", root])
    check(r.returncode == 0, f"{kind}: the reference runs under mih's own launcher (exit {r.returncode})",
          r.stdout[-2000:])
    cmd = prepared_command(mih, root, "DpShard2")
    if cmd is None:
        return
    r = launch(kind, 2, cmd)
    check(r.returncode == 0, f"{kind}: llama/DpShard2's prepared rank command runs under {kind} (exit {r.returncode})",
          r.stdout[-3000:])
    v = verify(mih, root)
    ran = [l for l in v.stdout.splitlines() if "tests from" in l and "ran" in l]
    check(v.returncode == 0 and ran and "PASSED" in v.stdout,
          f"{kind}: mih test --verify-only passes on that evidence (exit {v.returncode}; {ran[-1] if ran else 'no tests ran'})",
          v.stdout[-3000:])
    case_dir = os.path.join(root, "llama", "DpShard2")
    try:
        env = json.load(open(os.path.join(case_dir, "environment.json")))
    except (OSError, ValueError) as e:
        env = {}
        check(False, f"{kind}: environment.json is readable", str(e))
    versions = dict(env.get("versions", {}))
    hosts = [r.get("host") for r in env.get("ranks", [])]
    expected_source = "torchrun" if kind == "torchrun" else "openmpi"
    check(env.get("launcher") == expected_source and env.get("run_id") and len(hosts) == 2 and all(hosts)
          and versions.get("mih") and versions.get("libtorch") and versions.get("build_id"),
          f"{kind}: environment.json names the launcher ({env.get('launcher')}), the run id ({env.get('run_id')}), "
          f"every rank's host ({hosts}) and the versions ({versions.get('mih')}, libtorch {versions.get('libtorch')})",
          json.dumps(env)[:2000])

    # The verify-only path can fail: the same case with a catalog fault on every rank.
    faulty = os.path.join(work, f"faulty_{kind}")
    shutil.copytree(os.path.join(root, "llama", "Reference"), os.path.join(faulty, "llama", "Reference"))
    cmd = prepared_command(mih, faulty, "DpShard2", extra=["--fault", "F03"])
    if cmd is None:
        return
    # The prepared rank command carries the case's fault: a rank started without it refuses to
    # run (its request says F03), and one started as printed runs the fault.
    bare = [a for i, a in enumerate(cmd) if a != "--fault" and (i == 0 or cmd[i - 1] != "--fault")]
    r = launch(kind, 2, bare)
    check(r.returncode != 0 and "injects fault 'F03' but this rank runs with ''" in r.stdout,
          f"{kind}: a rank started without the case's --fault refuses to run (exit {r.returncode})", r.stdout[-3000:])
    r = launch(kind, 2, cmd)
    check(r.returncode == 0 and "FAULT F03 IN EFFECT" in r.stdout,
          f"{kind}: the case with fault F03 on every rank runs (exit {r.returncode})", r.stdout[-3000:])
    v = verify(mih, faulty)
    check(v.returncode == 12 and "check it as the fault run it is, --fault F03" in v.stdout,
          f"{kind}: verify-only refuses to judge the fault run as fault-free (exit {v.returncode})", v.stdout[-3000:])
    v = verify(mih, faulty, ["--fault", "F03", "--fault-cases", "DpShard2"])
    check(v.returncode == 1 and "NumericParity" in v.stdout,
          f"{kind}: verify-only fails on the faulty evidence (exit {v.returncode}, NumericParity named)",
          v.stdout[-3000:])

    # Another harness version's evidence is refused, naming both, unless allowed.
    path = os.path.join(case_dir, "environment.json")
    env["versions"]["mih"] = "0.0.1"
    with open(path, "w") as f:
        json.dump(env, f)
    v = verify(mih, root)
    check(v.returncode == 12 and "written by mih 0.0.1" in v.stdout and f"this is mih {versions.get('mih')}" in v.stdout,
          f"{kind}: verify-only refuses evidence of mih 0.0.1 (exit {v.returncode}), naming both versions",
          v.stdout[-2000:])
    v = verify(mih, root, ["--allow-other-version"])
    check(v.returncode == 0, f"{kind}: --allow-other-version checks it anyway (exit {v.returncode})", v.stdout[-2000:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    ap.add_argument("--launcher", required=True, choices=["torchrun", "mpirun"])
    a = ap.parse_args()
    program = shutil.which(a.launcher)
    if program is None:
        package = "python3-torch" if a.launcher == "torchrun" else "openmpi-bin"
        print(f"SKIP: {a.launcher} is not installed (Debian package {package}; scripts/test installs it)")
        return 77
    if a.launcher == "torchrun":
        probe = subprocess.run([program, "--help"], capture_output=True, text=True)
        if probe.returncode != 0:
            print(f"SKIP: {program} does not run here: {probe.stderr.strip()[-300:]}")
            return 77
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    t0 = time.time()
    mih = os.path.abspath(a.mih)
    if a.launcher == "torchrun":
        selftest("torchrun", mih, a.work, "tp=2", "static")
        selftest("torchrun", mih, a.work, "dp_shard=2", "c10d")
        d = os.path.join(a.work, "failing")
        r = launch("torchrun", 2, [mih, "worker", "--run-dir", d, "selftest", "--mesh", "tp=3"])
        root_cause = r.stdout[r.stdout.find("Root Cause"):]
        check(r.returncode != 0 and "mih::Error[invalid_spec]" in root_cause and "error_file: <N/A>" not in root_cause
              and "choose degrees whose product is 2" in root_cause,
              f"torchrun: a failing rank's error is torchrun's root cause (exit {r.returncode})", r.stdout[-3000:])
    else:
        selftest("mpirun", mih, a.work, "tp=2")
    case_under(a.launcher, mih, a.work)
    print(f"{'all checks held' if not FAILURES else str(len(FAILURES)) + ' check(s) failed'} in {time.time() - t0:.0f} s")
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
