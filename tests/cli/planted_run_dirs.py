#!/usr/bin/env python3
"""Run directories, submit records and goldens in a directory another user can write (issue 53,
items 5-7; ctest PlantedRunDirs, label runtime): black-box runs of the real `mih` binary as root,
the links and directories planted by a second, unprivileged user that the test makes (useradd;
skipped, saying why, when not root).

5. `mih worker --run-dir <sticky>/run1` under Debian's torchrun, and `mih launch` into the same
   kind of root, where the user made run1/comm (0777) with ledger_rank0.jsonl a link to a
   root-only file: refused (not exit 0), naming the user's directory; the root-only file keeps
   its bytes.
6. `mih submit` into a sticky root where the user planted .mih-submit, as a link to a root-only
   directory or as their own 0777 directory: exit 12 naming .mih-submit, nothing written into
   either (sbatch is never reached; SLURM_CONF points nowhere, so nothing could be queued).
7. `mih golden --out <sticky>/g4` where g4 is the user's link to an empty root-only directory:
   exit 12 naming the link; the directory stays empty.

Exit status: 0 every check held; 1 otherwise; 77 skipped (not root, or no useradd)."""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
from testkit import Tally, free_port, mih_and_work  # noqa: E402

TALLY = Tally()
TORCHRUN = "/usr/bin/torchrun"


def check(ok, what, detail=""):
    if ok:
        TALLY.ok(what)
    else:
        TALLY.fail(what + ("\n      " + detail[-2500:].replace("\n", "\n      ") if detail else ""))


def as_user(user, *argv):
    subprocess.run(["runuser", "-u", user, "--", *argv], check=True)


def make_dir(path, mode):
    os.makedirs(path)
    os.chmod(path, mode)
    return path


def secret(work, name):
    """A root-only file <work>/<name>/secret (directory 0700, file 0600) holding "root only\\n"."""
    path = os.path.join(make_dir(os.path.join(work, name), 0o700), "secret")
    with open(path, "w") as f:
        f.write("root only\n")
    os.chmod(path, 0o600)
    return path


def untouched(path):
    with open(path) as f:
        return f.read() == "root only\n"


def run(argv, timeout=300, env=None):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, env=env)


def planted_run_dir(work, user, name):
    """<work>/<name> (1777) holding the user's run1/comm (0777) with ledger_rank0.jsonl a link to
    a root-only file; returns (run1, the file)."""
    root = make_dir(os.path.join(work, name), 0o1777)
    s = secret(work, name + "_secret")
    run1 = os.path.join(root, "run1")
    as_user(user, "mkdir", "-p", "-m", "777", os.path.join(run1, "comm"))
    as_user(user, "ln", "-s", s, os.path.join(run1, "comm", "ledger_rank0.jsonl"))
    return run1, s


def worker_run_dir(mih, work, user):
    if not os.access(TORCHRUN, os.X_OK):
        TALLY.ok(f"5: skipped mih worker under torchrun: no {TORCHRUN} (python3-torch)")
        return
    run1, s = planted_run_dir(work, user, "worker_root")
    r = run([TORCHRUN, "--nnodes", "1", "--nproc_per_node=2", "-r", "1", "-t", "1", "--no_python", "--master_port",
             str(free_port()), mih, "worker", "--run-dir", run1, "selftest", "--mesh", "dp_shard=2"])
    check(r.returncode != 0, f"5: mih worker --run-dir into the user's run1/comm is refused (got exit {r.returncode})",
          r.stdout)
    check(untouched(s), "5: mih worker: the root-only file the planted ledger link points at keeps its bytes")
    check(f"{run1} belongs to user '{user}'" in r.stdout, "5: mih worker names the user's run directory", r.stdout)


def launch_run_dir(mih, work, user):
    run1, s = planted_run_dir(work, user, "launch_root")
    r = run([mih, "launch", "-n", "2", "--evidence-root", os.path.dirname(run1), "--run-id", "run1", "ping"])
    check(r.returncode == 12 and f"{run1} belongs to user '{user}'" in r.stdout,
          f"5: mih launch into the user's run directory is exit 12 naming it (got {r.returncode})", r.stdout)
    check(untouched(s), "5: mih launch: the root-only file the planted ledger link points at keeps its bytes")


def submit(mih, work, user):
    env = dict(os.environ, SLURM_CONF=os.path.join(work, "no-slurm.conf"))
    for kind in ("link", "dir"):
        root = make_dir(os.path.join(work, f"submit_{kind}"), 0o1777)
        planted = os.path.join(root, ".mih-submit")
        if kind == "link":
            target = make_dir(os.path.join(work, "submit_secret"), 0o700)
            as_user(user, "ln", "-s", target, planted)
        else:
            as_user(user, "mkdir", "-m", "777", planted)
            target = planted
        r = run([mih, "submit", "--spec", "llama", "--cases", "Reference", "--evidence-root", root], timeout=120,
                env=env)
        check(r.returncode == 12 and planted in r.stdout,
              f"6: mih submit with .mih-submit the user's {kind} is exit 12 naming it (got {r.returncode})", r.stdout)
        written = [os.path.join(d, f) for d, _, files in os.walk(target) for f in files]
        check(not written, f"6: mih submit wrote nothing into the {kind}'s directory", "\n".join(written))


def golden(mih, work, user):
    root = make_dir(os.path.join(work, "golden_root"), 0o1777)
    target = make_dir(os.path.join(work, "golden_secret"), 0o700)
    link = os.path.join(root, "g4")
    as_user(user, "ln", "-s", target, link)
    r = run([mih, "golden", "--out", link, "--no-noise-twin"])
    check(r.returncode == 12 and f"{link} is a symbolic link of user '{user}'" in r.stdout,
          f"7: mih golden --out the user's link is exit 12 naming it (got {r.returncode})", r.stdout)
    check(not os.listdir(target), f"7: mih golden wrote nothing into the root-only directory: {os.listdir(target)}")


def main():
    mih, work = mih_and_work()
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        print("skip: needs root, useradd and runuser to make a second user that plants the links")
        return 77
    os.chmod(work, 0o755)
    user = f"mihrun{os.getpid()}"
    subprocess.run(["useradd", "-M", "-r", "-s", "/usr/sbin/nologin", user], check=True)
    try:
        worker_run_dir(mih, work, user)
        launch_run_dir(mih, work, user)
        submit(mih, work, user)
        golden(mih, work, user)
    finally:
        subprocess.run(["userdel", user])
    return TALLY.summary("PlantedRunDirs")


if __name__ == "__main__":
    sys.exit(main())
