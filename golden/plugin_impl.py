# `--impl plugin --plugin FILE` of the golden producer: a porter's own implementation of an
# original mih ships no builtin for, written against the public mih_golden_api (its header says
# what a plug-in defines). Loaded from its file, checked for NAME, VERSION and forward, and run
# like the builtin: forward and backward in float64, then again with every contraction in two
# halves (the noise twin).
import hashlib
import importlib.util
import os
import traceback

from errors import GoldenError

REQUIRED = ("NAME", "VERSION", "forward")
# Names a plug-in cannot take: a golden must never pass for mih's own implementations.
RESERVED = ("builtin", "transformers")


def load(path):
    """The plug-in module at `path` and its description for golden.json: name, version, file
    and SHA-256. Raises GoldenError(11) naming the file and what is wrong with it."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise GoldenError(11, "--plugin %s: no such file; give the Python file of your golden plug-in "
                              "(docs/golden.md, \"Three ways to get a golden\")" % path)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    spec = importlib.util.spec_from_file_location("mih_golden_plugin", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:
        raise GoldenError(11, "--plugin %s could not be imported (a bug of the plug-in):\n%s"
                          % (path, traceback.format_exc().rstrip()))
    missing = [a for a in REQUIRED if not hasattr(module, a)]
    if missing:
        raise GoldenError(11, "--plugin %s does not define %s: a plug-in declares NAME = \"<name>\", VERSION = "
                              "\"<version>\" (recorded in golden.json) and def forward(config, weights, batch, ops) "
                              "(mih_golden_api.py says what each is)" % (path, " and ".join(missing)))
    for attr in ("NAME", "VERSION"):
        value = getattr(module, attr)
        if not isinstance(value, str) or not value.strip():
            raise GoldenError(11, "--plugin %s: %s must be a non-empty string, got %r" % (path, attr, value))
    if module.NAME.strip().lower() in RESERVED:
        raise GoldenError(11, "--plugin %s: NAME %r is mih's own implementation's; name the plug-in after what it "
                              "implements (e.g. \"mytoy\")" % (path, module.NAME))
    described = {"name": module.NAME, "version": module.VERSION, "plugin": os.path.basename(path),
                 "plugin_sha256": digest}
    return module, described


def forward(module, path, config, weights, batch, ops):
    """module.forward, its exceptions reported as the plug-in's (exit 11), its result checked:
    (logits, hidden_states, aux_loss or None)."""
    try:
        out = module.forward(config, weights, batch, ops)
    except GoldenError:
        raise
    except Exception:
        raise GoldenError(11, "the plug-in %s raised in forward (a bug of the plug-in):\n%s"
                          % (path, traceback.format_exc().rstrip()))
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise GoldenError(11, "the plug-in %s: forward must return (logits, hidden_states, aux_loss or None), got %s"
                          % (path, type(out).__name__))
    logits, hidden, aux = out
    if len(hidden) < 2:
        raise GoldenError(11, "the plug-in %s: forward returned %d hidden state(s); it returns the embeddings, each "
                              "decoder layer's output and the final norm's output" % (path, len(hidden)))
    return logits, list(hidden), aux
