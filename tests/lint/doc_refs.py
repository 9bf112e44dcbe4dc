"""Every document the sources cite is in the repository (ctest doc_refs, label lint): a comment,
docstring or message of harness/, suites/, specs/, reference_models/, cmake/, scripts/, python/,
golden/, bench/ or tests/ that names a Markdown file (`docs/libtorch-compat.md section 1.5`,
`golden/README.md`, `../docs/changelog.md`) names one that exists, as a path from the repository
root or from the citing file's folder, or (a bare name) a file of that name anywhere in the
repository. A reader of the installed headers has the repository, not the team's notes beside
it; so a cited note is brought into docs/ rather than cited from outside.

Not documents: the files mih writes (report.md, faults.md), listed in OUTPUTS. Not in the
repository by design: the team's design and style documents (TEAM), kept beside it and
mirrored for readers by docs/components.md and harness/README.md."""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_main import main  # noqa: E402

FOLDERS = ("harness", "suites", "specs", "reference_models", "cmake", "scripts", "python", "golden", "bench", "tests")
OUTPUTS = {"report.md", "faults.md"}  # written by mih into a run root: outputs, not documents
TEAM = {"DESIGN.md", "STYLE.md"}       # the team's design and house style, beside the repository
CITED = re.compile(r"(?<![\w.-])((?:\.\./|\./)*[A-Za-z0-9_][A-Za-z0-9_./-]*\.md)\b")


def tracked(repo):
    out = subprocess.run(["git", "-C", repo, "ls-files"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True)
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.split()
    return [os.path.relpath(os.path.join(d, f), repo) for d, _, fs in os.walk(repo) if "/.git" not in d for f in fs]


def resolves(repo, citing, cited, names):
    if os.path.basename(cited) in OUTPUTS or cited in TEAM:
        return True
    if "/" not in cited:
        return cited in names
    here = os.path.dirname(os.path.join(repo, citing))
    # A relative link a test checks in another file (harness/README.md's ../docs/changelog.md)
    # resolves from a top-level folder.
    bases = [repo, here] + [os.path.join(repo, d) for d in FOLDERS]
    return any(os.path.isfile(os.path.normpath(os.path.join(base, cited))) for base in bases)


def check(repo):
    files = tracked(repo)
    names = {os.path.basename(f) for f in files if f.endswith(".md")}
    missing = []
    for f in files:
        if not f.startswith(tuple(d + "/" for d in FOLDERS)) or f.endswith(".md") or f.startswith("tests/lint/"):
            continue
        try:
            text = open(os.path.join(repo, f), encoding="utf-8").read()
        except (OSError, UnicodeDecodeError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for cited in CITED.findall(line):
                if not resolves(repo, f, cited, names):
                    missing.append(f"{f}:{n}: cites '{cited}', which is not in the repository")
    if missing:
        return 1, ("documents cited but not in the repository (bring the note into docs/ and cite it "
                   "there):\n  " + "\n  ".join(missing))
    return 0, f"every document cited by {len(files)} tracked files is in the repository"


def self_test():
    with tempfile.TemporaryDirectory() as repo:
        os.makedirs(os.path.join(repo, "harness", "compat"))
        os.makedirs(os.path.join(repo, "docs"))
        open(os.path.join(repo, "docs", "notes.md"), "w").write("# notes\n")
        src = os.path.join(repo, "harness", "compat", "a.h")
        open(src, "w").write("// see docs/notes.md section 1 and ../../docs/notes.md; writes report.md\n")
        ok, _ = check(repo)
        open(src, "a").write("// see libtorch_compat.md section 1.5\n")
        bad, message = check(repo)
    if ok != 0 or bad != 1 or "libtorch_compat.md" not in message:
        print(f"doc_refs self-test: a resolvable citation gave {ok}, a missing one {bad}: {message}")
        return 1
    print("doc_refs self-test: a citation of a note outside the repository is caught")
    return 0


if __name__ == "__main__":
    sys.exit(main(__doc__, check, self_test))
