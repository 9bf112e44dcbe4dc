#!/usr/bin/env python3
"""Evidence paths and case outcomes are named in one place each: no string literal in harness/ or
suites/ (.cpp, .h) spells a file or directory of the evidence layout outside
harness/contract/evidence_layout.{h,cpp}, and none spells a case outcome or test status name outside
harness/contract/case_outcome.cpp. Comments are not code: a docstring may name a file.

A literal is an evidence path when it is
  - a file name with an evidence extension ("x.json", "logs/rank0.log", "golden.safetensors");
  - a bare extension built into a name ("rank" + r + ".log", dir / ".lock");
  - a path under a layout directory ("check/" + n, "cases/runtime/...");
  - a name of the layout used with the path operator (dir / "run", "logs" / name);
  - a name of the layout that cannot be a plain word ("before_save", "fault_rank", "invariants_");
  - a per-rank or per-step prefix joined to a number ("timing_rank" + std::to_string(r)).
The layout's names are read from evidence_layout.h, the outcome names from case_outcome.cpp,
so both checks follow the headers. An outcome name used as a JSON key ({"passed", x},
j.value("interrupted", ...), j["passed"]) is a key, not an outcome, and is not flagged.

Exceptions live in tests/lint/evidence_paths.allow, one per line:
    <path>: "<literal>"  # <one-line justification>
An entry allows that literal anywhere in that file. An entry without a justification, or one
that allows nothing any more (stale), fails the check.

  evidence_paths.py --repo <source dir>   the check (exit 0 pass, 1 fail)
  evidence_paths.py --self-test           the check on a scratch tree: it fails on a planted path
                                          literal, a planted outcome literal, a stale or unjustified
                                          allow entry, and passes on comments, JSON keys and allowed
                                          literals
"""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_main import main  # noqa: E402

LAYOUT_H = "harness/contract/evidence_layout.h"
LAYOUT_CPP = "harness/contract/evidence_layout.cpp"
OUTCOME_CPP = "harness/contract/case_outcome.cpp"
ALLOW = "tests/lint/evidence_paths.allow"
SCANNED = ("harness", "suites")
EXEMPT_PATHS = {LAYOUT_H, LAYOUT_CPP}
EXEMPT_OUTCOMES = {OUTCOME_CPP}
EXT = r"(?:jsonl?|csv|safetensors|lock|log|pid|sha256|md|html|txt|pt|bin)"
FILE_NAME = re.compile(r"^[A-Za-z0-9_./<>-]*[A-Za-z0-9_>]\." + EXT + r"$")
BARE_EXT = re.compile(r"^\." + EXT + r"$")
NUMBERED = re.compile(r"^[a-z_]*(?:_rank|_step|rank)$")


def literals(text):
    """The string literals of C++ source `text` with comments blanked: [(line, start, end, value)]
    (start/end index the returned code text) and the code text itself."""
    out, code, i, n, line = [], [], 0, len(text), 1
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            code.append(" " * (j - i))
            i = j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            chunk = text[i:j]
            code.append("".join(ch if ch == "\n" else " " for ch in chunk))
            line += chunk.count("\n")
            i = j
            continue
        m = re.match(r'R"([^()\\ ]{0,16})\(', text[i:i + 20]) if c == "R" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) else None
        if m:
            end = text.find(")" + m.group(1) + '"', i + len(m.group(0)))
            end = n if end < 0 else end + len(m.group(1)) + 2
            value = text[i + len(m.group(0)):end - len(m.group(1)) - 2]
            start = sum(len(x) for x in code)
            code.append(text[i:end])
            out.append((line, start, start + end - i, value))
            line += text[i:end].count("\n")
            i = end
            continue
        if c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            start = sum(len(x) for x in code)
            code.append(text[i:j])
            if c == '"':
                out.append((line, start, start + j - i, text[i + 1:j - 1]))
            i = j
            continue
        if c == "\n":
            line += 1
        code.append(c)
        i += 1
    return out, "".join(code)


def layout_names(repo):
    """(names, dirs, distinctive): every name and path component of the layout header's
    constants, the directories among them, and those that cannot be a plain word."""
    with open(os.path.join(repo, LAYOUT_H), encoding="utf-8") as f:
        values = re.findall(r'constexpr\s+char\s+k\w+\[\]\s*=\s*"([^"]*)"', f.read())
    names, dirs, distinctive = set(), set(), set()
    for v in values:
        parts = [p for p in v.split("/") if p]
        names.add(v)
        names.update(parts)
        for k in range(1, len(parts)):
            dirs.add("/".join(parts[:k]))
        for p in parts + [v]:
            if re.search(r"[_./-]", p) and not BARE_EXT.match(p):
                distinctive.add(p)
    return names, dirs, distinctive


def outcome_names(repo):
    with open(os.path.join(repo, OUTCOME_CPP), encoding="utf-8") as f:
        return set(re.findall(r'\{\s*(?:Outcome|TestStatus)::k\w+\s*,\s*"([^"]+)"\s*\}', f.read()))


def around(code, start, end):
    """The code before and after a literal, without whitespace at the seam."""
    return code[max(0, start - 40):start].rstrip(), code[end:end + 40].lstrip()


def path_reason(value, before, after, names, dirs, distinctive):
    path_op_before = before.endswith("/") and not before.endswith("//")
    path_op_after = after.startswith("/") and not after.startswith("//") and not after.startswith("/*")
    if FILE_NAME.match(value):
        return "a file name of the evidence layout"
    if BARE_EXT.match(value) and (before.endswith("+") or path_op_before or after.startswith("+")):
        return "an extension built into a file name"
    for d in dirs:
        if value.startswith(d + "/"):
            return "a path under the layout's directory %s/" % d
    if value in names and (path_op_before or path_op_after):
        return "a layout name joined with the path operator"
    if value in distinctive:
        return "a name of the layout"
    if NUMBERED.match(value) and re.match(r"\+\s*(std::)?to_string\(", after):
        return "a per-rank or per-step file name"
    return None


def is_json_key(before, after):
    if before.endswith("{") and after.startswith(","):
        return True
    if re.search(r"(\.value|\.contains|\.at|\.find|\.count|\.erase)\($", before) and after[:1] in (",", ")"):
        return True
    return before.endswith("[") and after.startswith("]")


def scan(repo):
    """[(path, line, value, why)] of every literal the check flags."""
    names, dirs, distinctive = layout_names(repo)
    outcomes = outcome_names(repo)
    found = []
    for top in SCANNED:
        for root, _, files in os.walk(os.path.join(repo, top)):
            for name in sorted(files):
                if not name.endswith((".cpp", ".h")):
                    continue
                path = os.path.relpath(os.path.join(root, name), repo).replace(os.sep, "/")
                with open(os.path.join(repo, path), encoding="utf-8", errors="replace") as f:
                    lits, code = literals(f.read())
                for line, start, end, value in lits:
                    before, after = around(code, start, end)
                    if path not in EXEMPT_PATHS:
                        why = path_reason(value, before, after, names, dirs, distinctive)
                        if why:
                            found.append((path, line, value, why + " (name it in " + LAYOUT_H + ")"))
                            continue
                    if path not in EXEMPT_OUTCOMES and value in outcomes and not is_json_key(before, after):
                        found.append((path, line, value, "a case outcome or test status name (use " +
                                      "harness/contract/case_outcome.h's Outcome/TestStatus and their names)"))
    return sorted(found)


def read_allow(repo):
    """([(path, value, lineno)], [problems])."""
    entries, problems = [], []
    path = os.path.join(repo, ALLOW)
    if not os.path.isfile(path):
        return entries, problems
    with open(path, encoding="utf-8") as f:
        for k, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            m = re.match(r'^(\S+):\s*"((?:[^"\\]|\\.)*)"\s*#\s*(\S.*)$', line)
            if not m:
                problems.append('%s:%d: expected `<path>: "<literal>"  # <justification>`, got %r' % (ALLOW, k, line))
                continue
            entries.append((m.group(1), m.group(2), k))
    return entries, problems


def check(repo):
    found = scan(repo)
    entries, problems = read_allow(repo)
    allowed = {(p, v) for p, v, _ in entries}
    used = set()
    flagged = []
    for path, line, value, why in found:
        if (path, value) in allowed:
            used.add((path, value))
        else:
            flagged.append('%s:%d: "%s": %s' % (path, line, value, why))
    for p, v, k in entries:
        if (p, v) not in used:
            problems.append('%s:%d: stale entry %s: "%s" (the file no longer holds that literal where the check '
                            'looks): remove it' % (ALLOW, k, p, v))
    if flagged or problems:
        msg = flagged + problems
        msg.append("%d literal(s) flagged, %d allow-list problem(s); name a file in %s, an outcome through %s, or "
                   "add a justified line to %s" % (len(flagged), len(problems), LAYOUT_H, OUTCOME_CPP, ALLOW))
        return 1, "\n".join(msg)
    return 0, "no evidence-path or outcome literal outside %s and %s (%d allowed)" % (LAYOUT_H, OUTCOME_CPP, len(used))


def self_test():
    failures = []
    with tempfile.TemporaryDirectory() as repo:
        def write(rel, text):
            full = os.path.join(repo, rel)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(text)

        def expect(status, what, says=""):
            got, message = check(repo)
            print("%-60s -> %s" % (what, "pass" if got == 0 else "FAIL"))
            if got != status or says not in message:
                failures.append("%s: expected %s saying %r, got %s (%s)" % (what, status, says, got, message))

        write(LAYOUT_H, 'inline constexpr char kFindings[] = "check/findings.json";\n'
                        'inline constexpr char kRunDir[] = "run";\n'
                        'inline constexpr char kBeforeSave[] = "before_save";\n')
        write(LAYOUT_CPP, 'std::string timing_rank(int r) { return "timing_rank" + std::to_string(r) + ".json"; }\n')
        write(OUTCOME_CPP, '{Outcome::kRan, "ran"},\n{TestStatus::kPassed, "passed"},\n')
        clean = ('// Reads check/findings.json and run/case.json.\n'
                 '/* "check/findings.json" */\n'
                 'auto f = dir / layout::kFindings;\n'
                 'json j = {{"passed", true}, {"run", 1}};\n'
                 'bool p = j.value("passed", false) && j["ran"] == 1;\n'
                 'std::string word = "run";\n'
                 'auto re = R"((^|x)y)";\n')
        write("harness/x/a.cpp", clean)
        write("tests/x/t.cpp", 'auto f = dir / "check/findings.json";\n')
        expect(0, "clean tree (comments, JSON keys, a plain word, tests/)")
        write("harness/x/a.cpp", clean + 'auto g = dir / "check/findings.json";\n')
        expect(1, "a planted file name", 'harness/x/a.cpp:8: "check/findings.json"')
        write("harness/x/a.cpp", clean + 'auto g = dir / "run" / phase;\n')
        expect(1, "a planted directory with the path operator", '"run"')
        write("harness/x/a.cpp", clean + 'auto g = "timing_rank" + std::to_string(r) + ".json";\n')
        expect(1, "a planted per-rank name", '"timing_rank"')
        write("harness/x/a.cpp", clean + 'auto g = evidence / kBeforeSaveDir + "before_save";\n')
        expect(1, "a planted distinctive name", '"before_save"')
        write("harness/x/a.cpp", clean)
        write("suites/b.h", 'if (outcome == "ran") return;\n')
        expect(1, "a planted outcome literal", 'suites/b.h:1: "ran"')
        write(ALLOW, '# allowed\nsuites/b.h: "ran"  # a launcher status word\n')
        expect(0, "the outcome literal allowed with a justification")
        write(ALLOW, 'suites/b.h: "ran"\n')
        expect(1, "an allow entry without a justification", "expected")
        write(ALLOW, 'suites/b.h: "ran"  # a launcher status word\nharness/x/a.cpp: "gone.json"  # once needed\n')
        expect(1, "a stale allow entry", 'stale entry harness/x/a.cpp: "gone.json"')
        os.remove(os.path.join(repo, "suites/b.h"))
        write(ALLOW, "")
        write(LAYOUT_CPP, 'auto g = dir / "check/findings.json";\n')
        expect(0, "literals inside the layout's own implementation")
    for f in failures:
        print("self-test failure: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(__doc__, check, self_test))
