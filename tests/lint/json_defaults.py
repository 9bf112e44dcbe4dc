#!/usr/bin/env python3
"""No evidence is read with a default: no `.value("key", default)` (nlohmann's value with a
default, which turns a missing or renamed field into a silent 0, "" or false) appears in a .cpp
or .h of harness/ or suites/ outside harness/contract/, where the typed readers of the evidence
files live (one header and source per file: a struct per row, validated once, a missing or
mistyped field a named refusal). Comments are not code.

Two lists, both in this file, both keyed by file with the number of such calls it may hold:
  NOT_EVIDENCE   JSON that is not evidence (a user's config, a spec file, a golden's own
                 manifest, a checkpoint index, a rendezvous message, a record built in memory),
                 each with its reason in words.
  NOT_YET_TYPED  a shrinking ratchet of evidence reads another change still has to move onto
                 a typed reader of harness/contract/ (as structure.py's NOT_YET_SPLIT).
A file holding more calls than its entry allows fails; so does an entry that allows more than
the file holds (stale: lower the count or drop the entry), so both lists only shrink.

  json_defaults.py --repo <source dir>   the check (exit 0 pass, 1 fail)
  json_defaults.py --self-test           the check on a scratch tree: it fails on a planted
                                         read, a read above an entry's count, a stale entry and
                                         an entry without a reason; it passes on comments,
                                         harness/contract/ and a listed file
"""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_main import main  # noqa: E402
from evidence_paths import literals  # noqa: E402

SCANNED = ("harness", "suites")
EXEMPT_DIR = "harness/contract/"
VALUE_WITH_KEY = re.compile(r"(?:\.|->)\s*value\s*\(\s*\"")

# (count, reason): JSON that is not a case directory's or a run root's evidence.
NOT_EVIDENCE = {
    "harness/cases/golden.cpp": (8, "a golden's own manifest (golden.json of a golden directory, written by "
                                    "mih golden or an external writer), validated field by field in read_golden"),
    "harness/cases/fault_diagnosis.cpp": (8, "the faults report run_faults has just built in memory, rendered "
                                             "as Markdown; never read back from a file"),
    "harness/session/session.cpp": (7, "the per-rank records (perf, findings, check runs) all-gathered within "
                                       "one run from ranks of the same binary, and the generic merge of one "
                                       "pipeline stage's evidence into another's before it is written"),
    "harness/runtime/rendezvous.cpp": (2, "a rendezvous message of another rank (its host and pid) quoted in a "
                                          "refusal"),
    "harness/checkpoint/distributed_checkpoint.cpp": (3, "the distributed checkpoint's index.json (the "
                                                         "checkpoint's own format and version), refused by name"),
    "harness/checks/runtime_checks.cpp": (1, "the shared-state events of this rank's step, converted to JSON in "
                                             "memory a few lines above"),
    "harness/spec/case_matrix.cpp": (1, "a case matrix (a spec file the user writes): an omitted 'load' means "
                                        "the save's config"),
    "harness/data/text_pipeline.cpp": (9, "TextPipelineOptions from a user's config: an omitted field keeps "
                                          "its documented default"),
    "harness/data/image_pipeline.cpp": (4, "ImagePipelineOptions from a user's config: an omitted field keeps "
                                           "its documented default"),
}

# count: evidence reads another change still moves onto harness/contract/'s typed readers.
NOT_YET_TYPED = {
}


def count_calls(repo):
    """{path: [line of each `.value("` call]} over harness/ and suites/ but harness/contract/."""
    found = {}
    for top in SCANNED:
        for root, _, files in os.walk(os.path.join(repo, top)):
            for name in sorted(files):
                if not name.endswith((".cpp", ".h")):
                    continue
                path = os.path.relpath(os.path.join(root, name), repo).replace(os.sep, "/")
                if path.startswith(EXEMPT_DIR):
                    continue
                with open(os.path.join(repo, path), encoding="utf-8", errors="replace") as f:
                    _, code = literals(f.read())
                lines = [code.count("\n", 0, m.start()) + 1 for m in VALUE_WITH_KEY.finditer(code)]
                if lines:
                    found[path] = lines
    return found


def check(repo, not_evidence=None, not_yet_typed=None):
    not_evidence = NOT_EVIDENCE if not_evidence is None else not_evidence
    not_yet_typed = NOT_YET_TYPED if not_yet_typed is None else not_yet_typed
    found = count_calls(repo)
    problems = []
    for path, (_, reason) in not_evidence.items():
        if len(reason.split()) < 4:
            problems.append(f"NOT_EVIDENCE entry {path} gives no reason in words (tests/lint/json_defaults.py)")
    for path in sorted(set(found) | set(not_evidence) | set(not_yet_typed)):
        lines = found.get(path, [])
        allowed = not_evidence.get(path, (0, ""))[0] + not_yet_typed.get(path, 0)
        if len(lines) > allowed:
            where = ", ".join(str(n) for n in lines)
            problems.append(f"{path}: {len(lines)} `.value(\"key\", default)` call(s) (lines {where}), {allowed} "
                            f"allowed: read evidence through its typed reader in {EXEMPT_DIR} (a missing field is "
                            f"a named refusal, never a default); JSON that is not evidence goes in NOT_EVIDENCE "
                            f"with its reason (tests/lint/json_defaults.py)")
        elif len(lines) < allowed:
            problems.append(f"{path}: holds {len(lines)} `.value(\"key\", default)` call(s), its entries allow "
                            f"{allowed}: stale; lower the count in NOT_YET_TYPED or NOT_EVIDENCE "
                            f"(tests/lint/json_defaults.py), or drop the entry")
    if problems:
        return 1, "\n".join(problems)
    total = sum(len(v) for v in found.values())
    backlog = sum(min(len(found.get(p, [])), n) for p, n in not_yet_typed.items())
    return 0, (f"{total} `.value(\"key\", default)` call(s) in harness/ and suites/ outside {EXEMPT_DIR}: "
               f"{total - backlog} on JSON that is not evidence ({len(not_evidence)} files, each with its reason), "
               f"{backlog} evidence reads not yet typed ({len(not_yet_typed)} files)")


def self_test():
    failures = []
    with tempfile.TemporaryDirectory() as repo:
        def write(rel, text):
            full = os.path.join(repo, rel)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(text)

        def expect(status, what, says="", not_evidence=None, not_yet_typed=None):
            got, message = check(repo, not_evidence or {}, not_yet_typed or {})
            print("%-60s -> %s" % (what, "pass" if got == 0 else "FAIL"))
            if got != status or says not in message:
                failures.append("%s: expected %s saying %r, got %s (%s)" % (what, status, says, got, message))

        clean = ('// j.value("loss", 0.0) in a comment\n'
                 '/* row.value("step", -1) */\n'
                 'auto s = "x.value(\\"a\\", 1)";\n'
                 'auto o = maybe.value();\n'
                 'auto v = row.at("loss").get<double>();\n')
        write("harness/x/a.cpp", clean)
        write("harness/contract/metrics_row.cpp", 'auto d = j.value("loss", 0.0);\n')
        write("tests/x/t.cpp", 'auto d = j.value("loss", 0.0);\n')
        expect(0, "clean tree (comments, literals, optional::value, contract/, tests/)")
        write("harness/x/a.cpp", clean + 'double loss = row.value("loss", 0.0);\n')
        expect(1, "a planted evidence read", "harness/x/a.cpp: 1 `.value(\"key\", default)` call(s) (lines 6)")
        write("suites/b.h", 'auto n = p->value( "numel", 0);\n')
        expect(1, "a planted read through a pointer", "suites/b.h: 1")
        os.remove(os.path.join(repo, "suites/b.h"))
        reason = {"harness/x/a.cpp": (1, "a user's config, not evidence")}
        expect(0, "the read listed in NOT_EVIDENCE with a reason", not_evidence=reason)
        expect(1, "a NOT_EVIDENCE entry without a reason", "gives no reason",
               not_evidence={"harness/x/a.cpp": (1, "config")})
        expect(0, "the read listed in NOT_YET_TYPED", not_yet_typed={"harness/x/a.cpp": 1})
        write("harness/x/a.cpp", clean + 'double loss = row.value("loss", 0.0);\nint s = row.value("step", -1);\n')
        expect(1, "a second read above the ratchet's count", "2 `.value(\"key\", default)` call(s) (lines 6, 7), 1",
               not_yet_typed={"harness/x/a.cpp": 1})
        write("harness/x/a.cpp", clean)
        expect(1, "a ratchet entry left after the reads moved", "stale", not_yet_typed={"harness/x/a.cpp": 1})
        expect(1, "a NOT_EVIDENCE entry left after the reads went", "stale", not_evidence=reason)
    for f in failures:
        print("self-test failure: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(__doc__, check, self_test))
