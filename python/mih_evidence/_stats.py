"""Sharding-invariant statistics of tensors (mih's probes): sum, sum of squares, non-finite count,
element count, finite min and max, and a random-projection sketch keyed by the global element
index, so that the statistics of a tensor are the same however it is cut into pieces and
whichever writer computed them; and SHA-256 digests of a piece's bytes."""
import hashlib

import torch

VALUES_UP_TO = 64  # tensors of at most this many elements also record their values (float64)
PROJECTIONS = 4    # the sketch's random +-1 projections (mih's WatchlistOptions::projections)
_MASK = (1 << 31) - 1
# The linear fields of a piece's statistics, in the order they are summed over the ranks.
LINEAR = 4 + PROJECTIONS  # sum, sum_sq, nonfinite, numel, sketch[PROJECTIONS]


def projection_signs(index, j):
    """The +-1 sign of sketch projection j for global element indices `index` (int64): the hash
    mih's probes use (harness/parallel/activations.cpp projection_signs), so a tensor's sketch
    is the same whatever the sharding and whichever writer computed it."""
    h = ((index & _MASK) * 1540483477 + (j * 668265263 + 374761393)) & _MASK
    h = h ^ (h >> 15)
    h = (h * 739982445) & _MASK
    h = h ^ (h >> 13)
    return ((h & 1) * 2 - 1).to(torch.float64)


def tensor_statistics(x, first_index=0, total_numel=None, index=None):
    """Sharding-invariant statistics of x (any shape), whose element i is global element
    first_index + i (or index[i] when `index`, an int64 tensor of x.numel() global element
    indices, is given: rows of the global batch that are not contiguous): sum, sum_sq, min, max,
    nonfinite, numel, sketch; values when small and whole. Returns the partial statistics of
    this piece (add them over the pieces)."""
    x = x.detach().to(torch.float64).reshape(-1).cpu()
    if index is None:
        index = torch.arange(first_index, first_index + x.numel(), dtype=torch.int64)
    elif index.numel() != x.numel():
        raise ValueError(f"tensor_statistics: index has {index.numel()} elements, the tensor {x.numel()}")
    elif not bool((index == torch.arange(index.numel(), dtype=torch.int64)).all()):
        first_index = -1  # not the whole tensor in order: no values
    out = piece_statistics(x, index)
    if (total_numel if total_numel is not None else x.numel()) <= VALUES_UP_TO and first_index == 0:
        out["values"] = [v if v == v and abs(v) != float("inf") else None for v in x.tolist()]
    return out


def sketch_signs(index):
    """Every projection's signs of global elements `index` at once: [PROJECTIONS, n] int8."""
    j = torch.arange(PROJECTIONS, dtype=torch.int64).reshape(-1, 1)
    return projection_signs(index.reshape(1, -1), j).to(torch.int8)


def piece_statistics(x, index, signs=None):
    """The statistics of one piece: x (float64, flat, on the CPU) holds global elements `index`
    (int64, same length; or their sketch_signs, given). Returns {sum, sum_sq, nonfinite, numel,
    sketch[, min, max]}; min and max over the finite elements, absent when none is finite."""
    finite = torch.isfinite(x)
    xf = torch.where(finite, x, torch.zeros_like(x))
    signs = sketch_signs(index) if signs is None else signs
    sketch = (signs.to(torch.float64) @ xf.reshape(-1, 1)).reshape(-1).tolist()
    out = {"sum": float(xf.sum()), "sum_sq": float((xf * xf).sum()), "nonfinite": int((~finite).sum()),
           "numel": int(x.numel()), "sketch": sketch}
    if bool(finite.any()):
        out["min"] = float(x[finite].min())
        out["max"] = float(x[finite].max())
    return out


def linear_fields(s):
    """The linear fields of statistics `s` as a list of LINEAR floats (summed over the pieces)."""
    return [s["sum"], s["sum_sq"], s["nonfinite"], s["numel"]] + list(s["sketch"])


def from_linear(v):
    """Statistics from LINEAR summed floats (linear_fields' order)."""
    return {"sum": v[0], "sum_sq": v[1], "nonfinite": int(round(v[2])), "numel": int(round(v[3])),
            "sketch": list(v[4:4 + PROJECTIONS])}


def digest(t):
    """SHA-256 (hex) of a tensor's bytes in its own dtype (bfloat16 and float8 included), in
    row-major order; a DTensor's local piece."""
    t = getattr(t, "_local_tensor", t).detach().contiguous().reshape(-1).cpu()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()
