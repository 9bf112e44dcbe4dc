#!/usr/bin/env python3
"""The transformers golden runs no code of the export's (ctest GoldenRunsNoExportCode, label
golden): an export is outside input, and a config.json whose `auto_map` names a Python file of
the export directory would have transformers import it with trust_remote_code. The producer's
`--impl transformers` must refuse such an export (exit 11) without importing the file, under a
model_type transformers lacks and under one it has (where it must use its own code), and load
nothing from a hub (HF_HUB_OFFLINE).

Exit status: 0 every check held; 1 otherwise."""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_kit as kit  # noqa: E402

# transformers copies a remote-code file into its modules cache before importing it: the
# marker's path is absolute, the export directory's.
EVIL = """import pathlib
pathlib.Path(%r).write_text("the export's code ran")
from transformers import PretrainedConfig, PreTrainedModel
class EvilConfig(PretrainedConfig):
    model_type = "evil_arch"
class EvilModel(PreTrainedModel):
    config_class = EvilConfig
"""


def hostile_copy(source, dst, model_type):
    """A copy of export `source` whose config.json maps the Auto classes to evil.py beside it."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(source, dst)
    path = os.path.join(dst, "config.json")
    config = kit.read_json(path)
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    if model_type:
        config["model_type"], config["architectures"] = model_type, ["EvilModel"]
    with open(path, "w") as f:
        json.dump(config, f)
    with open(os.path.join(dst, "evil.py"), "w") as f:
        f.write(EVIL % os.path.join(dst, "IMPORTED"))
    return dst


def main():
    a = kit.parse_args(__doc__)
    kit.run_under(a.python)
    kit.fresh_dir(a.work)
    producer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "golden", "mih_golden.py")
    source = os.path.join(a.work, "llama")
    rc, out = kit.mih(a.mih, "export", "--spec", "llama", "--dtype", "float64", "--out", source)
    kit.check(rc == 0, "mih export --spec llama --dtype float64", out)
    for model_type, expect in (("evil_arch", 11), (None, 0)):
        export = hostile_copy(source, os.path.join(a.work, "hostile-%s" % (model_type or "llama")), model_type)
        p = subprocess.run([a.python, producer, "--export", export, "--out", export + "-golden", "--impl", "transformers",
                            "--no-noise-twin"], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        ran = os.path.exists(os.path.join(export, "IMPORTED"))
        what = ("an unknown model_type whose auto_map names the export's own code is refused (exit 11)" if expect
                else "a llama config with an auto_map is computed by transformers' own Llama (exit 0)")
        kit.check(p.returncode == expect and not ran, what + ", and the export's evil.py is never imported",
                  "exit %d, imported: %s\n%s" % (p.returncode, ran, p.stdout + p.stderr))
    return kit.finish()


if __name__ == "__main__":
    sys.exit(main())
