#!/usr/bin/env python3
"""The warm server serves no caller confined otherwise than itself by Landlock (ctest
WarmLandlock, label runtime; issue 53): a Landlock domain does not show in /proc, so the
server's comparison of what the kernel reports (capabilities, no_new_privs, seccomp,
namespaces, cgroup, LSM label) sees a confined caller as its equal.

Each process here sets no_new_privs (Landlock needs it of a process without CAP_SYS_ADMIN),
the servers' creators too, so that no_new_privs is no difference the server sees already.
The domain allows writing only under the allowed directories; reading anything.

  1. a server started unconfined serves its next unconfined command
  2. control: a Landlock-confined `mih export --out FORBIDDEN` run exec'd (MIH_WARM=0) is
     refused (exit 12) and writes nothing
  3. the same command through the running server is not served (its served count stays), runs
     exec'd, is refused the same way (exit 12), writes nothing, and the front says why
  4. the confined caller still gets its command run (exec'd) where its domain allows writing
  5. one domain: a confined process that starts a server is served by it (same domain)
  6. a domain nested in the server's: not served, refused where the inner domain forbids
  7. the reverse: an unconfined caller of a server started in a domain is not served, and
     writes where the server could not (exit 0)

Skips (exit 77), with the reason, where the kernel has no Landlock.
Exit status: 0 every check held; 1 otherwise; 77 skipped.

`--in-domain DIR[:DIR...] -- ARGV...` execs ARGV in a new Landlock domain (nested in this
process's, if any) that allows writing only under the DIRs."""
import argparse
import ctypes
import os
import shutil
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check, wait_for  # noqa: E402

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446  # x86_64 and aarch64 alike
CREATE_RULESET_VERSION, RULE_PATH_BENEATH = 1, 1
PR_SET_NO_NEW_PRIVS = 38
# LANDLOCK_ACCESS_FS_*: WRITE_FILE, REMOVE_DIR, REMOVE_FILE, MAKE_CHAR ... MAKE_SYM (ABI 1),
# REFER (ABI 2), TRUNCATE (ABI 3): every right that changes the file system.
WRITE_RIGHTS = {1: (1 << 1) | sum(1 << b for b in range(4, 13)), 2: 1 << 13, 3: 1 << 14}

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def landlock_abi():
    """The kernel's Landlock ABI version; 0 when it has none (or it is off)."""
    v = libc.syscall(ctypes.c_long(SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
                     ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(0, v)


def no_new_privs():
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def restrict_self(allowed):
    """Puts this process in a new Landlock domain in which only the `allowed` directories (and
    what is below them) may be written to."""
    abi = landlock_abi()
    rights = sum(bits for version, bits in WRITE_RIGHTS.items() if version <= abi)
    attr = ctypes.create_string_buffer(struct.pack("<Q", rights))
    ruleset = libc.syscall(ctypes.c_long(SYS_CREATE_RULESET), attr, ctypes.c_size_t(8), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    for path in allowed:
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY)
        rule = ctypes.create_string_buffer(struct.pack("<Qi", rights, fd))  # packed: 12 bytes
        if libc.syscall(ctypes.c_long(SYS_ADD_RULE), ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH), rule,
                        ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
        os.close(fd)
    no_new_privs()
    if libc.syscall(ctypes.c_long(SYS_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(ruleset)


def servers(mih, env):
    """(socket, pid, served) of each server `mih warm status` lists."""
    r = subprocess.run([mih, "warm", "status"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return [(w[0], int(w[2]), int(w[4])) for w in (line.split() for line in r.stdout.splitlines())
            if len(w) > 5 and w[1] == "pid"]


def served(mih, env):
    s = servers(mih, env)
    return s[0][2] if len(s) == 1 else None


def run(argv, env, domain=None):
    """Runs `argv` with no_new_privs set, in a new Landlock domain allowing writes under the
    `domain` directories when given; (exit status, output)."""
    if domain is not None:
        argv = [sys.executable, os.path.abspath(__file__), "--in-domain", ":".join(domain), "--"] + argv
    r = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                       preexec_fn=no_new_privs)
    return r.returncode, r.stdout


def export(mih, out):
    return [mih, "export", "--spec", "llama", "--out", out]


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--in-domain":
        restrict_self(sys.argv[2].split(":"))
        argv = sys.argv[sys.argv.index("--") + 1:]
        # The environment as exec gave it, in its order (Python added LC_CTYPE to os.environ):
        # the server is keyed by it.
        env = dict(e.split(b"=", 1) for e in open("/proc/self/environ", "rb").read().split(b"\0") if b"=" in e)
        os.execvpe(argv[0], argv, env)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    a = ap.parse_args()
    abi = landlock_abi()
    if abi < 1:
        print(f"SKIP: this kernel has no Landlock (landlock_create_ruleset: {os.strerror(ctypes.get_errno())})")
        return 77
    shutil.rmtree(a.work, ignore_errors=True)
    allowed, forbidden = os.path.join(a.work, "allowed"), os.path.join(a.work, "forbidden")
    warm_a, warm_b = os.path.join(a.work, "warm-a"), os.path.join(a.work, "warm-b")
    for d in (allowed, forbidden):
        os.makedirs(d)
    for d in (warm_a, warm_b):
        os.makedirs(d, mode=0o700)
    base = {k: v for k, v in os.environ.items() if not k.startswith("MIH_")}
    base.update(MIH_WARM_IDLE="60", OPENBLAS_NUM_THREADS="1")
    env_a, env_b = dict(base, MIH_WARM_DIR=warm_a), dict(base, MIH_WARM_DIR=warm_b)
    domain = [allowed, "/dev"]
    t0 = time.time()
    print(f"Landlock ABI {abi}")
    try:
        # 1. An unconfined server, serving.
        rc1, out1 = run([a.mih, "list"], env_a)
        rc2, out2 = run([a.mih, "list"], env_a)
        check(rc1 == 0 and rc2 == 0 and served(a.mih, env_a) == 2,
              f"1: a server started unconfined serves its next command (servers: {servers(a.mih, env_a)})",
              out1[-300:] + out2[-300:])
        # 2. The control: the confined command exec'd is refused.
        direct = os.path.join(forbidden, "direct")
        rc, out = run(export(a.mih, direct), dict(env_a, MIH_WARM="0"), domain)
        check(rc == 12 and not os.path.exists(direct),
              f"2: a confined `mih export --out FORBIDDEN` exec'd is refused (exit {rc}, wrote "
              f"{os.path.exists(direct)})", out[-800:])
        # 3. Through the running server: not served, refused the same way.
        before = served(a.mih, env_a)
        warm = os.path.join(forbidden, "warm")
        rc, out = run(export(a.mih, warm), env_a, domain)
        after = served(a.mih, env_a)
        check(rc == 12 and not os.path.exists(warm),
              f"3: the same command through the unconfined server is refused too (exit {rc}, wrote "
              f"{os.listdir(warm) if os.path.exists(warm) else 'nothing'})", out[-800:])
        check(before is not None and after == before,
              f"3: the server does not serve it (served {before} -> {after})", out[-800:])
        said = [line for line in out.splitlines() if "does not serve this process" in line]
        check(len(said) == 1 and "Landlock" in said[0], "3: the front says why, once, naming Landlock", out[-800:])
        print("      " + (said + [""])[0])
        # 4. Where its domain allows writing, the confined command runs (exec'd).
        ok = os.path.join(allowed, "export")
        rc, out = run(export(a.mih, ok), env_a, domain)
        check(rc == 0 and os.path.exists(os.path.join(ok, "config.json")),
              f"4: the confined command writes where its domain allows (exit {rc})", out[-800:])
        # 5. One domain: a confined shell starts a server, which serves its next command.
        inner = os.path.join(allowed, "inner")
        os.makedirs(inner)
        nested = os.path.join(allowed, "nested")
        script = (f"{a.mih} list >/dev/null && {a.mih} list >/dev/null && {a.mih} warm status; "
                  f"{sys.executable} {os.path.abspath(__file__)} --in-domain {inner}:/dev -- "
                  f"{' '.join(export(a.mih, nested))}; echo nested-exit $?; {a.mih} warm status")
        rc, out = run(["sh", "-c", script], env_b, domain + [warm_b])
        statuses = [line.split() for line in out.splitlines() if " pid " in line]
        check(len(statuses) == 2 and statuses[0][4] == "2",
              f"5: a server started in a domain serves a command of that domain (status: {statuses[:1]})",
              out[-800:])
        # 6. A domain nested in the server's: not served, refused where the inner domain forbids.
        nested_exit = [line.split()[1] for line in out.splitlines() if line.startswith("nested-exit")]
        check(nested_exit == ["12"] and not os.path.exists(nested),
              f"6: a command in a domain nested in the server's is refused where that domain forbids (exit "
              f"{nested_exit}, wrote {os.path.exists(nested)})", out[-800:])
        check(len(statuses) == 2 and statuses[1][4] == statuses[0][4],
              f"6: the server does not serve it (served {[s[4] for s in statuses]})", out[-800:])
        # 7. The reverse: an unconfined caller of that (confined) server is not served by it.
        before = served(a.mih, env_b)
        outside = os.path.join(forbidden, "unconfined")
        rc, out = run(["sh", "-c", " ".join(export(a.mih, outside))], env_b)  # sh: its order of the environment
        after = served(a.mih, env_b)
        check(rc == 0 and os.path.exists(os.path.join(outside, "config.json")),
              f"7: an unconfined caller of a server in a domain writes where the server may not (exit {rc})",
              out[-800:])
        check(before is not None and after == before, f"7: the confined server does not serve it (served {before} -> "
              f"{after}; servers {servers(a.mih, env_b)})", out[-800:])
        said = [line for line in out.splitlines() if "does not serve this process" in line]
        check(len(said) == 1 and "Landlock" in said[0], "7: the front says why, once, naming Landlock", out[-800:])
    finally:
        for env in (env_a, env_b):
            subprocess.run([a.mih, "warm", "stop"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_for(lambda: not servers(a.mih, env), 10)
    print(f"{len(FAILURES)} check(s) failed in {time.time() - t0:.0f} s" if FAILURES else
          f"all checks held in {time.time() - t0:.0f} s")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
