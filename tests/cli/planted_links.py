#!/usr/bin/env python3
"""An evidence root another user can write (issue 53; ctest PlantedLinks, label runtime): black-box
runs of the real `mih` binary as root, the links planted by a second, unprivileged user that the
test makes (useradd; skipped, saying why, when not root).

1. A root every user may write (0777, no sticky bit): `mih test` is refused (exit 12) naming the
   root and `chmod o-w`, and the root-only file a planted results.jsonl points at is untouched.
2. A sticky root (1777, as /tmp): warned about, naming it; links planted at results.jsonl and
   run.json and a spec directory that is a link out of the root: exit 12 naming the link, the
   root-only files untouched, nothing (case lock, case) made where the spec link points.
3. The Python writer (python/mih_evidence.py) in a sticky case directory with links planted at
   "<file>.tmp.<pid>": the root-only file untouched, the evidence written; a case directory every
   user may write is refused.
4. A hard link the second user makes in a sticky root, results.jsonl -> a root file of their
   group (mode 0660: fs.protected_hardlinks allows it): exit 12 naming the second hard link, the
   file untouched (mih test appended its results to it before).
5. A root a group other than mih's can write (0775, no sticky bit): exit 12 naming the group and
   `chmod g-w`, nothing made in it (only warned about before: a member could swap a directory
   for a link between mih's check and its write); with the sticky bit (1775) the run passes.

Exit status: 0 every check held; 1 otherwise; 77 skipped (not root, or no useradd)."""
import os
import pwd
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
from testkit import Tally, mih_and_work  # noqa: E402

TALLY = Tally()
SELECT = "--gtest_filter=Llama/*.*/Reference"
DEBIAN_PYTHON = "/usr/bin/python3"


def secret(work, name):
    """A root-only file <work>/<name>/secret (directory 0700, file 0600) holding "root only\\n"."""
    d = os.path.join(work, name)
    os.makedirs(d, mode=0o700)
    path = os.path.join(d, "secret")
    with open(path, "w") as f:
        f.write("root only\n")
    os.chmod(path, 0o600)
    return path


def untouched(path):
    with open(path) as f:
        return f.read() == "root only\n"


def plant(user, target, link):
    subprocess.run(["runuser", "-u", user, "--", "ln", "-s", target, link], check=True)


def root_dir(work, name, mode):
    d = os.path.join(work, name)
    os.makedirs(d)
    os.chmod(d, mode)
    return d


def mih_test(mih, root):
    return subprocess.run([mih, "test", "--evidence-root", root, "--no-progress", SELECT], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)


def check(ok, what, detail=""):
    if ok:
        TALLY.ok(what)
    else:
        TALLY.fail(what + ("\n      " + detail[-2500:].replace("\n", "\n      ") if detail else ""))


def open_root(mih, work, user):
    root = root_dir(work, "open_root", 0o777)
    s = secret(work, "open_secret")
    plant(user, s, os.path.join(root, "results.jsonl"))
    r = mih_test(mih, root)
    check(r.returncode == 12 and f"{root} is writable by every user (mode 0777" in r.stdout
          and f"chmod o-w {root}" in r.stdout,
          f"1: a root every user may write is exit 12 naming it and the fix (got {r.returncode})", r.stdout)
    check(untouched(s), "1: the root-only file a planted results.jsonl points at is untouched")


def sticky_root(mih, work, user):
    root = root_dir(work, "sticky_root", 0o1777)
    results, run_record = secret(work, "results_secret"), secret(work, "run_secret")
    outside = root_dir(work, "outside", 0o755)
    plant(user, results, os.path.join(root, "results.jsonl"))
    plant(user, run_record, os.path.join(root, "run.json"))
    plant(user, outside, os.path.join(root, "llama"))
    r = mih_test(mih, root)
    check(f"mih: warning: directory {root} (mode 1777) is writable by every user" in r.stdout,
          "2: a sticky root every user may write is warned about, naming it", r.stdout)
    check(r.returncode == 12 and "it is a symbolic link, and mih never writes through one" in r.stdout
          and f"{root}/llama is a symbolic link of user '{user}'" in r.stdout,
          f"2: links planted in a sticky root are exit 12 naming them (got {r.returncode})", r.stdout)
    check(untouched(results), "2: the root-only file a planted results.jsonl points at is untouched")
    check(untouched(run_record), "2: the root-only file a planted run.json points at is untouched")
    check(os.listdir(outside) == [], f"2: nothing made where a planted spec link points: {os.listdir(outside)}")


WRITER = """
import os, subprocess, sys
sys.path.insert(0, sys.argv[1])
import torch, mih_evidence
case, user, secret = sys.argv[2:5]
for name in ("environment.json", "config.resolved.json"):
    if os.path.isdir(case):
        subprocess.run(["runuser", "-u", user, "--", "ln", "-s", secret, f"{case}/{name}.tmp.{os.getpid()}"], check=True)
mih_evidence.Session(case, torch.nn.Linear(2, 2), "Reference")
"""


def python_writer(work, user):
    if not os.access(DEBIAN_PYTHON, os.X_OK) or subprocess.run([DEBIAN_PYTHON, "-c", "import torch"]).returncode:
        print(f"skip: 3: {DEBIAN_PYTHON} with torch (python3-torch) is not installed")
        return
    python_dir = os.path.join(HERE, "..", "..", "python")
    sticky = root_dir(work, "py_sticky", 0o1777)
    s = secret(work, "py_secret")
    r = subprocess.run([DEBIAN_PYTHON, "-c", WRITER, python_dir, sticky, user, s], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    check(untouched(s), "3: the Python writer never writes through a planted <file>.tmp.<pid> link", r.stdout)
    with open(os.path.join(sticky, "config.resolved.json")) as f:
        written = f.read()
    check(r.returncode == 0 and '"dp_shard": 1' in written, "3: and writes its evidence", r.stdout + written)
    open_dir = root_dir(work, "py_open", 0o777)
    r = subprocess.run([DEBIAN_PYTHON, "-c", WRITER, python_dir, open_dir, user, s], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    check(r.returncode != 0 and f"{open_dir} is writable by every user (mode 0777, no sticky bit)" in r.stdout
          and untouched(s), f"3: a case directory every user may write is refused, naming it (exit {r.returncode})",
          r.stdout)


def hard_link(mih, work, user):
    root = root_dir(work, "hard_link_root", 0o1777)
    shared = root_dir(work, "hard_link_source", 0o755)
    target = os.path.join(shared, "secret")
    with open(target, "w") as f:
        f.write("root only\n")
    os.chown(target, 0, pwd.getpwnam(user).pw_gid)
    os.chmod(target, 0o660)
    subprocess.run(["runuser", "-u", user, "--", "ln", target, os.path.join(root, "results.jsonl")], check=True)
    r = mih_test(mih, root)
    check(r.returncode == 12 and "it has 2 hard links: another name could be any file" in r.stdout,
          f"4: a hard link planted at results.jsonl is exit 12 naming it (got {r.returncode})", r.stdout)
    check(untouched(target), "4: the file the hard link names is untouched")


def group_root(mih, work, user):
    gid = pwd.getpwnam(user).pw_gid
    root = root_dir(work, "group_root", 0o775)
    os.chown(root, 0, gid)
    os.chmod(root, 0o775)
    r = mih_test(mih, root)
    check(r.returncode == 12 and f"{root} is writable by group '{user}'" in r.stdout and f"chmod g-w {root}" in r.stdout,
          f"5: a root another group can write is exit 12 naming the group and the fix (got {r.returncode})", r.stdout)
    check(os.listdir(root) == [], f"5: nothing made in it: {os.listdir(root)}")
    sticky = root_dir(work, "group_sticky_root", 0o1775)
    os.chown(sticky, 0, gid)
    os.chmod(sticky, 0o1775)
    r = mih_test(mih, sticky)
    check(r.returncode == 0, f"5: a sticky root another group can write runs (got {r.returncode})", r.stdout)


def main():
    mih, work = mih_and_work()
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        print("skip: needs root, useradd and runuser to make a second user that plants the links")
        return 77
    os.chmod(work, 0o755)
    user = f"mihplant{os.getpid()}"
    subprocess.run(["useradd", "-M", "-r", "-s", "/usr/sbin/nologin", user], check=True)
    try:
        open_root(mih, work, user)
        sticky_root(mih, work, user)
        python_writer(work, user)
        hard_link(mih, work, user)
        group_root(mih, work, user)
    finally:
        subprocess.run(["userdel", user])
    return TALLY.summary("PlantedLinks")


if __name__ == "__main__":
    sys.exit(main())
