#!/usr/bin/env python3
"""The tests of mih against transformers name a --python without it (ctest
GoldenTestsNameAMissingTransformers, label golden): configured with a MIH_TRANSFORMERS_PYTHON
that cannot import torch and transformers (CMake warns and makes builtin goldens, but still
registers these tests), each test must stop at once, naming that Python and what to do, never
with a bare Python traceback. A venv without packages stands in for such a Python.

Exit status: 0 every check held; 1 otherwise."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_kit as kit  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = ("exports_load.py", "config_classes.py", "builtin_vs_transformers.py", "export_code.py",
           "float32_inside.py")


def main():
    a = kit.parse_args(__doc__)
    work = kit.fresh_dir(a.work)
    bare = os.path.join(work, "bare")
    p = subprocess.run([a.python, "-m", "venv", "--without-pip", bare], capture_output=True, text=True, timeout=120)
    kit.check(p.returncode == 0, "a venv without packages", p.stdout + p.stderr)
    python = os.path.join(bare, "bin", "python")
    for script in SCRIPTS:
        p = subprocess.run([python, os.path.join(HERE, script), "--python", python, "--mih", a.mih,
                            "--work", os.path.join(work, script)], capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL)
        out = p.stdout + p.stderr
        kit.check(p.returncode == 2 and "Traceback" not in out and python in out and
                  "cannot import torch and transformers" in out and "MIH_TRANSFORMERS_PYTHON" in out,
                  "%s under a Python without transformers stops naming it (exit %d)" % (script, p.returncode), out)
    return kit.finish()


if __name__ == "__main__":
    sys.exit(main())
