#!/usr/bin/env python3
"""Two hosts on one machine (ctest TwoHosts, label launchers): what the nightly multi-node run
does, with each rank on a host of its own.

The test makes two network namespaces joined by a veth pair, with the addresses of the
project's two test hosts (TEST_HOSTS: 192.0.2.10 and 192.0.2.11, from TEST-NET-1, RFC 5737,
which no real network routes), and removes them afterwards. Rank 0 runs in the first, rank 1
in the second, with the variables of an env:// launch (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR/MASTER_PORT: the store on the first host's address, hosted by
rank 0), Gloo bound to each host's veth (GLOO_SOCKET_IFNAME) and a run directory of each
rank's own, and each in a UTS namespace with a host name of its own. A rank that assumed loopback (127.0.0.1 is another host's loopback here) or read
a path it did not declare (the other rank's run directory) fails.

  1. selftest on dp_shard=2 passes on both hosts
  2. one conformance case (llama/DpShard2, the rank command `mih run --prepare` prints), then
     `mih test --verify-only` on its evidence passes; environment.json names both hosts' ranks
     and the launch ("env": RANK and WORLD_SIZE set by hand)

Needs root (network namespaces) and ip(8) (iproute2): otherwise a skip with the reason (exit
77), never a pass. Exit status: 0 every check held; 1 otherwise; 77 skipped."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check, prepared_command, run  # noqa: E402

TEST_HOSTS = ("192.0.2.10", "192.0.2.11")
PREFIX = "mihtest"


def ip(*args, check_rc=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check_rc and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def remove_stale():
    """Namespaces an earlier run of this test left behind (its process is gone)."""
    for line in ip("netns", "list", check_rc=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX + "-"):
            pid = name.split("-")[-1]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                ip("netns", "del", name, check_rc=False)


class Hosts:
    """Two namespaces joined by a veth pair; host i has TEST_HOSTS[i] on interface ifname[i]."""

    def __init__(self):
        pid = os.getpid()
        self.ns = [f"{PREFIX}-h{i}-{pid}" for i in range(2)]
        self.ifname = [f"mihv{i}-{pid % 100000}" for i in range(2)]

    def __enter__(self):
        remove_stale()
        try:
            for ns in self.ns:
                ip("netns", "add", ns)
            ip("link", "add", self.ifname[0], "type", "veth", "peer", "name", self.ifname[1])
            for i in range(2):
                ip("link", "set", self.ifname[i], "netns", self.ns[i])
                ip("-n", self.ns[i], "addr", "add", f"{TEST_HOSTS[i]}/24", "dev", self.ifname[i])
                ip("-n", self.ns[i], "link", "set", self.ifname[i], "up")
                ip("-n", self.ns[i], "link", "set", "lo", "up")
        except Exception:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for ns in self.ns:
            ip("netns", "del", ns, check_rc=False)  # takes its end of the veth pair along
        ip("link", "del", self.ifname[0], check_rc=False)

    def start(self, rank, argv, log):
        """Starts rank `rank` of 2 on host `rank` with an env:// launch's variables."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("MIH_", "SLURM_", "OMPI_", "TORCHELASTIC_", "GLOO_"))
               and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        env.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR=TEST_HOSTS[0], MASTER_PORT="29517", GLOO_SOCKET_IFNAME=self.ifname[rank])
        # Its own UTS namespace too: each host has its own name (mih-host0, mih-host1).
        wrap = ["ip", "netns", "exec", self.ns[rank], "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                f"mih-host{rank}"]
        return subprocess.Popen(wrap + argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)


def run_both(hosts, argvs, logdir, what, timeout=120):
    os.makedirs(logdir, exist_ok=True)
    logs = [os.path.join(logdir, f"host{r}.log") for r in range(2)]
    procs = [hosts.start(r, argvs[r], logs[r]) for r in range(2)]
    deadline = time.time() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            p.wait()
    text = "".join(f"--- host {r} (exit {procs[r].returncode}) ---\n" + open(logs[r]).read()[-2500:]
                   for r in range(2))
    ok = all(p.returncode == 0 for p in procs)
    check(ok, f"{what}: both hosts' ranks exit 0 ({[p.returncode for p in procs]})", text)
    return ok, text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIP: two hosts need network namespaces, which need root (run scripts/test as root)")
        return 77
    if shutil.which("ip") is None:
        print("SKIP: ip(8) is not installed (Debian package iproute2; scripts/test installs it)")
        return 77
    probe = ip("netns", "add", f"{PREFIX}-probe-{os.getpid()}", check_rc=False)
    ip("netns", "del", f"{PREFIX}-probe-{os.getpid()}", check_rc=False)
    if probe.returncode != 0:
        print(f"SKIP: this machine does not let root make network namespaces: {probe.stderr.strip()}")
        return 77
    mih = os.path.abspath(a.mih)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    t0 = time.time()
    with Hosts() as hosts:
        # 1. selftest; each rank its own run directory.
        argvs = [[mih, "worker", "--run-dir", os.path.join(a.work, f"selftest_host{r}"), "selftest", "--mesh",
                  "dp_shard=2"] for r in range(2)]
        ok, text = run_both(hosts, argvs, os.path.join(a.work, "logs_selftest"), "selftest on dp_shard=2")
        check(ok and "all checks passed" in text, "selftest across the two hosts passes every check", text)

        # 2. one conformance case: the reference here, the 2-rank case across the hosts.
        root = os.path.join(a.work, "evidence")
        r = run(mih, ["run", "--spec", "llama", "--case", "Reference", "--evidence-root", root])
        check(r.returncode == 0, f"the reference runs (exit {r.returncode})", r.stdout[-2000:])
        argv = prepared_command(mih, root, "DpShard2")
        if argv is None:
            return 1
        # Rank 1's run directory is its own: the case's evidence directory is the one shared path.
        run_dir = argv.index("--run-dir") + 1
        argvs = [argv, argv[:run_dir] + [os.path.join(a.work, "host1_run")] + argv[run_dir + 1:]]
        run_both(hosts, argvs, os.path.join(a.work, "logs_case"), "llama/DpShard2 across the two hosts")
    v = run(mih, ["test", "--verify-only", "--evidence-root", root, "--gtest_brief=1", "--no-progress",
                  "--gtest_filter=Llama/*.*/Reference:Llama/*.*/DpShard2"])
    ran = [l for l in v.stdout.splitlines() if "tests from" in l and "ran" in l]
    check(v.returncode == 0 and ran, f"verify-only passes on the two hosts' evidence (exit {v.returncode}; "
          f"{ran[-1] if ran else 'no tests ran'})", v.stdout[-3000:])
    try:
        env = json.load(open(os.path.join(root, "llama", "DpShard2", "environment.json")))
    except (OSError, ValueError):
        env = {}
    ranks = env.get("ranks", [])
    check([x.get("host") for x in ranks] == ["mih-host0", "mih-host1"] and env.get("launcher") == "env",
          f"environment.json records both ranks' hosts ({[x.get('host') for x in ranks]}) and an env:// launch "
          f"({env.get('launcher')})", json.dumps(env)[:1500])
    print(f"{'all checks held' if not FAILURES else str(len(FAILURES)) + ' check(s) failed'} in {time.time() - t0:.0f} s")
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
