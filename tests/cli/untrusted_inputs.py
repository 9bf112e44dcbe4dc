#!/usr/bin/env python3
"""Crafted checkpoints and matrices get their documented exit code quickly (ctest
UntrustedInputs, label runtime): black-box runs of the real `mih` binary, each within 10 s.

1. Depth: JSON nested 100000 levels in config.json, in a safetensors header, in the index,
   in a matrix file's `steps` or a case field, in evidence `mih check` and `mih report` read:
   exit 11 (12 for evidence) naming the file and the nesting, never a crash (SIGSEGV).
2. Time: a FIFO as model.safetensors, as a shard the index names or as config.json is bad
   input (11) naming the FIFO, never a hang; a header of 1,000,000 empty tensors (66 MB) is
   refused at the documented bound (11), and one that fills the bound (65,536 tensors, the
   weights and empty ones beside them) is read whole (exit 1: the unexpected keys, the first
   50 printed), each within 10 s.
3. Containment: a shard, model.safetensors or config.json that is a symlink out of the
   directory is refused (11) naming where it leads, by `mih inspect` and by `mih run
   --init-from` before any rank starts; a file that is no safetensors file is refused without
   quoting its bytes (not even its first 8 as the length); a snapshot of the Hugging Face
   cache (files linked into ../../blobs) still reads clean.

Exit status: 0 every check held; 1 otherwise; 2 usage."""
import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check  # noqa: E402

DEEP = 100000
LIMIT_S = 10.0


def run(mih, *args, cwd=None):
    """(exit status, output, seconds); exit status None when it ran past LIMIT_S (killed)."""
    start = time.monotonic()
    p = subprocess.Popen([mih, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=LIMIT_S + 5)
        return p.returncode, out.decode("utf-8", "replace"), time.monotonic() - start
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the front: its warm server then stops the command
        out, _ = p.communicate()
        return None, out.decode("utf-8", "replace"), time.monotonic() - start


def expect(result, code, substrings, what, absent=()):
    rc, out, seconds = result
    ok = rc == code and seconds < LIMIT_S and all(s in out for s in substrings) and not any(s in out for s in absent)
    rc_text = "hung (killed)" if rc is None else ("SIGSEGV" if rc in (-11, 139) else str(rc))
    check(ok, "%s: exit %s in %.1f s (want %d within %.0f s)" % (what, rc_text, seconds, code, LIMIT_S),
          out[-1500:])


def deep_array(depth):
    return "[" * depth + "]" * depth


def write_header(path, header_text, data=b""):
    raw = header_text.encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), f.read()


def copy_ckpt(src, dst):
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, symlinks=True)
    return dst


def shard(src, dst):
    """`src` (a single-file export) as two shards and an index."""
    copy_ckpt(src, dst)
    header, data = read_safetensors(os.path.join(dst, "model.safetensors"))
    os.remove(os.path.join(dst, "model.safetensors"))
    keys = sorted(k for k in header if k != "__metadata__")
    weight_map = {}
    for i, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2:])):
        name = "model-%05d-of-00002.safetensors" % (i + 1)
        out, blob = {}, b""
        for k in part:
            b, e = header[k]["data_offsets"]
            out[k] = dict(header[k], data_offsets=[len(blob), len(blob) + e - b])
            blob += data[b:e]
            weight_map[k] = name
        write_header(os.path.join(dst, name), json.dumps(out), blob)
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": len(data)}, "weight_map": weight_map}, f)
    return dst


def inspect(a, ckpt, tag):
    return run(a.mih, "inspect", "--spec", "llama", "--hf-dir", ckpt, "--out", os.path.join(a.work, "ev", tag))


def depth(a, clean, sharded):
    deep = deep_array(DEEP)
    d = copy_ckpt(clean, os.path.join(a.work, "deep-config"))
    cfg = json.load(open(os.path.join(d, "config.json")))
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write(json.dumps(cfg)[:-1] + ', "deep": ' + deep + "}")
    expect(inspect(a, d, "deep-config"), 11, ["config.json", "nested deeper than 128 levels"],
           "1a inspect: config.json nested 100000 levels")
    expect(run(a.mih, "run", "--spec", "llama", "--case", "Reference", "--init-from", d,
               "--evidence-root", os.path.join(a.work, "deep-run")),
           11, ["config.json", "nested deeper than 128 levels"], "1b run --init-from: config.json nested 100000 levels")

    for label, where in (("metadata value", '{"__metadata__": {"format": %s}}'),
                         ("shape", '{"w": {"dtype": "F32", "shape": %s, "data_offsets": [0, 0]}}'),
                         ("tensor entry", '{"w": %s}')):
        d = copy_ckpt(clean, os.path.join(a.work, "deep-header"))
        write_header(os.path.join(d, "model.safetensors"), where % deep)
        expect(inspect(a, d, "deep-header"), 11, ["model.safetensors", "invalid safetensors file"],
               "1c inspect: a safetensors header whose %s is nested 100000 levels" % label)

    d = copy_ckpt(sharded, os.path.join(a.work, "deep-index"))
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps(index)[:-1] + ', "deep": ' + deep + "}")
    expect(inspect(a, d, "deep-index"), 11, ["model.safetensors.index.json", "nested deeper than 128 levels"],
           "1d inspect: model.safetensors.index.json nested 100000 levels")

    for label, matrix in (("steps", '{"name": "deep", "steps": %s, "cases": [{"tp": 2}]}' % deep),
                          ("a case field", '{"name": "deep", "cases": [{"tp": %s}]}' % deep)):
        path = os.path.join(a.work, "deep-matrix.json")
        with open(path, "w") as f:
            f.write(matrix)
        expect(run(a.mih, "matrix", "--spec", "llama", "--matrix", path), 11,
               ["deep-matrix.json", "nested deeper than 128 levels"], "1e mih matrix: %s nested 100000 levels" % label)
        expect(run(a.mih, "test", "--only-spec", "llama", "--matrix", path, "--evidence-root",
                   os.path.join(a.work, "deep-test")),
               11, ["deep-matrix.json", "nested deeper than 128 levels"],
               "1f mih test --matrix: %s nested 100000 levels" % label)

    # Evidence: a real case's record, and a results line, nested that deep.
    root = os.path.join(a.work, "deep-evidence")
    p = subprocess.run([a.mih, "run", "--spec", "llama", "--case", "Reference", "--evidence-root", root],
                       capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, "1g mih run --case Reference (the evidence to tamper with)", p.stdout + p.stderr)
    record = os.path.join(root, "llama", "Reference", "case_run.json")
    text = open(record).read().rstrip()
    with open(record, "w") as f:
        f.write(text[:-1] + ', "deep": ' + deep + "}\n")
    expect(run(a.mih, "check", os.path.join(root, "llama", "Reference")), 12,
           ["case_run.json", "nested deeper than 128 levels"], "1g mih check: case_run.json nested 100000 levels")
    root = os.path.join(a.work, "deep-report")
    os.makedirs(root)
    with open(os.path.join(root, "results.jsonl"), "w") as f:
        f.write('{"name": "Llama/Structure.X/Reference", "status": "passed", "deep": %s}\n' % deep)
    rc, out, seconds = run(a.mih, "report", root)
    check(rc is not None and rc not in (0, 1, -11, 139) and seconds < LIMIT_S and "nested deeper than 128" in out,
          "1h mih report: a results.jsonl line nested 100000 levels is bad evidence (exit %s in %.1f s)" % (rc, seconds),
          out[-1500:])


def timing(a, clean, sharded):
    d = copy_ckpt(clean, os.path.join(a.work, "fifo-model"))
    os.remove(os.path.join(d, "model.safetensors"))
    os.mkfifo(os.path.join(d, "model.safetensors"))
    expect(inspect(a, d, "fifo-model"), 11, ["model.safetensors", "FIFO"], "2a inspect: model.safetensors is a FIFO")
    expect(run(a.mih, "run", "--spec", "llama", "--case", "Reference", "--init-from", d,
               "--evidence-root", os.path.join(a.work, "fifo-run")),
           11, ["model.safetensors", "FIFO"], "2b run --init-from: model.safetensors is a FIFO")
    d = copy_ckpt(sharded, os.path.join(a.work, "fifo-shard"))
    os.remove(os.path.join(d, "model-00002-of-00002.safetensors"))
    os.mkfifo(os.path.join(d, "model-00002-of-00002.safetensors"))
    expect(inspect(a, d, "fifo-shard"), 11, ["model-00002-of-00002.safetensors", "FIFO"],
           "2c inspect: a shard the index names is a FIFO")
    d = copy_ckpt(clean, os.path.join(a.work, "fifo-config"))
    os.remove(os.path.join(d, "config.json"))
    os.mkfifo(os.path.join(d, "config.json"))
    expect(inspect(a, d, "fifo-config"), 11, ["config.json", "FIFO"], "2d inspect: config.json is a FIFO")

    # A million empty tensors (66 MB of header): refused at the documented bound.
    d = copy_ckpt(clean, os.path.join(a.work, "million"))
    entry = '"t%07d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}'
    header = "{" + ",".join(entry % i for i in range(1000000)) + "}"
    write_header(os.path.join(d, "model.safetensors"), header)
    expect(inspect(a, d, "million"), 11, ["more than 65536 tensors"],
           "2e inspect: a header of 1,000,000 empty tensors (%d MB)" % (len(header) >> 20))
    # Empty tensors beside the real weights up to the bound (65,536 in all): read whole, the
    # terminal given the first 50 differences, in linear time (the base took minutes).
    d = copy_ckpt(clean, os.path.join(a.work, "many"))
    weights, data = read_safetensors(os.path.join(d, "model.safetensors"))
    end, n = len(data), 65536 - len([k for k in weights if k != "__metadata__"])
    extra = ",".join('"extra.%06d":{"dtype":"F32","shape":[0],"data_offsets":[%d,%d]}' % (i, end, end)
                     for i in range(n))
    write_header(os.path.join(d, "model.safetensors"), json.dumps(weights)[:-1] + "," + extra + "}", data)
    expect(inspect(a, d, "many"), 1, ["65536 in the checkpoint", "extra.000049", "and %d more differences" % (n - 50)],
           "2f inspect: %d empty tensors beside the weights (65,536 in all) are read whole" % n,
           absent=["extra.000050 "])


def containment(a, clean, sharded):
    outside = os.path.join(a.work, "outside")
    os.makedirs(outside, exist_ok=True)
    d = copy_ckpt(clean, os.path.join(a.work, "link-model"))
    shutil.move(os.path.join(d, "model.safetensors"), os.path.join(outside, "weights.safetensors"))
    os.symlink(os.path.join(outside, "weights.safetensors"), os.path.join(d, "model.safetensors"))
    expect(inspect(a, d, "link-model"), 11, ["model.safetensors", "outside the checkpoint directory"],
           "3a inspect: model.safetensors is a symlink out of the directory")
    runs = os.path.join(a.work, "link-run")
    expect(run(a.mih, "run", "--spec", "llama", "--case", "Reference", "--init-from", d, "--evidence-root", runs),
           11, ["outside the checkpoint directory"], "3b run --init-from: model.safetensors is a symlink out of it")
    check(not os.path.exists(os.path.join(runs, "llama")), "3b no case started from the checkpoint it refused")

    d = copy_ckpt(sharded, os.path.join(a.work, "link-shard"))
    name = "model-00001-of-00002.safetensors"
    shutil.move(os.path.join(d, name), os.path.join(outside, name))
    os.symlink(os.path.join("..", "outside", name), os.path.join(d, name))  # relative, through '..'
    expect(inspect(a, d, "link-shard"), 11, [name, "outside the checkpoint directory"],
           "3c inspect: a shard the index names is a relative symlink out of the directory")
    d = copy_ckpt(clean, os.path.join(a.work, "link-config"))
    shutil.move(os.path.join(d, "config.json"), os.path.join(outside, "config.json"))
    os.symlink(os.path.join(outside, "config.json"), os.path.join(d, "config.json"))
    expect(inspect(a, d, "link-config"), 11, ["config.json", "outside the checkpoint directory"],
           "3d inspect: config.json is a symlink out of the directory")

    # A secret beside the checkpoint, linked in: refused before it is read; and the same bytes as
    # model.safetensors itself: refused without quoting them (not even the first 8 as the length).
    secret = b"root:$6$Zq9sEcReT$hashhashhash:19000:0:99999:7:::\n"
    as_length = str(struct.unpack("<Q", secret[:8])[0])
    with open(os.path.join(outside, "shadow"), "wb") as f:
        f.write(secret)
    d = copy_ckpt(clean, os.path.join(a.work, "link-secret"))
    os.remove(os.path.join(d, "model.safetensors"))
    os.symlink(os.path.join(outside, "shadow"), os.path.join(d, "model.safetensors"))
    expect(inspect(a, d, "link-secret"), 11, ["outside the checkpoint directory"],
           "3e inspect: model.safetensors is a symlink to a secret file", absent=[as_length, "Zq9sEcReT", "root:"])
    d = copy_ckpt(clean, os.path.join(a.work, "secret-inside"))
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(secret)
    expect(inspect(a, d, "secret-inside"), 11, ["model.safetensors", "not a safetensors file"],
           "3f inspect: model.safetensors holds no safetensors bytes: refused quoting none",
           absent=[as_length, "Zq9sEcReT", "root:"])
    # The same bytes with a small length: a header that is not JSON, quoted neither.
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", 16) + secret)
    expect(inspect(a, d, "secret-inside2"), 11, ["model.safetensors", "not valid JSON"],
           "3g inspect: a header that is not JSON is refused quoting none of it", absent=["Zq9sEcReT", "'root", "ro'"])

    # The Hugging Face cache's layout: snapshots/<revision>/* linked into ../../blobs.
    repo = os.path.join(a.work, "hub", "models--mih--llama")
    snap = os.path.join(repo, "snapshots", "0123abcd")
    os.makedirs(os.path.join(repo, "blobs"))
    os.makedirs(snap)
    for name in ("config.json", "model.safetensors"):
        blob = os.path.join(repo, "blobs", name + ".blob")
        shutil.copy(os.path.join(clean, name), blob)
        os.symlink(os.path.join("..", "..", "blobs", name + ".blob"), os.path.join(snap, name))
    expect(inspect(a, snap, "hub"), 0, ["0 differences"], "3h inspect: a Hugging Face cache snapshot still reads clean")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    clean = os.path.join(a.work, "llama-hf")
    p = subprocess.run([a.mih, "export", "--spec", "llama", "--out", clean], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        print("FAIL  export --spec llama (the checkpoint every crafted input starts from)\n" + p.stdout + p.stderr)
        return 1
    sharded = shard(clean, os.path.join(a.work, "llama-sharded"))
    expect(inspect(a, clean, "clean"), 0, ["0 differences"], "0a the export inspects clean")
    expect(inspect(a, sharded, "sharded"), 0, ["0 differences"], "0b its two-shard copy inspects clean")
    depth(a, clean, sharded)
    timing(a, clean, sharded)
    containment(a, clean, sharded)
    print("%d failure(s)" % len(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
