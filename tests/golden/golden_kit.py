# What the tests of mih against Hugging Face transformers (tests/golden/*.py, ctest label
# `golden`) share: their arguments, running under the transformers Python they are given, the
# `mih` command (the registered specs, an export of each), which architectures transformers
# loads as a causal LM, and the pass/fail record.
import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from outcomes import FAILURES, check  # noqa: E402,F401  (the drivers' shared record)

# Specs whose export names an architecture transformers has but mih's layout does not fit,
# with the reason; the tests load them and require that they still do NOT load whole (a spec
# that starts to load must be moved out of here and compared like the others). None now: the
# vlm became transformers' LlavaForConditionalGeneration with a CLIP tower (issue 54).
KNOWN_NON_LOADING = {}


def finish():
    if FAILURES:
        print("\n%d check(s) failed:\n  %s" % (len(FAILURES), "\n  ".join(FAILURES)))
        return 1
    print("\nevery check held")
    return 0


def parse_args(doc):
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--python", required=True, help="a Python with torch 2.x and transformers (MIH_TRANSFORMERS_PYTHON)")
    ap.add_argument("--mih", required=True, help="the mih command")
    ap.add_argument("--work", required=True, help="scratch directory (emptied)")
    return ap.parse_args()


def run_under(python):
    """Re-executes this script under `python` unless it already runs there (ctest may start it
    with any Python); exits 2 when that Python is missing or cannot import torch and
    transformers."""
    if os.path.abspath(sys.executable) == os.path.abspath(python):
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as e:
            print("--python %s cannot import torch and transformers (%s): MIH_TRANSFORMERS_PYTHON must name a Python "
                  "with both (scripts/test installs the pinned venv and passes it); configure with "
                  "-DMIH_TRANSFORMERS_PYTHON= to build without these tests" % (python, e))
            sys.exit(2)
        return
    if not os.access(python, os.X_OK):
        print("--python %s: no such executable; pass the Python with transformers (MIH_TRANSFORMERS_PYTHON)" % python)
        sys.exit(2)
    os.execv(python, [python] + sys.argv)


def fresh_dir(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def mih(binary, *args, timeout=300):
    p = subprocess.run([binary, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def specs(binary):
    """The specs `mih list` registers, in its order."""
    rc, out = mih(binary, "list")
    if rc != 0:
        raise SystemExit("mih list failed (exit %d): %s" % (rc, out))
    names, inside = [], False
    for line in out.splitlines():
        if line.strip() in ("specs:", "presets:"):
            inside = line.strip() == "specs:"
        elif inside and line.startswith("  ") and line.strip():
            names.append(line.split()[0])
    return names


def export(binary, spec, out, *extra):
    """`mih export --spec SPEC --out OUT [extra]`; the directory, or None (the failure checked)."""
    shutil.rmtree(out, ignore_errors=True)
    rc, text = mih(binary, "export", "--spec", spec, "--out", out, *extra)
    check(rc == 0, "mih export --spec %s %s" % (spec, " ".join(extra)), text)
    return out if rc == 0 else None


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def architecture(export_dir):
    archs = read_json(os.path.join(export_dir, "config.json")).get("architectures") or [None]
    return archs[0]


def causal_lm_classes():
    """The class names transformers' AutoModelForCausalLM builds."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def model_classes():
    """The class names transformers defines as models: the causal LMs, and the others an
    export may name (LLaVA's LlavaForConditionalGeneration, an image-text-to-text model)."""
    import transformers

    names = set(causal_lm_classes())
    for name in dir(transformers):
        if name.endswith("ForConditionalGeneration"):
            cls = getattr(transformers, name, None)
            if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
                names.add(name)
    return names


def classify(binary, work, dtype_args=()):
    """Exports every registered spec into work/<spec> and sorts them: ([(spec, dir)] whose
    architecture transformers loads (a causal LM, or another model class it defines), [(spec, dir, architecture, reason)] known
    not to load, [(spec, architecture)] neither (a failure: the test must be told which)."""
    loadable, known, unknown = [], [], []
    classes = model_classes()
    for spec in specs(binary):
        out = export(binary, spec, os.path.join(work, spec), *dtype_args)
        if out is None:
            continue
        arch = architecture(out)
        if arch in classes:
            loadable.append((spec, out))
        elif arch in KNOWN_NON_LOADING:
            known.append((spec, out, arch, KNOWN_NON_LOADING[arch]))
        else:
            unknown.append((spec, arch))
    check(not unknown, "every spec's export names a transformers model class or a known non-loading one",
          "; ".join("%s: %s" % u for u in unknown))
    return loadable, known


def fields_read_by(modeling_file):
    """Config fields a modeling file reads with getattr(config, "x", ...) or tests with
    hasattr(config, "x"): what it computes with although its config class need not define it."""
    import re

    with open(modeling_file, encoding="utf-8") as f:
        return set(re.findall(r'(?:getattr|hasattr)\(\s*(?:self\.)?config\s*,\s*"(\w+)"', f.read()))
