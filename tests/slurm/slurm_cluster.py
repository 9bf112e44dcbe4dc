"""A throwaway one-node SLURM for tests: Debian's slurm-wlm (slurmctld, slurmd) and munge,
started as root in a directory of their own (configuration, state, logs, the munge key and
socket), on free ports, with the node's CPUs oversubscribed (the 4-rank cases need 4 tasks on
a 2-core machine), and stopped by the pids it started, never by name.

    with SlurmCluster(workdir, cpus=4) as cluster:       # raises Skip with the reason
        job = cluster.sbatch(script_path)                 # the job id
        cluster.wait([job], timeout=120)                  # {job: state}

The daemons read their configuration from SLURM_CONF, which cluster.env carries for every
sbatch/squeue/scontrol/srun this process runs (the machine's own /etc/slurm is not touched).
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from testkit import free_port  # noqa: E402


class Skip(Exception):
    """The cluster cannot run here; the message says why (a test reports it as a skip)."""


def _tail(path, lines=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


class SlurmCluster:
    TOOLS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/bin/sbatch", "/usr/bin/scontrol",
             "/usr/bin/squeue", "/usr/bin/sinfo", "/usr/bin/scancel", "/usr/bin/srun")

    def __init__(self, workdir, cpus=4):
        self.dir = os.path.abspath(workdir)
        self.cpus = cpus
        self.pids = {}
        self.host = socket.gethostname().split(".")[0]
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        for var in list(self.env):
            if var.startswith("SLURM_") and var != "SLURM_CONF":
                del self.env[var]

    # ---- start and stop ------------------------------------------------------------------
    def __enter__(self):
        if os.geteuid() != 0:
            raise Skip("not root: slurmctld and slurmd run as root here (SlurmUser=root)")
        missing = [t for t in self.TOOLS if not os.access(t, os.X_OK)]
        if missing:
            raise Skip("missing " + ", ".join(missing) + ": install Debian's slurm-wlm and munge (scripts/test does)")
        shutil.rmtree(self.dir, ignore_errors=True)
        for sub in ("state", "spool", "log", "munge"):
            os.makedirs(os.path.join(self.dir, sub))
        os.chmod(os.path.join(self.dir, "munge"), 0o700)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def _start(self):
        munge = os.path.join(self.dir, "munge")
        key = os.path.join(munge, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self.socket = os.path.join(munge, "munge.sock")
        pidfile = os.path.join(munge, "munged.pid")
        p = subprocess.run(["/usr/sbin/munged", "--force", "--socket=" + self.socket, "--key-file=" + key,
                            "--log-file=" + os.path.join(munge, "munged.log"), "--pid-file=" + pidfile,
                            "--seed-file=" + os.path.join(munge, "seed")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30)
        if p.returncode != 0:
            raise Skip("munged did not start: " + p.stdout.strip()[-500:])
        self.pids["munged"] = self._read_pid(pidfile)
        ctld_port, d_port = free_port(), free_port()
        d = self.dir
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=mihtest
SlurmctldHost={self.host}(127.0.0.1)
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
KillWait=5
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
PlugStackConfig=/dev/null
NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:{self.cpus}
""")
        for daemon, args in (("slurmctld", ["/usr/sbin/slurmctld", "-f", self.conf, "-c"]),
                             ("slurmd", ["/usr/sbin/slurmd", "-f", self.conf])):
            p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30,
                               env=self.env)
            if p.returncode != 0:
                raise Skip(f"{daemon} did not start ({p.returncode}): {p.stdout.strip()[-300:]}\n"
                           + _tail(os.path.join(d, "log", daemon + ".log")))
            self.pids[daemon] = self._read_pid(os.path.join(d, daemon + ".pid"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            p = subprocess.run(["/usr/bin/sinfo", "-h", "-o", "%t"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=self.env, timeout=30)
            if p.returncode == 0 and p.stdout.strip() in ("idle", "mix", "alloc"):
                return
            time.sleep(0.5)
        raise Skip("the SLURM node did not become idle in 60 s:\n" + _tail(os.path.join(d, "log", "slurmctld.log"))
                   + _tail(os.path.join(d, "log", "slurmd.log")))

    @staticmethod
    def _read_pid(path, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(path) as f:
                    return int(f.read().strip())
            except (OSError, ValueError):
                time.sleep(0.1)
        raise Skip(f"no pid file {path} after {timeout} s")

    def stop(self):
        """Stops the daemons this cluster started, by pid: SIGTERM, then SIGKILL after 10 s."""
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self.pids.pop(name, None)
            if not pid:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    # ---- jobs ----------------------------------------------------------------------------
    def run(self, args, timeout=60):
        return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env,
                              timeout=timeout)

    def sbatch(self, script, *options):
        p = self.run(["/usr/bin/sbatch", "--parsable", *options, script])
        if p.returncode != 0:
            raise RuntimeError(f"sbatch {script}: {p.stdout.strip()}")
        return p.stdout.strip().split(";")[0]

    def state(self, job):
        """The job's state (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT ...) and exit code "a:b"."""
        p = self.run(["/usr/bin/scontrol", "show", "job", "-o", job])
        fields = dict(kv.split("=", 1) for kv in p.stdout.split() if "=" in kv)
        return fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", "")

    def wait(self, jobs, timeout=180):
        """Waits until every job has ended; returns {job: (state, exit code)}."""
        deadline = time.monotonic() + timeout
        while True:
            states = {j: self.state(j) for j in jobs}
            if all(s[0] not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED") for s in states.values()):
                return states
            if time.monotonic() > deadline:
                raise TimeoutError(f"SLURM jobs not done after {timeout} s: {states}")
            time.sleep(0.5)
