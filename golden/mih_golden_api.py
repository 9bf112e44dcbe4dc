# The public API of the golden producer's plug-ins (docs/golden.md, "Three ways to get a
# golden"): what a porter's own Python file uses to compute the ORIGINAL of an architecture
# mih ships no builtin for, without importing anything private. A plug-in is a file that
# defines
#   NAME = "mytoy"            the implementation's name, recorded in golden.json (never
#                             "builtin" or "transformers")
#   VERSION = "1"             its version, recorded beside it (with the file's SHA-256)
#   DEFAULTS = {...}          optional: the original's default of each config field it reads,
#                             used where config.json leaves one out (recorded as defaulted)
#   def forward(config, weights, batch, ops):
#       -> (logits [B, S, V], hidden_states, aux_loss or None)
# hidden_states: num_hidden_layers + 2 tensors [B, S, H] (the embeddings, each decoder layer's
# output, the final norm's output: Hugging Face's output_hidden_states with the last one after
# the norm); aux_loss: the weighted auxiliary loss added to the cross entropy (a router's), or
# None. `config` is a Config, `weights` a Weights (take() every tensor the architecture reads:
# one left unread, or a missing one, is refused naming the key), `batch` a dict of int64
# tensors input_ids, labels, position_ids [, attention_mask], `ops` an Ops (use its linear,
# matmul and mean_last for every contraction: the producer runs the plug-in twice, the second
# time with each contraction summed in two halves, and calibrates the tolerances from the
# difference). Everything is float64. Run it with
#   mih golden --spec NAME --out DIR --plugin FILE
#   python3 mih_golden.py --export DIR --out DIR --impl plugin --plugin FILE
#   mih_add_golden(<target> COMMAND ... SPEC ... OUT ... PRODUCER FILE)   (CMake)
import torch.nn.functional as F

import builtin_models
from errors import GoldenError

# The weights and the reductions: the builtin's own (their docstrings say what they do).
Weights = builtin_models.Weights
Ops = builtin_models.Ops
activation = builtin_models.activation

__all__ = ["GoldenError", "Config", "Weights", "Ops", "activation", "embedding", "rms_norm", "layer_norm",
           "causal_mask", "rotary", "apply_rotary", "attention", "swiglu"]


class Config:
    """config.json's fields, config["name"]; a field config.json leaves out (or sets to null)
    takes `defaults`' value and is recorded in golden.json's defaulted_config_fields. A field in
    neither is refused (exit 11) naming it."""

    def __init__(self, raw, defaults=None):
        self.raw = raw
        self.model_type = raw.get("model_type")
        self.defaults = dict(defaults or {})
        self.defaulted = {}

    def __getitem__(self, name):
        if name in self.raw and self.raw[name] is not None:
            return self.raw[name]
        if name not in self.defaults:
            raise GoldenError(11, "config.json has no '%s' and the plug-in's DEFAULTS give none: declare it in the "
                                  "spec's checkpoint.hf fields, or add the original's default to DEFAULTS" % name)
        if name not in self.raw:
            self.defaulted[name] = self.defaults[name]
        return self.defaults[name]

    def get(self, name, default=None):
        return self[name] if name in self.raw or name in self.defaults else default


def embedding(ids, table):
    """table[ids]: [B, S] int64, [V, H] -> [B, S, H]."""
    return F.embedding(ids, table)


def rms_norm(ops, x, weight, eps):
    """weight * x / sqrt(mean(x^2) + eps) over the last dim (Llama's RMSNorm)."""
    return builtin_models._rms_norm(ops, x, weight, eps)


def layer_norm(ops, x, weight, bias, eps):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dim, the biased variance."""
    return builtin_models._layer_norm(ops, x, weight, bias, eps)


def causal_mask(batch, dtype):
    """The additive [B, 1, S, S] mask: 0 where query t may attend key j (j <= t, and the key
    not padding by batch["attention_mask"]), the dtype's lowest value elsewhere."""
    return builtin_models._causal_mask(batch, dtype)


def rotary(head_dim, positions, theta, dtype):
    """cos, sin [B, 1, S, D] of rotary position embeddings over halves (Hugging Face's layout):
    inv_freq_i = theta^(-2i / D), angles position * inv_freq duplicated over the two halves."""
    return builtin_models._rotary({"rope_scaling": None, "rope_theta": theta}, head_dim, positions, dtype)


def apply_rotary(x, cos, sin):
    """x * cos + rotate_half(x) * sin, rotate_half([x1, x2]) = [-x2, x1]; x [B, heads, S, D]."""
    return builtin_models._rotate(x, cos, sin)


def attention(ops, q, k, v, mask, scale):
    """softmax(q k^T * scale + mask) v; q [B, Hq, S, D], k and v [B, Hkv, S, D] repeated to the
    query heads (grouped-query attention: key/value head j serves query heads j * g ...
    (j + 1) * g - 1, transformers' repeat_kv). -> [B, Hq, S, D]."""
    return builtin_models._attention(ops, q, k, v, mask, scale)


def swiglu(ops, x, gate, up, down, act="silu"):
    """down(act(x gate^T) * (x up^T)) (Shazeer 2020); act a name of activation()."""
    return builtin_models._swiglu(ops, x, gate, up, down, activation(act) if isinstance(act, str) else act)
