"""What the Python test drivers share (tests/python, tests/own_trainer, tests/slurm, tests/cli):
a free TCP port on the loopback, the tally of checks a driver prints as it goes, and an evidence
file edited in place (a broken copy a check must refuse or fail)."""
import argparse
import json
import os
import shutil
import socket
import subprocess


def mih_and_work():
    """The driver's `--mih BIN --work DIR` as absolute paths, DIR emptied and created."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    return os.path.abspath(a.mih), work


def edit_json(path, change):
    """Rewrites the JSON file `path` with change(value) applied to its parsed value in place."""
    with open(path) as f:
        value = json.load(f)
    change(value)
    with open(path, "w") as f:
        json.dump(value, f)


def processes():
    """(pid, argv) of every process /proc shows now (argv empty for a kernel thread)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        yield int(entry), [a for a in argv if a]


def free_port():
    """A TCP port free on 127.0.0.1 now (for MASTER_PORT, a daemon's port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Tally:
    """The checks of a driver: `ok` and `fail` print one line each as they happen."""

    def __init__(self):
        self.passed, self.failed = [], []

    def ok(self, msg):
        self.passed.append(msg)
        print("ok: " + msg, flush=True)

    def fail(self, msg):
        self.failed.append(msg)
        print("FAIL: " + msg, flush=True)

    def summary(self, label):
        """Prints the tally's last line; returns the exit status (1 when a check failed)."""
        if self.failed:
            print(f"{label}: {len(self.failed)} check(s) failed, {len(self.passed)} passed", flush=True)
            return 1
        print(f"{label}: {len(self.passed)} checks passed", flush=True)
        return 0

    def expect(self, what, cmd, code, needles=(), absent=(), timeout=300):
        """Runs `cmd`: it must exit `code` and its output (stdout and stderr) say every needle and
        none of `absent`. Returns the output, or None when a check failed (said already)."""
        rc, out = run(cmd, timeout)
        if rc != code:
            self.fail(f"{what}: exit {rc}, want {code}\n{out[-4000:]}")
            return None
        for n in needles:
            if n not in out:
                self.fail(f"{what}: the output does not say {n!r}\n{out[-4000:]}")
                return None
        for n in absent:
            if n in out:
                self.fail(f"{what}: the output says {n!r}\n{out[-4000:]}")
                return None
        self.ok(f"{what}: exit {code}" + (f", saying {', '.join(repr(n) for n in needles)}" if needles else ""))
        return out


def run(cmd, timeout=300):
    """(exit status, stdout and stderr) of `cmd`; -1 and what it printed when it ran past `timeout` s."""
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return -1, f"timed out after {timeout} s\n{out}"
    return p.returncode, p.stdout
