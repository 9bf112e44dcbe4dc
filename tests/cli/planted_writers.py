#!/usr/bin/env python3
"""Where mih's writers write inside an evidence root another user can write (issue 53; ctest
PlantedLinksWriters, label runtime): the Python writer (python/mih_evidence.py) and the real `mih`
binary's stale-temp sweep, as root, beside what a second, unprivileged user that the test makes
(useradd; skipped, saying why, when not root) planted. (tests/cli/planted_links.py: the links.)

1. The Python writer in a sticky case directory where the second user planted a link `check` to a
   root-only directory: refused, naming check, within seconds; nothing written in that directory.
2. The Python writer where the second user made cases/runtime (theirs, 0777) holding a FIFO
   metrics.jsonl: refused naming their cases/ within seconds (run under a timeout: it hung in
   end_step), nothing of root's written there; in a sticky cases/runtime of root's, a FIFO
   metrics.jsonl of theirs is refused naming it (never a hang), and so is a second hard link.
3. mih's stale-temp sweep in a sticky root: the second user's own bob/thesis.tmp.<dead pid> and
   notes.tmp.<dead pid> are kept; mih's own stale <file>.tmp.<dead pid> is still removed.

Exit status: 0 every check held; 1 otherwise; 77 skipped (not root, or no useradd)."""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
from testkit import Tally, mih_and_work  # noqa: E402

TALLY = Tally()
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
    return subprocess.run([mih, "test", "--evidence-root", root, "--no-progress", "--gtest_filter=Llama/*.*/Reference"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)


def check(ok, what, detail=""):
    if ok:
        TALLY.ok(what)
    else:
        TALLY.fail(what + ("\n      " + detail[-2500:].replace("\n", "\n      ") if detail else ""))


NESTED = """
import sys
sys.path.insert(0, sys.argv[1])
import torch, mih_evidence
model = torch.nn.Linear(2, 2).double()
ev = mih_evidence.Session(sys.argv[2], model, "Reference", steps=1)
ev.attach_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
ev.begin_step(0)
ev.record_batch(0, 0, 0, {"input_ids": torch.zeros(2, 3, dtype=torch.int64)})
loss = model(torch.ones(2, 2, dtype=torch.float64)).pow(2).mean()
loss.backward()
ev.after_backward_before_clip(0)
ev.after_clip(0, 1.0)
ev.after_optimizer(0)
ev.end_step(0, loss=float(loss), lr=0.1)
ev.finish()
"""


def have_python():
    if not os.access(DEBIAN_PYTHON, os.X_OK) or subprocess.run([DEBIAN_PYTHON, "-c", "import torch"]).returncode:
        print(f"skip: 1, 2: {DEBIAN_PYTHON} with torch (python3-torch) is not installed")
        return False
    return True


def nested_writer(case):
    """The writer's whole run into `case`, under a timeout: (exit or 'hung', output)."""
    python_dir = os.path.join(HERE, "..", "..", "python")
    try:
        r = subprocess.run([DEBIAN_PYTHON, "-c", NESTED, python_dir, case], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=60)
        return r.returncode, r.stdout
    except subprocess.TimeoutExpired as e:
        return "hung", (e.stdout or b"").decode(errors="replace")


def python_nested_links(work, user):
    sticky = root_dir(work, "py_nested", 0o1777)
    private = root_dir(work, "py_nested_secret", 0o700)
    plant(user, private, os.path.join(sticky, "check"))
    code, out = nested_writer(sticky)
    check(code not in (0, "hung") and f"{sticky}/check" in out and "symbolic link" in out,
          f"1: a link planted at check/ in a sticky case directory is refused, naming it (exit {code})", out)
    check(os.listdir(private) == [], f"1: nothing written where the link points: {os.listdir(private)}")


def python_fifo(work, user):
    case = root_dir(work, "py_fifo", 0o1777)
    theirs = os.path.join(case, "cases", "runtime")
    subprocess.run(["runuser", "-u", user, "--", "mkdir", "-p", "-m", "0777", theirs], check=True)
    subprocess.run(["runuser", "-u", user, "--", "mkfifo", os.path.join(theirs, "metrics.jsonl")], check=True)
    code, out = nested_writer(case)
    mine = [n for n in os.listdir(theirs) if os.stat(os.path.join(theirs, n)).st_uid == 0]
    check(code not in (0, "hung") and f"{case}/cases belongs to uid" in out,  # the first of theirs
          f"2: a cases/runtime/ of another user's is refused, naming it, never a hang (exit {code})", out)
    check(mine == [], f"2: nothing of root's written in the other user's directory: {mine}")
    for what in ("fifo", "hardlink"):
        case = root_dir(work, "py_planted_" + what, 0o755)
        runtime = os.path.join(case, "cases", "runtime")
        os.makedirs(runtime)
        os.chmod(runtime, 0o1777)
        metrics = os.path.join(runtime, "metrics.jsonl")
        if what == "fifo":
            subprocess.run(["runuser", "-u", user, "--", "mkfifo", metrics], check=True)
        else:  # what a user could plant where fs.protected_hardlinks is 0
            os.link(secret(work, "py_hardlink_secret"), metrics)
        code, out = nested_writer(case)
        want = "it is a FIFO, not a regular file" if what == "fifo" else "it has 2 hard links"
        check(code not in (0, "hung") and metrics in out and want in out,
              f"2: a {what} planted at metrics.jsonl is refused naming it ('{want}'), never a hang (exit {code})", out)
    check(untouched(os.path.join(work, "py_hardlink_secret", "secret")), "2: the hard-linked root-only file untouched")


def sweep_keeps_theirs(mih, work, user):
    root = root_dir(work, "sweep_root", 0o1777)
    dead = "999999"  # above the default pid_max (2^22 is 4194304 at most: 4000000 may be alive)
    theirs = [os.path.join(root, "bob", "thesis.tmp." + dead), os.path.join(root, "notes.tmp.4000000")]
    subprocess.run(["runuser", "-u", user, "--", "mkdir", os.path.join(root, "bob")], check=True)
    for path in theirs:
        subprocess.run(["runuser", "-u", user, "--", "sh", "-c", 'echo theirs > "$1"', "sh", path], check=True)
    mine = os.path.join(root, "results.jsonl.tmp.999999999")
    with open(mine, "w") as f:
        f.write("mine\n")
    r = mih_test(mih, root)
    lost = [os.path.relpath(p, root) for p in theirs if not os.path.exists(p)]
    check(r.returncode == 0 and not lost and not os.path.exists(mine),
          f"3: the sweep keeps another user's files (removed {lost}) and removes mih's own stale temp "
          f"(left: {os.path.exists(mine)}; exit {r.returncode})", r.stdout)


def main():
    mih, work = mih_and_work()
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        print("skip: needs root, useradd and runuser to make a second user that plants")
        return 77
    os.chmod(work, 0o755)
    user = f"mihplantw{os.getpid()}"
    subprocess.run(["useradd", "-M", "-r", "-s", "/usr/sbin/nologin", user], check=True)
    try:
        if have_python():
            python_nested_links(work, user)
            python_fifo(work, user)
        sweep_keeps_theirs(mih, work, user)
    finally:
        subprocess.run(["userdel", user])
    return TALLY.summary("PlantedLinksWriters")


if __name__ == "__main__":
    sys.exit(main())
