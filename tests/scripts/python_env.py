#!/usr/bin/env python3
"""The scripts' Python side (scripts/lib/python_env.sh, ctest PythonEnvInstall): a complete
venv for today's pins is used as it is, without pip; a venv whose marker names other pins, or
none, is installed again; where PyPI cannot be reached the function still returns 0 under
`set -euo pipefail`, says the goldens come from the builtin, leaves no half-made venv and sets
MIH_TRANSFORMERS_PYTHON empty; MIH_NO_PYPI=1 makes no attempt. PyPI is stood in for by an
index on a closed loopback port: nothing leaves the machine.

Exit status: 0 every check held; 1 otherwise."""
import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from outcomes import FAILURES, check  # noqa: E402


def ensure(root, env):
    """Runs mih_ensure_python_env as scripts/test does: (exit status, the python it chose, output, seconds)."""
    script = ('set -euo pipefail; source "%s/scripts/lib/common.sh"; mih_ensure_python_env; '
              'echo "python=[$MIH_TRANSFORMERS_PYTHON]"' % root)
    start = time.time()
    p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, **env))
    out = p.stdout + p.stderr
    chosen = out.split("python=[")[-1].split("]")[0] if "python=[" in out else None
    return p.returncode, chosen, out, time.time() - start


def fake_venv(path, digest):
    """A venv of the scripts' as complete as the ready check sees one: its marker, and a python
    (this one, through a wrapper) that finds packages named torch and transformers."""
    for package in ("torch", "transformers"):
        os.makedirs(os.path.join(path, "site", package))
        open(os.path.join(path, "site", package, "__init__.py"), "w").close()
    os.makedirs(os.path.join(path, "bin"))
    python = os.path.join(path, "bin", "python")
    with open(python, "w") as f:
        f.write('#!/bin/sh\nPYTHONPATH="%s" exec "%s" "$@"\n' % (os.path.join(path, "site"), sys.executable))
    os.chmod(python, 0o755)
    for marker, text in ((".mih-pyenv", ""), (".mih-complete", digest)):
        with open(os.path.join(path, marker), "w") as f:
            f.write(text)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="mih's source tree")
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    offline = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "MIH_NO_PYPI": "0"}
    with open(os.path.join(a.root, "python", "requirements-golden.txt"), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()

    # A complete venv of today's pins: used as it is (its pip is never run: here it has none).
    ready = fake_venv(os.path.join(a.work, "ready"), digest)
    rc, chosen, out, _ = ensure(a.root, dict(offline, MIH_PYENV=ready))
    check(rc == 0 and chosen == os.path.join(ready, "bin", "python") and "installing" not in out,
          "a complete venv of today's pins is used without installing", out)

    # Its marker intact but transformers deleted since: installed again (here: no PyPI, so gone).
    broken = fake_venv(os.path.join(a.work, "broken"), digest)
    shutil.rmtree(os.path.join(broken, "site", "transformers"))
    rc, chosen, out, _ = ensure(a.root, dict(offline, MIH_PYENV=broken))
    check(rc == 0 and chosen == "" and "installing the pinned Python side" in out and not os.path.exists(broken),
          "a venv whose transformers was deleted (its marker intact) is installed again, not trusted", out)

    # Stale pins: installed again, which fails without PyPI, and the old venv is gone.
    with open(os.path.join(ready, ".mih-complete"), "w") as f:
        f.write("0" * 64)
    rc, chosen, out, took = ensure(a.root, dict(offline, MIH_PYENV=ready))
    check(rc == 0 and chosen == "" and "installing the pinned Python side" in out and
          "goldens come from the builtin original" in out and not os.path.exists(ready),
          "a venv of other pins is installed again; without PyPI the script goes on with the builtin, leaving no "
          "half-made venv (%.1f s)" % took, out)

    # No venv and no PyPI: the same, within a minute.
    fresh = os.path.join(a.work, "fresh")
    rc, chosen, out, took = ensure(a.root, dict(offline, MIH_PYENV=fresh))
    check(rc == 0 and chosen == "" and not os.path.exists(fresh) and took < 60,
          "no PyPI: exit 0, MIH_TRANSFORMERS_PYTHON empty, the builtin named (%.1f s)" % took, out)

    rc, chosen, out, _ = ensure(a.root, dict(offline, MIH_PYENV=fresh, MIH_NO_PYPI="1"))
    check(rc == 0 and chosen == "" and "MIH_NO_PYPI=1" in out and "installing" not in out,
          "MIH_NO_PYPI=1 makes no attempt and says so", out)

    # MIH_PYENV naming a directory the scripts did not make (a user's own venv, a project):
    # nothing in it is removed; the script stops, naming it and what to do.
    for name, files in (("project", ["thesis.txt"]), ("own-venv", ["pyvenv.cfg", "bin/python"])):
        theirs = os.path.join(a.work, name)
        for f in files:
            os.makedirs(os.path.dirname(os.path.join(theirs, f)), exist_ok=True)
            with open(os.path.join(theirs, f), "w") as fh:
                fh.write("not mih's\n")
        rc, chosen, out, _ = ensure(a.root, dict(offline, MIH_PYENV=theirs))
        kept = all(os.path.isfile(os.path.join(theirs, f)) for f in files)
        check(kept and rc != 0 and "installing" not in out and theirs in out and "not a venv these scripts made" in out,
              "MIH_PYENV at a directory the scripts did not make (%s): nothing removed, stops naming it (exit %d)"
              % (name, rc), out)
    print("%d failure(s)" % len(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
