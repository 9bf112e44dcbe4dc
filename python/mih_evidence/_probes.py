"""Probes of whole tensors computed from the ranks' pieces (collective): each piece's statistics
keyed by its global element indices, each element counted once (the copy at coordinate 0 of
every mesh axis that does not cut it), summed over the world in one all-reduce; min and max in
a second; the values of small tensors in a third. Nothing is gathered whole."""
import torch
import torch.distributed as dist

from . import _layout
from ._stats import LINEAR, PROJECTIONS, VALUES_UP_TO, from_linear, linear_fields, piece_statistics, sketch_signs


class Pieces:
    """Accumulates the pieces of named tensors, then reduces them over the ranks in one go."""

    def __init__(self):
        self.names = []
        self.linear = {}
        self.extrema = {}
        self.values = {}  # name -> [(index, values)] of the counted pieces of small tensors
        self.defined = {}
        self.total = {}  # name -> the whole tensor's elements (0: undefined on this rank)

    def add(self, name, x, index, total_numel, counts=True, signs=None):
        """Piece x (any dtype and device) holding global elements `index` of a tensor of
        `total_numel` elements (`signs`: their sketch_signs, when cached); `counts`: whether this
        rank's copy is the counted one."""
        self.add_missing(name)
        self.defined[name] += 1
        self.total[name] = total_numel
        if not counts:
            return
        x = x.detach().to(torch.float64).reshape(-1).cpu()
        s = piece_statistics(x, index, signs)
        self.linear[name] = [a + b for a, b in zip(self.linear[name], linear_fields(s))]
        if "max" in s:
            e = self.extrema[name]
            self.extrema[name] = [max(e[0], s["max"]), max(e[1], -s["min"])]
        if total_numel <= VALUES_UP_TO:
            self.values.setdefault(name, []).append((index, x))

    def add_missing(self, name):
        """Registers `name` (undefined on this rank until add): every rank holds every name."""
        if name not in self.linear:
            self.names.append(name)
            self.linear[name] = [0.0] * LINEAR
            self.extrema[name] = [float("-inf"), float("-inf")]
            self.defined[name] = 0
            self.total[name] = 0

    def reduce(self, sum_over):
        """{name: statistics} of the whole tensors; sum_over(list, op) reduces a float64 list
        over the world ("sum" or "max") and returns it. Every rank must hold the same names in
        the same order (every rank calls add or add_missing for every name)."""
        names = self.names
        flat = sum_over([v for n in names for v in self.linear[n]] + [float(self.defined[n]) for n in names], "sum")
        ext = sum_over([v for n in names for v in self.extrema[n]] + [float(self.total[n]) for n in names], "max")
        totals = {n: int(ext[2 * len(names) + i]) for i, n in enumerate(names)}
        small = [n for n in names if 0 < totals[n] <= VALUES_UP_TO]
        vals = sum_over(self._value_vector(small, totals), "sum") if small else []
        out, at = {}, 0
        for i, n in enumerate(names):
            s = from_linear(flat[i * LINEAR:(i + 1) * LINEAR])
            s["defined_ranks"] = int(round(flat[len(names) * LINEAR + i]))
            if ext[2 * i] != float("-inf"):
                s["max"], s["min"] = ext[2 * i], -ext[2 * i + 1]
            out[n] = s
        for n in small:
            chunk = vals[at:at + totals[n]]
            at += totals[n]
            if out[n]["numel"] == totals[n]:
                out[n]["values"] = [v if v == v and abs(v) != float("inf") else None for v in chunk]
        return out

    def _value_vector(self, small, totals):
        out = []
        for n in small:
            v = torch.zeros(totals[n], dtype=torch.float64)
            for index, x in self.values.get(n, []):
                v[index] = x
            out += v.tolist()
        return out


# A parameter's piece keeps its global element indices from step to step (and its gradient's are
# the same): their sketch signs are kept, up to this many elements in all (int8: 4 bytes each).
SIGNS_CACHED_UP_TO = 1 << 26
_signs = {}


def _cached_signs(t, bounds, index):
    key = (tuple(t.shape), tuple(bounds))
    if key not in _signs:
        if sum(s.shape[1] for s in _signs.values()) + index.numel() > SIGNS_CACHED_UP_TO:
            return None
        _signs[key] = sketch_signs(index)
    return _signs[key]


def parameter_piece(pieces, name, t, coords, where):
    """Adds tensor t (a parameter, its gradient, an optimizer state; a DTensor or a plain
    tensor replicated over the session's mesh) to `pieces` under `name`; None: undefined here."""
    if t is None:
        pieces.add_missing(name)
        return
    bounds = _layout.box(t, where)
    index = _layout.element_index(t.shape, bounds)
    counts = _layout.counted(t, coords, where)
    signs = _cached_signs(t, bounds, index) if counts else None
    pieces.add(name, _layout.local(t), index, t.numel(), counts, signs)


def sum_over_group(group, device, distributed):
    """A function reducing a float64 list over `group` ("sum" or "max") on `device` (the
    group's device: CUDA for NCCL), returning it as a list."""
    def reduce(values, op):
        if not (distributed and values):
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX, group=group)
        return t.cpu().tolist()
    return reduce


__all__ = ["Pieces", "parameter_piece", "sum_over_group", "PROJECTIONS"]
