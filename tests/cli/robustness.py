#!/usr/bin/env python3
"""What a hostile user of the installed `mih` found (issue 53) holds now (ctest CliRobustness,
label runtime): black-box runs of the real `mih` binary.

7. `mih golden --out DIR` never overwrites what it did not write: a DIR holding the user's own
   golden.json and golden.safetensors (or any other file) is refused (exit 12, naming
   mih_golden.json) before anything is written; a producer that exits 0 but writes nothing is
   exit 12 naming the missing files, never a success; a golden mih wrote is rewritten, an
   edited one refused.
8. `mih check` of a root writes nothing into it: on a read-only bind mount of the root (as
   root; the tree hash otherwise) it gives the true verdict (exit 0), the tree byte-identical.
9. `mih submit` (--dry-run: the batch scripts it would submit) runs nothing a value says: an
   evidence root holding a newline is refused (exit 11), one holding a space too (an #SBATCH
   line cannot quote it), a '%' in it is '%%' in #SBATCH --output; a site file's partition that
   would add sbatch options is refused, its modules, srun_args and container are quoted words.
   (A night submitted again while its jobs are queued: tests/slurm/submit_pending.py.)
5. Limits: `mih check` of a root whose results.jsonl start line nests 100000 levels is exit 12
   (never SIGSEGV); under `ulimit -f` `mih test` and `mih test --verify-only` are exit 12
   naming the file too large (never SIGXFSZ, 153); under `ulimit -v 500000` `mih` says the
   address space it needs (exit 12, never the loader's 127).
6. A matrix file of 400000 identical cases (6.8 MB) is refused within 10 s (exit 11, naming the
   bound of 4096 cases), never parsed in quadratic time (a minute; 200 MB ran an hour); a
   repeated key is still refused, naming it.

11. Smaller wrong outcomes: a run.json whose fields have the wrong types is exit 12 naming the
   field (never 17, "a mih bug"); a matrix case whose degrees multiply past 2^31 (past 2^64 in
   the spec's int64 batch split) is exit 11 naming the product, never a case of -1840700270
   ranks; a message echoing a value escapes its control characters, indents a newline's line
   and cuts a value of 30 MB to a few hundred bytes; `mih validate` of a case whose
   metrics.jsonl is a directory is INVALID (exit 12).
11a. A file "results.jsonl.tmp.<23 digits>" (and like names) in a root: `mih test` reusing it,
   `mih check` and `mih test --verify-only` give their verdict (exit 0), never 17.
11g. mih's stale-temp sweep removes only its own writers' temp names ("<file>.tmp.<pid>.<16
   hex>", an older mih's "<file>.tmp.<pid>") of a dead pid, and never under a case's extra/
   (the trainer's own): a writer's extra/notes.tmp.<dead pid> and a root's
   notes.tmp.<dead pid>.backup are kept, a dead writer's check/x.json.tmp.<pid>.<hex> removed.
11f. Two Python writers (python/mih_evidence.py) on one case directory: the second is refused,
   naming the directory and the first (its pid), and the first's evidence is whole (its two
   metrics lines, its lr), also when both passed the "holds a run" look at once.
Exit status: 0 every check held; 1 otherwise; 2 usage."""
import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from outcomes import FAILURES, check, run  # noqa: E402

LLAMA_REFERENCE = "--gtest_filter=Llama/*.*/Reference"


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def tree(root):
    """Every entry under `root`: relative path -> the SHA-256 of a file, 'dir' or 'link -> target'."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(d, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = "link -> " + os.readlink(path)
            elif os.path.isdir(path):
                out[rel] = "dir"
            else:
                out[rel] = sha256(path)
    return out


def write(path, text, mode=0o644):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


def golden_keeps_what_mih_did_not_write(mih, work):
    """7."""
    base = os.path.join(work, "golden")
    os.makedirs(base)
    # A stand-in producer (run by /bin/sh as --python): writes what mih_golden.py writes.
    producer = write(os.path.join(base, "producer.sh"),
                     'while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done\n'
                     'printf \'{"format": "stand-in"}\\n\' > "$out/golden.json"\n'
                     'printf tensors > "$out/golden.safetensors"\n')

    def golden(out, python="/bin/sh"):
        return run(mih, ["golden", "--spec", "llama", "--out", out, "--python", python, "--producer", producer])

    mine = os.path.join(base, "mine")
    os.makedirs(mine)
    write(os.path.join(mine, "golden.json"), '{"mine": true}\n')
    write(os.path.join(mine, "golden.safetensors"), "my tensors")
    before = tree(mine)
    g = golden(mine)
    check(g.returncode == 12 and "mih_golden.json" in g.stdout and tree(mine) == before,
          f"7: mih golden into a directory holding the user's own golden refuses it, writing nothing (exit "
          f"{g.returncode}; {sorted(set(tree(mine)) ^ set(before)) or 'unchanged'})", g.stdout[-1500:])

    empty = os.path.join(base, "empty")
    g = golden(empty, python="/bin/true")
    check(g.returncode == 12 and "golden.json" in g.stdout and "golden.safetensors" in g.stdout
          and not os.path.exists(os.path.join(empty, "mih_golden.json")),
          f"7: a producer that exits 0 and writes nothing is no success (exit {g.returncode})", g.stdout[-1500:])

    ours = os.path.join(base, "ours")
    first = golden(ours)
    again = golden(ours)
    check(first.returncode == 0 and again.returncode == 0 and os.path.exists(os.path.join(ours, "mih_golden.json")),
          f"7: a golden mih wrote is recorded and rewritten (exit {first.returncode}, then {again.returncode})",
          (first.stdout + again.stdout)[-1500:])
    write(os.path.join(ours, "golden.json"), '{"edited": true}\n')
    g = golden(ours)
    check(g.returncode == 12 and "edited" in g.stdout and open(os.path.join(ours, "golden.json")).read() ==
          '{"edited": true}\n', f"7: an edited golden.json is refused and kept (exit {g.returncode})", g.stdout[-1500:])


def check_on_read_only_evidence(mih, work):
    """8."""
    root = os.path.join(work, "read-only")
    t = run(mih, ["test", "--evidence-root", root, "--no-progress", "--gtest_brief=1", LLAMA_REFERENCE])
    check(t.returncode == 0, f"8: the llama Reference run passes (exit {t.returncode})", t.stdout[-1500:])
    mounted = False
    if os.geteuid() == 0:
        bind = subprocess.run(["mount", "--bind", root, root], capture_output=True, text=True)
        mounted = bind.returncode == 0 and subprocess.run(["mount", "-o", "remount,bind,ro", root]).returncode == 0
    if not mounted:
        print("note: not root (or no bind mount): mih check runs on a writable root, its tree compared")
    try:
        before = tree(root)
        c = run(mih, ["check", root, "--no-progress", "--gtest_brief=1"])
        after = tree(root)
    finally:
        if mounted:
            subprocess.run(["umount", root])
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    check(c.returncode == 0 and not changed,
          f"8: mih check of a {'read-only ' if mounted else ''}root gives its verdict and writes nothing (exit "
          f"{c.returncode}; changed: {changed[:6]})", c.stdout[-2000:])


def submit_runs_no_value(mih, work):
    """9."""
    base = os.path.join(work, "submit")
    os.makedirs(base)

    def submit(root, site=None):
        args = ["submit", "--dry-run", "--spec", "llama", "--cases", "Reference", "--evidence-root", root]
        if site is not None:
            args += ["--site", write(os.path.join(base, "site.json"), json.dumps(site))]
        return run(mih, args)

    pwned = os.path.join(base, "pwned")
    s = submit(os.path.join(base, "night") + "\ntouch " + pwned + "\n")
    check(s.returncode == 11 and "control character 0x0a" in s.stdout and "\ntouch " + pwned + "\n" not in s.stdout,
          f"9: an evidence root holding a newline is refused (exit {s.returncode})", s.stdout[-1500:])
    s = submit(os.path.join(base, "a night"))
    check(s.returncode == 11 and "#SBATCH" in s.stdout and "' '" in s.stdout,
          f"9: an evidence root holding a space is refused, naming #SBATCH (exit {s.returncode})", s.stdout[-1500:])
    s = submit(os.path.join(base, "100%night"))
    check(s.returncode == 0 and "100%%night/.mih-submit/llama/Reference.train.%j.log" in s.stdout,
          f"9: a '%' of the evidence root is '%%' in #SBATCH --output (exit {s.returncode})", s.stdout[-1500:])
    s = submit(os.path.join(base, "night"), {"partition": "gpu --wrap=touch"})
    check(s.returncode == 11 and "partition" in s.stdout and "--wrap" not in s.stdout.split("mih: ")[0],
          f"9: a partition that would add sbatch options is refused (exit {s.returncode})", s.stdout[-1500:])
    s = submit(os.path.join(base, "night"), {"modules": ["cuda; touch " + pwned], "srun_args": "--x=1; touch " + pwned,
                                             "container": "$(touch " + pwned + ")"})
    check(s.returncode == 0 and f"module load 'cuda; touch {pwned}'" in s.stdout and f"'--x=1;' 'touch' '{pwned}'"
          in s.stdout and f"'$(touch' '{pwned})'" in s.stdout,
          f"9: the site's modules, srun_args and container are quoted words (exit {s.returncode})", s.stdout[-2500:])


def limited(mih, args, fsize=None, address_space=None):
    """`mih args` under RLIMIT_FSIZE `fsize` / RLIMIT_AS `address_space` (bytes)."""
    def limit():
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    return subprocess.run([mih] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=limit,
                          timeout=300)


def limits_give_their_exit_code(mih, work):
    """5."""
    deep = os.path.join(work, "deep")
    os.makedirs(deep)
    write(os.path.join(deep, "results.jsonl"), '{"run": {"event": "start", "tests": ' + "[" * 100000 + "]" * 100000 +
          "}}\n")
    c = run(mih, ["check", deep])
    check(c.returncode == 12 and "nested deeper" in c.stdout,
          f"5: mih check of a results.jsonl line nested 100000 deep: exit {c.returncode} (want 12)", c.stdout[-1500:])
    small = os.path.join(work, "file-size")
    t = limited(mih, ["test", "--evidence-root", small, "--no-progress", "--gtest_brief=1", LLAMA_REFERENCE],
                fsize=64 * 1024)
    check(t.returncode == 12 and "File too large" in t.stdout,
          f"5: mih test under ulimit -f 64: exit {t.returncode} (want 12, naming the file too large)", t.stdout[-1500:])
    whole = os.path.join(work, "whole")
    t = run(mih, ["test", "--evidence-root", whole, "--no-progress", "--gtest_brief=1", LLAMA_REFERENCE])
    v = limited(mih, ["test", "--verify-only", "--evidence-root", whole, "--no-progress", "--gtest_brief=1",
                      LLAMA_REFERENCE], fsize=1024)
    check(t.returncode == 0 and v.returncode == 12 and "File too large" in v.stdout,
          f"5: mih test --verify-only under ulimit -f 1: exit {v.returncode} (want 12, naming the file too large)",
          v.stdout[-1500:])
    e = limited(mih, ["export", "--spec", "llama", "--out", os.path.join(work, "export-limited")], fsize=1024)
    check(e.returncode == 12 and "ulimit -f" in e.stdout,
          f"5: mih export under ulimit -f 1: exit {e.returncode} (want 12, naming ulimit -f and how to raise it)",
          e.stdout[-1500:])
    a = limited(mih, ["list"], address_space=500000 * 1024)
    check(a.returncode == 12 and "ulimit -v" in a.stdout and "1048576 KiB" in a.stdout,
          f"5: mih under ulimit -v 500000: exit {a.returncode} (want 12, naming the limit it needs)", a.stdout[-1500:])


def big_matrices_are_refused_quickly(mih, work):
    """6."""
    path = os.path.join(work, "identical.json")
    with open(path, "w") as f:
        json.dump({"name": "identical", "cases": [{"dp_shard": 2}] * 400000}, f)
    start = time.monotonic()
    m = run(mih, ["matrix", "--spec", "llama", "--matrix", path], timeout=300)
    seconds = time.monotonic() - start
    check(m.returncode == 11 and "at most 4096" in m.stdout and seconds < 10,
          f"6: a matrix of 400000 identical cases: exit {m.returncode} in {seconds:.1f} s (want 11 within 10 s)",
          m.stdout[-1500:])
    twice = write(os.path.join(work, "twice.json"), '{"name": "twice", "cases": [{"dp_shard": 2, "dp_shard": 2}]}')
    m = run(mih, ["matrix", "--spec", "llama", "--matrix", twice])
    check(m.returncode == 11 and "'dp_shard' appears twice" in m.stdout,
          f"6: a repeated key of a matrix file is refused (exit {m.returncode})", m.stdout[-1500:])


def smaller_wrong_outcomes(mih, work):
    """11."""
    root = os.path.join(work, "small")
    t = run(mih, ["test", "--evidence-root", root, "--no-progress", "--gtest_brief=1", LLAMA_REFERENCE])
    check(t.returncode == 0, f"11: the llama Reference run passes (exit {t.returncode})", t.stdout[-1500:])
    for record, field in (('{"matrix": 5}', "'matrix'"), ("[1]", "the record"),
                          ('{"registrations": [{"prefix": "Llama", "matrix": 3}]}', "'registrations'"),
                          ('{"init_from": {"llama": {"dir": 5}}}', "'init_from.llama'")):
        write(os.path.join(root, "run.json"), record)
        c = run(mih, ["check", root, "--no-progress", "--gtest_brief=1"])
        check(c.returncode == 12 and field in c.stdout and "mih bug" not in c.stdout,
              f"11: mih check of a run.json {record}: exit {c.returncode} (want 12 naming {field})", c.stdout[-1500:])
    os.remove(os.path.join(root, "run.json"))
    # Each degree fits in 32 bits; the world wraps to -1840700270 in an int, the batch split
    # (dp_replicate x dp_shard x micro_batches = 2^64 - 2) to -2 in an int64, which divides 8.
    wrap = write(os.path.join(work, "wrap.json"), json.dumps(
        {"name": "wrap", "cases": [{"dp_replicate": 1532540863, "dp_shard": 1719529454, "micro_batches": 7}]}))
    m = run(mih, ["matrix", "--spec", "llama", "--matrix", wrap])
    check(m.returncode == 11 and "is more than 2147483647 ranks" in m.stdout and "-1840700270" not in m.stdout,
          f"11: a case whose degrees multiply past 2^31: exit {m.returncode} (want 11 naming the product)",
          m.stdout[-1500:])
    forged = write(os.path.join(work, "forged.json"), json.dumps(
        {"name": "n", "dtype": "bf\nmih matrix: all cases pass\x1b[2J", "cases": [{"dp_shard": 2}]}))
    m = run(mih, ["matrix", "--spec", "llama", "--matrix", forged])
    check(m.returncode == 11 and "\x1b" not in m.stdout and "\nmih matrix: all" not in m.stdout and
          "\\x1b[2J" in m.stdout, f"11: a value's newline and escape are not printed raw (exit {m.returncode})",
          m.stdout[-1500:])
    big = write(os.path.join(work, "big.json"), json.dumps({"name": "n", "dtype": "x" * 30000000,
                                                            "cases": [{"dp_shard": 2}]}))
    m = run(mih, ["matrix", "--spec", "llama", "--matrix", big])
    check(m.returncode == 11 and len(m.stdout) < 5000 and re.search(r"\(300000\d\d bytes\)", m.stdout),
          f"11: a 30 MB value is cut in the message ({len(m.stdout)} bytes printed; exit {m.returncode})",
          m.stdout[-600:])
    case = os.path.join(root, "llama", "Reference")
    metrics = os.path.join(case, "cases", "runtime", "metrics.jsonl")
    os.remove(metrics)
    os.makedirs(metrics)
    v = run(mih, ["validate", case])
    check(v.returncode == 12 and "metrics.jsonl: is a directory" in v.stdout,
          f"11: mih validate of a case whose metrics.jsonl is a directory: exit {v.returncode} (want 12)",
          v.stdout[-1500:])


def llama_root(mih, work, name):
    root = os.path.join(work, name)
    t = run(mih, ["test", "--evidence-root", root, "--no-progress", "--gtest_brief=1", LLAMA_REFERENCE])
    check(t.returncode == 0, f"{name}: the llama Reference run passes (exit {t.returncode})", t.stdout[-1500:])
    return root


def huge_temp_numbers_are_no_bug(mih, work):
    """11a."""
    root = llama_root(mih, work, "huge-temp")
    for name in ("results.jsonl.tmp.99999999999999999999999", "run.json.tmp.99999999999999999999999.0123456789abcdef",
                 "x.tmp.9999999999", "x.tmp." + "9" * 240):
        write(os.path.join(root, name), "")
    for args in (["test", "--evidence-root", root], ["check", root],
                 ["test", "--verify-only", "--evidence-root", root]):
        c = run(mih, args + ["--no-progress", "--gtest_brief=1", LLAMA_REFERENCE])
        check(c.returncode == 0 and "mih bug" not in c.stdout,
              f"11a: mih {' '.join(args[:2])} beside results.jsonl.tmp.<23 digits>: exit {c.returncode} (want 0)",
              c.stdout[-1500:])


def sweep_keeps_what_is_not_mih_s(mih, work):
    """11g."""
    root = llama_root(mih, work, "sweep")
    case = os.path.join(root, "llama", "Reference")
    dead = "999999999"  # above any pid_max (2^22): never a live process
    kept = [os.path.join(case, "extra", "notes.tmp." + dead), os.path.join(case, "extra", "w.tmp." + dead + ".0123456789abcdef"),
            os.path.join(root, "notes.tmp." + dead + ".backup"), os.path.join(root, "x.tmp." + dead + ".0123456789ABCDEF"),
            os.path.join(root, "run.json.tmp." + str(os.getpid()) + ".0123456789abcdef")]
    swept = [os.path.join(case, "check", "x.json.tmp." + dead + ".0123456789abcdef"),
             os.path.join(root, "results.jsonl.tmp." + dead)]
    os.makedirs(os.path.join(case, "extra"))
    for path in kept + swept:
        write(path, "mine\n")
    t = run(mih, ["test", "--evidence-root", root, "--no-progress", "--gtest_brief=1", LLAMA_REFERENCE])
    lost = [os.path.relpath(p, root) for p in kept if not os.path.exists(p)]
    left = [os.path.relpath(p, root) for p in swept if os.path.exists(p)]
    check(t.returncode == 0 and not lost and not left,
          f"11g: the sweep removes only mih's temp names of a dead pid outside extra/ (exit {t.returncode}; removed "
          f"{lost}; left {left})", t.stdout[-1500:])


TWO_WRITERS = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
import torch, mih_evidence
case, lr, delay, hold = sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
made = mih_evidence._make_own_directory
def slow(path):  # a slow file system: the directory made, its first file not written yet
    made(path)
    time.sleep(delay)
mih_evidence._make_own_directory = slow
model = torch.nn.Linear(2, 2).double()
optimizer = torch.optim.SGD(model.parameters(), lr=lr)
ev = mih_evidence.Session(case, model, "Reference", steps=2)
ev.attach_optimizer(optimizer)
print("writing", flush=True)
for step in range(2):
    ev.begin_step(step)
    ev.record_batch(step, 0, 0, {"input_ids": torch.zeros(2, 3, dtype=torch.int64)})
    loss = model(torch.ones(2, 2, dtype=torch.float64)).pow(2).mean()
    loss.backward()
    ev.after_backward_before_clip(step)
    ev.after_clip(step, float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
    optimizer.step()
    ev.after_optimizer(step)
    optimizer.zero_grad()
    ev.end_step(step, loss=float(loss), lr=lr)
    time.sleep(hold)
ev.finish()
"""


def two_python_writers(mih, work):
    """11f."""
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK) or subprocess.run([python, "-c", "import torch"]).returncode:
        print(f"skip: 11f: {python} with torch (python3-torch) is not installed")
        return
    python_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
    for what, delay, start_second in (("one after the other", 0.0, 0.0), ("both past the look at once", 4.0, 1.5)):
        case = os.path.join(work, "two-writers", what.replace(" ", "-"), "tiny", "Reference")
        writer = [python, "-c", TWO_WRITERS, python_dir, case]
        first = subprocess.Popen(writer + ["0.1", str(delay), "5"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
        # The second starts while the first is writing (or, slowed, has not written yet).
        line = first.stdout.readline() if not delay else ""
        time.sleep(start_second)
        second = subprocess.run(writer + ["0.2", str(delay), "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=300)
        out, _ = first.communicate(timeout=300)
        with open(os.path.join(case, "cases", "runtime", "metrics.jsonl")) as f:
            lrs = [json.loads(row)["lr"] for row in f]
        check(second.returncode != 0 and case in second.stdout and f"pid {first.pid}" in second.stdout,
              f"11f: a second Python writer on one case directory, {what}, is refused naming it and the first "
              f"(exit {second.returncode})", second.stdout[-1500:])
        check(first.returncode == 0 and lrs == [0.1, 0.1],
              f"11f: the first writer's evidence is whole, {what} (exit {first.returncode}; metrics lr {lrs})",
              line + out[-1500:])
        v = run(mih, ["validate", case])
        check(v.returncode == 0, f"11f: its case directory follows the contract (exit {v.returncode})", v.stdout[-1500:])
    # mih's C++ TrainerSession takes the same lock: refused beside a Python writer, naming it.
    trainer = os.environ.get("MIH_OWN_TRAINER", os.path.join(os.path.dirname(mih), "mih_own_trainer"))
    if not os.access(trainer, os.X_OK):
        print(f"skip: 11f: no {trainer} (the build's tests/own_trainer) beside the Python writer")
        return
    case = os.path.join(work, "two-writers", "python-then-cpp", "tiny", "Reference")
    first = subprocess.Popen([python, "-c", TWO_WRITERS, python_dir, case, "0.1", "0", "5"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    line = first.stdout.readline()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    second = subprocess.run([trainer, "--case-dir", case, "--case", "Reference", "--parallel", "none", "--steps", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, env=env)
    out, _ = first.communicate(timeout=300)
    with open(os.path.join(case, "cases", "runtime", "metrics.jsonl")) as f:
        lrs = [json.loads(row)["lr"] for row in f]
    check(second.returncode != 0 and f"mih-evidence.py pid {first.pid}" in second.stdout,
          f"11f: a C++ TrainerSession beside a Python writer is refused naming it (exit {second.returncode})",
          second.stdout[-1500:])
    check(first.returncode == 0 and lrs == [0.1, 0.1],
          f"11f: and the Python writer's evidence is whole (exit {first.returncode}; metrics lr {lrs})", line + out[-1500:])


SECTIONS = {"7": golden_keeps_what_mih_did_not_write, "8": check_on_read_only_evidence, "9": submit_runs_no_value,
            "5": limits_give_their_exit_code, "6": big_matrices_are_refused_quickly, "11": smaller_wrong_outcomes,
            "11a": huge_temp_numbers_are_no_bug, "11g": sweep_keeps_what_is_not_mih_s, "11f": two_python_writers}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mih", required=True)
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    ap.add_argument("--only", default=",".join(SECTIONS), help="the sections to run, e.g. 7,8")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    t0 = time.time()
    for section in a.only.split(","):
        SECTIONS[section](os.path.abspath(a.mih), os.path.abspath(a.work))
    print(f"{'all' if not FAILURES else len(FAILURES)} {'checks held' if not FAILURES else 'check(s) failed'} "
          f"in {time.time() - t0:.0f} s")
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
