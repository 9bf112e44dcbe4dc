#!/usr/bin/env python3
"""The warm server serves who the kernel says asks, not who the request says (ctest
WarmIdentity, label runtime): a root caller with every capability dropped and no_new_privs set
must not get a command run with the capabilities of a root server.

  1. a plain front gets a warm start (the server it started serves its next command)
  2. control: a client that speaks the front's protocol, sending the identity a full-capability
     front sends (captured from a real front by standing in for the server's socket), is
     served, and its command (`mih launch --launcher` running a shell) has every capability, as
     it would have exec'd by such a caller
  3. attack: the same client, the same bytes (what the server's own /proc/<pid>/status says;
     the issue's attacker forged them from it), run under setpriv with every capability dropped
     and no_new_privs: its command never runs with a capability (the server refuses it, naming
     the capability sets)
  4. a real front with no capabilities gets its command run without any; sent to the
     full-capability server (its socket swapped for a link to that server's), it is refused,
     says so naming what differs, and runs the command exec'd, without capabilities

Needs root and setpriv(1) (util-linux): otherwise a skip with the reason (exit 77), never a pass.
Exit status: 0 every check held; 1 otherwise; 77 skipped.

`--client SOCKET CLAIM OUT -- ARGV...` is the client of 2 and 3 (the front's wire format,
harness/warm/warm_internal.h): it writes what the server answered to OUT as JSON."""
import argparse
import array
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check, wait_for  # noqa: E402

MAGIC, VERSION = 0x7768696D, 2
KIND_RUN, KIND_FDS = 1, 4
STARTED, DIFFERS, EXITED, READY = 1, 2, 3, 5
WHY_IDENTITY, WHY_BAD_REQUEST = 1, 4
HEADER = struct.Struct("<IIIIQ")  # magic, version, kind, fd_bits, payload_bytes
REPLY = struct.Struct("<IIq")  # kind, text_bytes, value
DROP_ALL = ["--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--no-new-privs"]


def recv_exact(sock, n):
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise EOFError(f"connection closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def strings(items):
    return struct.pack("<I", len(items)) + b"".join(i + b"\0" for i in items)


def client(sock_path, claim_path, out_path, argv):
    """Asks the server at `sock_path` to run `argv`, claiming the identity in `claim_path`, as
    the front does; writes what happened to `out_path`."""
    claim = open(claim_path, "rb").read()
    env = open("/proc/self/environ", "rb").read().split(b"\0")[:-1]  # what the kernel says this process has
    mask = os.umask(0)
    os.umask(mask)
    payload = (struct.pack("<Q", len(claim)) + claim + struct.pack("<IQQ", mask, 0, 0) +
               strings([a.encode() for a in argv]) + strings(env))
    result = {}
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(60)
    try:
        s.connect(sock_path)
        s.sendall(HEADER.pack(MAGIC, VERSION, KIND_RUN, 7, len(payload)) + payload)
        kind, text_bytes, value = REPLY.unpack(recv_exact(s, REPLY.size))
        if kind == READY:
            cwd = os.open(".", os.O_PATH | os.O_DIRECTORY)
            # The front echoes the nonce of the proof kReady names (the server's fd `value`,
            # a memfd named mih-warm-proof-<nonce>), read through /proc/<server>/fd.
            server_pid = struct.unpack("<iII", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
            link = os.readlink(f"/proc/{server_pid}/fd/{value}")
            echo = struct.pack("<Q", int(link.split("mih-warm-proof-")[1][:16], 16))
            s.sendmsg([HEADER.pack(MAGIC, VERSION, KIND_FDS, 7, len(echo)) + echo],
                       [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2, cwd]))])
            kind, text_bytes, value = REPLY.unpack(recv_exact(s, REPLY.size))
        if kind == STARTED:
            s.sendall(b"g")
            s.settimeout(None)
            kind, _, status = REPLY.unpack(recv_exact(s, REPLY.size))
            result = {"outcome": "ran", "status": status}
        elif kind == DIFFERS:
            text = recv_exact(s, text_bytes).decode(errors="replace") if text_bytes else ""
            result = {"outcome": "refused", "why": value, "text": text}
        else:
            result = {"outcome": f"unexpected reply {kind}"}
    except (OSError, EOFError) as e:
        result = {"outcome": "connection failed", "error": str(e)}
    json.dump(result, open(out_path, "w"))
    return 0


def servers(mih, env):
    """(socket, pid, served) of each server `mih warm status` lists."""
    r = subprocess.run([mih, "warm", "status"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return [(w[0], int(w[2]), int(w[4])) for w in (line.split() for line in r.stdout.splitlines())
            if len(w) > 5 and w[1] == "pid"]


def cap_eff(path):
    """CapEff of the shell that wrote `path` (grep ^CapEff /proc/self/status), or None."""
    try:
        return int(open(path).read().split()[1], 16)
    except (OSError, IndexError, ValueError):
        return None


def launch_args(root, run_id, out):
    """A `mih launch` whose launcher is a shell recording its own capabilities (no rank starts)."""
    return ["launch", "-n", "1", "--evidence-root", root, "--run-id", run_id, "--timeout", "20",
            "--launcher", f"grep ^CapEff /proc/self/status > {out}; exit 0 # {{cmd}}", "ping"]


def capture_claim(mih, env, sock, path):
    """The identity bytes a front of `env` sends to the server at `sock`: its socket is moved
    aside and a listener takes its place for one request (answered 'bad request': the front
    execs its command)."""
    aside = sock + ".aside"
    os.rename(sock, aside)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    claim = b""
    try:
        listener.bind(sock)
        listener.listen(1)
        listener.settimeout(30)
        front = subprocess.Popen([mih, "list"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        conn, _ = listener.accept()
        conn.settimeout(30)
        _, _, _, _, n = HEADER.unpack(recv_exact(conn, HEADER.size))
        payload = recv_exact(conn, n)
        (length,) = struct.unpack_from("<Q", payload)
        claim = payload[8:8 + length]
        conn.sendall(REPLY.pack(DIFFERS, 0, WHY_BAD_REQUEST))
        conn.close()
        front.wait(timeout=60)
    finally:
        listener.close()
        os.unlink(sock)
        os.rename(aside, sock)
    with open(path, "wb") as f:
        f.write(claim)
    return claim


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        return client(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[sys.argv.index("--") + 1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    a = ap.parse_args()
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0:
        print("SKIP: a caller that dropped root's capabilities needs root to start from (run scripts/test as root)")
        return 77
    if not setpriv:
        print("SKIP: setpriv(1) is not installed (Debian package util-linux)")
        return 77
    own = int(next(line for line in open("/proc/self/status") if line.startswith("CapEff")).split()[1], 16)
    probe = subprocess.run([setpriv] + DROP_ALL + ["grep", "^CapEff", "/proc/self/status"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    if own == 0 or probe.returncode != 0 or int((probe.stdout.split() + ["x", "1"])[1], 16) != 0:
        print(f"SKIP: this root cannot show a capability gained (its CapEff {own:x}; setpriv dropping all: "
              f"{probe.stdout.strip()!r})")
        return 77
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    warm_dir = os.path.join(a.work, "warm")
    os.makedirs(warm_dir, mode=0o700)
    root = os.path.join(a.work, "runs")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIH_")}
    env.update(MIH_WARM_DIR=warm_dir, MIH_WARM_IDLE="30", OPENBLAS_NUM_THREADS="1")
    core = os.path.realpath(os.path.join(os.path.dirname(os.path.realpath(a.mih)), "..", "libexec", "mih", "mih-core"))
    me = os.path.abspath(__file__)
    t0 = time.time()
    try:
        # 1. A plain front: the first command starts a server, the next is served by it.
        first = subprocess.run([a.mih, "list"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        second = subprocess.run([a.mih, "list"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        s = servers(a.mih, env)
        check(first.returncode == 0 and second.returncode == 0 and len(s) == 1 and s[0][2] == 2,
              f"1: a plain front gets a warm start (servers: {s})", first.stdout[-300:] + second.stdout[-300:])
        if len(s) != 1:
            return 1
        sock, server_pid, _ = s[0]
        claim = capture_claim(a.mih, env, sock, os.path.join(a.work, "claim"))
        status = open(f"/proc/{server_pid}/status").read()
        server_caps = [line for line in status.splitlines() if line.startswith("Cap")]
        check(claim and all(line.split()[1].encode() in claim for line in server_caps),
              "the identity a full-capability front sends holds the server's capability sets", "\n".join(server_caps))

        def run_client(name, prefix):
            out, cap = os.path.join(a.work, name + ".json"), os.path.join(a.work, name + ".cap")
            argv = [sys.executable, me, "--client", sock, os.path.join(a.work, "claim"), out, "--", core]
            r = subprocess.run(prefix + argv + launch_args(root, name, cap), env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=120)
            try:
                got = json.load(open(out))
            except (OSError, ValueError):
                got = {"outcome": "no answer", "client": r.stdout[-500:]}
            return got, cap_eff(cap)

        # 2. The control: the same client with root's capabilities is served, with them.
        got, caps = run_client("control", [])
        check(got.get("outcome") == "ran" and caps == own,
              f"2: a full-capability client sending that identity is served, its command with every capability "
              f"(CapEff {caps if caps is None else format(caps, 'x')})", json.dumps(got))
        # 3. The attack: no capability, no_new_privs, the same bytes.
        got, caps = run_client("attack", [setpriv] + DROP_ALL)
        check(caps is None or caps == 0,
              f"3: a client with every capability dropped and no_new_privs, sending the server's identity, never "
              f"gets a command run with capabilities (CapEff "
              f"{'none: nothing ran' if caps is None else format(caps, 'x')})", json.dumps(got))
        check(got.get("outcome") == "refused" and got.get("why") == WHY_IDENTITY and "CapEff" in got.get("text", "") and
              "NoNewPrivs" in got.get("text", ""),
              "3: the server refuses it, naming the capability sets and no_new_privs the kernel reports",
              json.dumps(got))
        # 4. A real front without capabilities: its own server, or exec'd; never the root one.
        dropped_cap = os.path.join(a.work, "front.cap")
        r = subprocess.run([setpriv] + DROP_ALL + [a.mih] + launch_args(root, "front", dropped_cap), env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        others = [x for x in servers(a.mih, env) if x[0] != sock]
        check(cap_eff(dropped_cap) == 0 and len(others) == 1,
              f"4: a front without capabilities runs its command without any, in a server of its own "
              f"(exit {r.returncode}; other servers: {others})", r.stdout[-500:])
        if len(others) == 1:
            own_sock = others[0][0]
            os.rename(own_sock, own_sock + ".aside")
            os.symlink(sock, own_sock)
            swapped_cap = os.path.join(a.work, "swapped.cap")
            served_before = next((x[2] for x in servers(a.mih, env) if x[0] == sock), None)
            try:
                r = subprocess.run([setpriv] + DROP_ALL + [a.mih] + launch_args(root, "swapped", swapped_cap), env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
            finally:
                os.unlink(own_sock)
                os.rename(own_sock + ".aside", own_sock)
            served_after = next((x[2] for x in servers(a.mih, env) if x[0] == sock), None)
            said = [line for line in r.stdout.splitlines() if "does not serve this process" in line]
            check(cap_eff(swapped_cap) == 0 and served_after == served_before,
                  f"4: sent to the root server, its command still runs without capabilities, not in that server "
                  f"(served {served_before} -> {served_after})", r.stdout[-500:])
            check(len(said) == 1 and f"(pid {server_pid})" in said[0] and "CapEff" in said[0],
                  "4: the refusal is said once, naming the server and what differs", r.stdout[-800:])
    finally:
        subprocess.run([a.mih, "warm", "stop"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: not servers(a.mih, env), 10)
    print(f"{len(FAILURES)} check(s) failed in {time.time() - t0:.0f} s" if FAILURES else
          f"all checks held in {time.time() - t0:.0f} s")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
