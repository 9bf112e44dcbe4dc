#!/usr/bin/env python3
"""The evidence contract against a whole run root (ctest reference/contract, after every case of
the main job): every case directory mih's session and case runner wrote follows
schemas/evidence/v1, checked twice by independent implementations -- Debian's python3-jsonschema
(Draft7Validator) here, and `mih validate` (valijson, the schemas compiled into mih) -- and a
case directory with one field edited, an unknown file or a symlink is refused by `mih validate`,
`mih compare` and `mih check` (exit 12), naming the file and the field.

Usage: contract_check.py --mih build/bin/mih --root build/mih-evidence/reference
                         --schemas schemas/evidence/v1 --work DIR
"""
import argparse
import csv
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys

try:
    import jsonschema
except ImportError:
    sys.exit("contract_check.py: needs python3-jsonschema (Debian's, for this python: " + sys.executable +
             "); scripts/test installs it: apt-get install python3-jsonschema")

FAILED = []


def fail(msg):
    FAILED.append(msg)
    print("FAIL: " + msg, flush=True)


class Contract:
    def __init__(self, schema_dir):
        with open(os.path.join(schema_dir, "contract.json")) as f:
            self.manifest = json.load(f)
        assert self.manifest["contract"] == "mih-evidence" and self.manifest["version"] == 1
        self.entries = []
        self.validators = {}
        for e in self.manifest["files"]:
            pattern = ""
            path = e["path"]
            i = 0
            while i < len(path):
                if path[i] == "<":
                    end = path.index(">", i)
                    pattern += "(?:" + self.manifest["placeholders"][path[i:end + 1]] + ")"
                    i = end + 1
                elif path.startswith("**", i):
                    pattern += ".+"
                    i += 2
                else:
                    pattern += re.escape(path[i])
                    i += 1
            self.entries.append((re.compile(pattern + r"\Z"), e))
            name = e.get("schema")
            if name and name not in self.validators:
                with open(os.path.join(schema_dir, name)) as f:
                    schema = json.load(f)
                jsonschema.Draft7Validator.check_schema(schema)
                self.validators[name] = jsonschema.Draft7Validator(schema)

    def entry(self, relative):
        for nested in self.manifest["nested"]:
            if relative.startswith(nested + "/"):
                relative = relative[len(nested) + 1:]
        if relative.startswith("extra/"):
            return {"format": "extra"}
        for pattern, e in self.entries:
            if pattern.match(relative):
                return e
        return None

    def problems(self, case_dir):
        """(files, values, problems) of one case directory."""
        files = values = 0
        out = []
        for base, dirs, names in os.walk(case_dir):
            for name in sorted(names) + [d for d in dirs if os.path.islink(os.path.join(base, d))]:
                full = os.path.join(base, name)
                rel = os.path.relpath(full, case_dir)
                files += 1
                if os.path.islink(full):
                    out.append(f"{rel}: a symlink")
                    continue
                e = self.entry(rel)
                if e is None:
                    out.append(f"{rel}: no entry of the contract names it")
                    continue
                fmt = e["format"]
                if fmt == "csv":
                    with open(full, newline="") as f:
                        rows = list(csv.reader(f))
                    if not rows or rows[0] != e["columns"]:
                        out.append(f"{rel}: header {rows[0] if rows else 'missing'}")
                    for n, row in enumerate(rows[1:], 2):
                        if len(row) != len(e["columns"]):
                            out.append(f"{rel} line {n}: {len(row)} fields, the header has {len(e['columns'])}")
                elif fmt in ("json", "jsonl"):
                    v = self.validators[e["schema"]]
                    with open(full) as f:
                        text = f.read()
                    docs = [json.loads(text)] if fmt == "json" else [json.loads(l) for l in text.splitlines()]
                    for n, doc in enumerate(docs, 1):
                        values += 1
                        for err in v.iter_errors(doc):
                            where = "/".join(str(p) for p in err.absolute_path)
                            out.append(f"{rel}{' line ' + str(n) if fmt == 'jsonl' else ''}: {where}: {err.message[:200]}")
        return files, values, out


def case_dirs(root):
    out = []
    for spec in sorted(os.listdir(root)):
        sdir = os.path.join(root, spec)
        if not os.path.isdir(sdir) or os.path.islink(sdir):
            continue
        for case in sorted(os.listdir(sdir)):
            cdir = os.path.join(sdir, case)
            if os.path.isdir(cdir) and (os.path.exists(os.path.join(cdir, "case_run.json")) or
                                        os.path.exists(os.path.join(cdir, "environment.json"))):
                out.append(cdir)
    return out


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    return p.returncode, p.stdout


def expect_refused(what, cmd, *needles):
    rc, out = run(cmd)
    if rc != 12:
        fail(f"{what}: exit {rc}, want 12 (evidence refused)\n{out[-2000:]}")
        return
    for n in needles:
        if n not in out:
            fail(f"{what}: the refusal does not name {n!r}\n{out[-2000:]}")
            return
    print(f"ok: {what}: exit 12 naming {', '.join(repr(n) for n in needles)}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mih", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--schemas", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--doc", help="docs/evidence.md: must name every file of the manifest")
    a = ap.parse_args()
    if not os.path.isdir(a.root):
        print(f"{a.root} is not a directory: no run to check (a filtered run)")
        return 0
    contract = Contract(a.schemas)
    if a.doc:
        # The published page names every file of the manifest (by its last path component).
        with open(a.doc) as f:
            doc = f.read()
        for e in contract.manifest["files"]:
            name = e["path"].rsplit("/", 1)[-1]
            if name not in doc:
                fail(f"{a.doc} does not name {e['path']} ({name}), which contract.json lists")
    cases = case_dirs(a.root)
    if not cases:
        fail(f"{a.root} holds no case directory")
        return 1

    # 1. Every file of every case, by the independent implementation.
    total_files = total_values = 0
    for c in cases:
        files, values, problems = contract.problems(c)
        total_files += files
        total_values += values
        for p in problems[:5]:
            fail(f"{os.path.relpath(c, a.root)}: {p}")
    print(f"python3-jsonschema {importlib.metadata.version('jsonschema')}: "
          f"{len(cases)} case directories, {total_files} files, {total_values} JSON values", flush=True)

    # 2. The same by mih's own validator, which the checks run before they read anything.
    rc, out = run([a.mih, "validate", a.root])
    valid = sum(1 for l in out.splitlines() if l.startswith("valid "))
    if rc != 0 or valid != len(cases):
        fail(f"mih validate {a.root}: exit {rc}, {valid} of {len(cases)} valid\n{out[-3000:]}")
    else:
        print(f"ok: mih validate: {valid} of {len(cases)} case directories valid", flush=True)
    if "written by mih " not in out:
        fail("mih validate names no writer 'mih ...'")

    # 3. One case directory, broken one way at a time, refused naming the file and field.
    ref = next((c for c in cases if c.endswith("/llama/Reference")), None)
    cand = next((c for c in cases if c.endswith("/llama/DpShard2")), None)
    if not ref or not cand:
        print("llama/Reference or llama/DpShard2 not in this run: the refusals are not exercised")
        return 1 if FAILED else 0
    shutil.rmtree(a.work, ignore_errors=True)
    broken_root = os.path.join(a.work, "root")

    def fresh():
        shutil.rmtree(broken_root, ignore_errors=True)
        dst = os.path.join(broken_root, "llama", "DpShard2")
        shutil.copytree(cand, dst, symlinks=True)
        return dst

    d = fresh()
    metrics = os.path.join(d, "cases/runtime/metrics.jsonl")
    with open(metrics) as f:
        rows = [json.loads(l) for l in f]
    rows[0]["loss"] = str(rows[0]["loss"])  # a number become a string
    with open(metrics, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    if not contract.problems(d)[2]:
        fail("python3-jsonschema accepts metrics.jsonl with loss a string")
    needle = "cases/runtime/metrics.jsonl: field line 1: loss"
    expect_refused("mih validate, loss a string", [a.mih, "validate", d], needle)
    expect_refused("mih compare, loss a string", [a.mih, "compare", ref, d], needle)
    expect_refused("mih check --allow-edited-evidence, loss a string",
                   [a.mih, "check", d, "--allow-edited-evidence", "--no-progress"], needle)

    d = fresh()
    findings = os.path.join(d, "check/findings.json")
    with open(findings) as f:
        doc = json.load(f)
    key = next(iter(doc))  # the first top-level field, removed
    del doc[key]
    with open(findings, "w") as f:
        json.dump(doc, f)
    expect_refused(f"mih validate, findings.json without '{key}'", [a.mih, "validate", d], "check/findings.json", key)

    d = fresh()
    with open(os.path.join(d, "check", "notes.json"), "w") as f:
        f.write("{}\n")
    expect_refused("mih validate, a file no entry names", [a.mih, "validate", d], "check/notes.json",
                   "no entry of the evidence contract")
    os.makedirs(os.path.join(d, "extra"))
    shutil.move(os.path.join(d, "check", "notes.json"), os.path.join(d, "extra", "notes.json"))
    rc, out = run([a.mih, "validate", d])
    if rc != 0:
        fail(f"mih validate refuses a writer's own file under extra/: exit {rc}\n{out[-1500:]}")

    d = fresh()
    os.remove(os.path.join(d, "check/structure.json"))
    os.symlink("/etc/hostname", os.path.join(d, "check/structure.json"))
    expect_refused("mih validate, a symlink", [a.mih, "validate", d], "check/structure.json", "symlink")

    d = fresh()
    env = os.path.join(d, "environment.json")
    with open(env) as f:
        doc = json.load(f)
    doc["evidence_contract"]["version"] = 2
    with open(env, "w") as f:
        json.dump(doc, f)
    expect_refused("mih validate, contract version 2", [a.mih, "validate", d], "environment.json",
                   "evidence_contract.version", "version 1")

    # mih's evidence under another writer's name: still mih's (its case records), never the
    # weaker check of a foreign writer.
    d = fresh()
    with open(os.path.join(d, "environment.json")) as f:
        doc = json.load(f)
    doc["evidence_contract"]["writer"] = "totally-not-mih 1.0 (x)"
    with open(os.path.join(d, "environment.json"), "w") as f:
        json.dump(doc, f)
    expect_refused("mih check, mih's evidence under another writer's name", [a.mih, "check", d],
                   "holds mih's case records")
    doc["evidence_contract"]["writer"] = 5
    with open(os.path.join(d, "environment.json"), "w") as f:
        json.dump(doc, f)
    expect_refused("mih check, a writer that is a number", [a.mih, "check", d, "--allow-edited-evidence"],
                   "field evidence_contract.writer", "number 5")
    print(f"{len(FAILED)} failure(s)")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
