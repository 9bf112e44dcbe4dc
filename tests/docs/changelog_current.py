#!/usr/bin/env python3
"""The installed API's changelog is kept: docs/changelog.md exists, its entries are dated newest
first under one '## YYYY-MM-DD' heading per date, README.md, docs/README.md and harness/README.md
(the house rule) link it, and no installed header's code changed after the changelog's last
change (committed or in the working tree). Installed headers are what
cmake/MihInstall.cmake installs: harness/**/*.h but *_internal.h, reference_models/**/*.h,
specs/spec_support.h, suites/conformance.h and suites/suite_table.h. Lines that are blank or
comments (//, ///) are not code: a docstring edit needs no entry.

  changelog_current.py --repo <source dir>   the check on a source tree (exit 0 pass, 1 fail,
                                             77 skip: not a git checkout, no git, history cut)
  changelog_current.py --self-test           the check on scratch repositories: it fails on a
                                             header changed after the changelog and on a tree
                                             without one, passes with an entry or a comment edit
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lint"))
from check_main import main  # noqa: E402

SKIP = 77
CHANGELOG = "docs/changelog.md"
# Where a reader finds the changelog: (file, the link's target as written there).
LINKS = [("README.md", "docs/changelog.md"), ("docs/README.md", "changelog.md"),
         ("harness/README.md", "../docs/changelog.md")]
EXACT = {"specs/spec_support.h", "suites/conformance.h", "suites/suite_table.h"}


def installed(path):
    if path in EXACT:
        return True
    if not path.endswith(".h"):
        return False
    if path.startswith("harness/"):
        return not path.endswith("_internal.h")
    return path.startswith("reference_models/")


def git(repo, *args):
    out = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("git " + " ".join(args) + ": " + out.stderr.strip())
    return out.stdout


def code_lines(diff):
    """The added or removed lines of a unified diff that are code, by installed header."""
    changed, current, in_hunk = {}, None, False
    for line in diff.splitlines():
        m = re.match(r"diff --git a/(\S+) b/(\S+)", line)
        if m:
            current, in_hunk = m.group(2), False
            continue
        if line.startswith("@@"):
            in_hunk = True
            continue
        if not in_hunk or current is None or not line or line[0] not in "+-":
            continue
        text = line[1:].strip()
        if not text or text.startswith("//"):
            continue
        changed.setdefault(current, []).append(line)
    return {f: lines for f, lines in changed.items() if installed(f)}


def check(repo):
    """Returns (status, message): 0 pass, 1 fail, SKIP."""
    if shutil.which("git") is None:
        return SKIP, "skipped: git is not installed"
    try:
        inside = git(repo, "rev-parse", "--is-inside-work-tree").strip()
    except RuntimeError as e:
        return SKIP, "skipped: %s is not a git checkout (%s)" % (repo, e)
    if inside != "true":
        return SKIP, "skipped: %s is not a git work tree" % repo
    path = os.path.join(repo, CHANGELOG)
    if not os.path.isfile(path):
        return 1, ("%s is missing: every change to an installed header gets a line there (newest first; "
                   "harness/README.md)" % CHANGELOG)
    for readme, target in LINKS:
        try:
            with open(os.path.join(repo, readme), encoding="utf-8") as f:
                linked = "(%s)" % target in f.read()
        except OSError:
            linked = False
        if not linked:
            return 1, "%s does not link the changelog: add a line with [%s](%s) where its documents are listed" % (
                readme, os.path.basename(target), target)
    with open(path, encoding="utf-8") as f:
        dates = re.findall(r"^## (\d{4}-\d{2}-\d{2})", f.read(), re.M)
    if not dates:
        return 1, "%s has no entry: each starts with a heading '## YYYY-MM-DD ...'" % CHANGELOG
    twice = sorted({d for d in dates if dates.count(d) > 1})
    if twice:
        return 1, ("%s: one '## YYYY-MM-DD' heading per date, got %s more than once: put the day's bullets under "
                   "one heading" % (CHANGELOG, ", ".join(twice)))
    if dates != sorted(dates, reverse=True):
        return 1, "%s: entries must be newest first, got dates %s" % (CHANGELOG, ", ".join(dates))
    if git(repo, "status", "--porcelain", "--", CHANGELOG).strip():
        return 0, "%s is being edited in the working tree: the change at hand has its entry" % CHANGELOG
    last = git(repo, "log", "-1", "--format=%H", "--", CHANGELOG).strip()
    if not last:
        return 1, "%s is not committed" % CHANGELOG
    if git(repo, "rev-parse", "--is-shallow-repository").strip() == "true":
        try:
            git(repo, "cat-file", "-e", last + "^{commit}")
        except RuntimeError:
            return SKIP, "skipped: the history of this shallow clone does not reach %s's last change" % CHANGELOG
    changed = code_lines(git(repo, "diff", "-U0", last, "--", "harness", "reference_models", "specs", "suites"))
    untracked = [p for p in git(repo, "ls-files", "--others", "--exclude-standard", "--", "harness", "reference_models",
                                "specs", "suites").splitlines() if installed(p)]
    for p in untracked:
        changed.setdefault(p, []).append("+(new file)")
    if not changed:
        return 0, "no installed header's code changed after %s's last change (%s)" % (CHANGELOG, last[:12])
    lines = []
    for f in sorted(changed):
        lines.append("  %s: %d changed code lines, e.g. %s" % (f, len(changed[f]), changed[f][0][:100]))
    return 1, ("installed headers changed after %s's last change (%s) without a new entry:\n%s\n"
               "add a line to %s (newest first: the date, the commit or issue, what changed and what an outside "
               "port must change)" % (CHANGELOG, last[:12], "\n".join(lines), CHANGELOG))


def self_test():
    """The check fails where it must and passes where it must, on scratch repositories."""
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = os.path.join(tmp, "repo")
        os.makedirs(os.path.join(repo, "harness", "parallel"))
        os.makedirs(os.path.join(repo, "docs"))

        def write(rel, text):
            with open(os.path.join(repo, rel), "w", encoding="utf-8") as f:
                f.write(text)

        def commit(msg):
            git(repo, "add", "-A")
            git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", msg)

        def expect(status, what, says=""):
            got, message = check(repo)
            print("%-58s -> %s" % (what, {0: "pass", 1: "FAIL", SKIP: "skip"}[got]))
            if got != status or says not in message:
                failures.append("%s: expected %s saying %r, got %s (%s)" % (what, status, says, got, message))

        git(repo, "init", "-q")
        write("README.md", "- [docs/changelog.md](docs/changelog.md)\n")
        write("docs/README.md", "- [changelog.md](changelog.md)\n")
        write("harness/README.md", "a bullet in [docs/changelog.md](../docs/changelog.md)\n")
        write("harness/parallel/layer.h", "// A layer.\n#pragma once\nint f(int x);\n")
        write("harness/parallel/layer_internal.h", "int g();\n")
        commit("a header, no changelog")
        expect(1, "no docs/changelog.md", "docs/changelog.md is missing")
        write(CHANGELOG, "# Changelog\n\n## 2026-12-01 first\n- f\n")
        commit("changelog")
        expect(0, "changelog after the last header change")
        write("harness/parallel/layer.h", "// A layer.\n#pragma once\nint f(int x, int y);\n")
        expect(1, "a header's code edited in the working tree", "harness/parallel/layer.h")
        commit("f takes y")
        expect(1, "a header's code changed in a later commit")
        write(CHANGELOG, "# Changelog\n\n## 2026-12-02 f takes y\n- f\n\n## 2026-12-01 first\n- f\n")
        expect(0, "the same with the changelog edited beside it")
        commit("entry")
        expect(0, "the same with the entry committed")
        write("harness/parallel/layer.h", "// A layer of mine.\n#pragma once\n/// f.\nint f(int x, int y);\n")
        expect(0, "a comment-only edit of a header")
        write("harness/parallel/layer_internal.h", "int g(int);\n")
        expect(0, "an *_internal.h header (not installed)")
        write("harness/parallel/other.h", "int h();\n")
        expect(1, "a new installed header, untracked", "harness/parallel/other.h")
        os.remove(os.path.join(repo, "harness/parallel/other.h"))
        write(CHANGELOG, "# Changelog\n\n## 2026-12-01 first\n\n## 2026-12-02 second\n")
        expect(1, "entries oldest first", "newest first")
        write(CHANGELOG, "# Changelog\n\n## 2026-12-02\n- a\n\n## 2026-12-02\n- b\n\n## 2026-12-01 first\n")
        expect(1, "two headings of one date", "2026-12-02 more than once")
        git(repo, "checkout", "-q", "--", CHANGELOG)
        write("docs/README.md", "- [examples.md](examples.md)\n")
        expect(1, "docs/README.md without the link", "docs/README.md does not link")
        git(repo, "checkout", "-q", "--", "docs/README.md")
        plain = os.path.join(tmp, "plain")
        os.makedirs(plain)
        got, _ = check(plain)
        print("%-58s -> %s" % ("a directory that is no git checkout", {0: "pass", 1: "FAIL", SKIP: "skip"}[got]))
        if got != SKIP:
            failures.append("a directory that is no git checkout: expected a skip, got %s" % got)
    for f in failures:
        print("self-test failure: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(__doc__, check, self_test))
