"""Every probed module's forward output and the gradient of the global loss with respect to it,
per step, in global coordinates: rows of the global batch (the micro-batch's recorded rows)
times the elements of a row, so that a split over data-parallel ranks and a DTensor cut over
tp (sequence parallelism's Shard(1)) give the 1-rank run's statistics.

An output that is a tuple, a list, a dict or a dataclass (a Hugging Face ModelOutput) is probed
through its first tensor. A plain tensor on a mesh with tp or cp > 1 may be a replica (every
rank of the group holds the same values) or a piece whose layout the writer cannot see (a
ColwiseParallel output with use_local_output): it is counted once where every rank of its
tp x cp group holds the same bytes (SHA-256), and is listed as `unplaced` in the stage's
probe row otherwise (NumericParity names it as not compared, never as a divergence)."""
import dataclasses
import hashlib

import torch

from . import _layout
from ._stats import LINEAR, from_linear, linear_fields, piece_statistics

SPLIT_AXES = ("tp", "cp")  # ranks along these hold the same rows: their copies are replicas or pieces


def first_tensor(output):
    """The tensor a module output is probed through, or None."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict):
        values = list(output.values())
    elif dataclasses.is_dataclass(output) and not isinstance(output, type):
        values = [getattr(output, f.name) for f in dataclasses.fields(output)]
    elif isinstance(output, (tuple, list)):
        values = list(output)
    else:
        return None
    return next((v for v in values if isinstance(v, torch.Tensor)), None)


class Accumulated:
    """One module's statistics in one stage over a step's micro-batches on this rank."""

    def __init__(self, dtensor, rowwise):
        self.linear = [0.0] * LINEAR
        self.dtensor = dtensor
        self.rowwise = rowwise  # dim 0 is the micro-batch's rows
        self.counts = True
        self.digest = hashlib.sha256()

    def add(self, piece, index, counts):
        x = piece.detach().to(torch.float64).reshape(-1).cpu()
        self.linear = [a + b for a, b in zip(self.linear, linear_fields(piece_statistics(x, index)))]
        self.counts = self.counts and counts
        if not self.dtensor:
            self.digest.update(x.numpy().tobytes())


class ModuleProbes:
    """Forward hooks on the probed modules of `model` (`names`: their FQNs in the model, None:
    every submodule), for a session whose mesh coordinates are `coords` ({axis: coordinate}) and
    sizes `sizes` ({axis: size}); is_training() says whether a forward is a training one."""

    def __init__(self, model, names, coords, sizes, is_training):
        self.coords = coords
        self.split = any(sizes.get(a, 1) > 1 for a in SPLIT_AXES)
        self.is_training = is_training
        self.row_index = None
        self.order = []
        self.stages = {"forward_output": {}, "output_grad": {}}
        wanted = None if names is None else set(names)
        for name, module in model.named_modules():
            if name and (wanted is None or name in wanted):
                module.register_forward_hook(self._forward_hook(name))

    def clear(self):
        self.stages = {"forward_output": {}, "output_grad": {}}

    def _forward_hook(self, name):
        def hook(module, inputs, output):
            t = first_tensor(output)
            if t is None or not self.is_training() or not torch.is_grad_enabled():
                return
            if name not in self.order:
                self.order.append(name)  # the order forwards complete in: a module after its children
            rows = self.row_index
            self._add("forward_output", name, t, rows)
            if t.requires_grad:
                t.register_hook(lambda g: self._add("output_grad", name, g, rows))
        return hook

    def _add(self, stage, name, t, rows):
        where = f"the output of module '{name}'"
        dtensor = _layout.is_dtensor(t)
        if dtensor and any(p.is_partial() for p in t.placements):
            return self._unplace(stage, name)
        rowwise = rows is not None and t.dim() > 0 and t.shape[0] == rows.numel()
        acc = self.stages[stage].setdefault(name, Accumulated(dtensor, rowwise))
        bounds = _layout.box(t, where)
        if rowwise:
            index = self._index(t.shape, bounds, rows)
            coords = {a: c for a, c in self.coords.items() if a not in _layout.DATA_AXES}
        else:  # not per row (rotary tables): one tensor, the same on every rank or unplaced
            index = _layout.element_index(t.shape, bounds)
            coords = self.coords
        acc.add(_layout.local(t), index, _layout.counted(t, coords, where))

    def _unplace(self, stage, name):
        acc = self.stages[stage].setdefault(name, Accumulated(True, True))
        acc.counts = None  # a pending reduction: no placement of its values

    @staticmethod
    def _index(shape, bounds, rows):
        """Global element indices of the piece `bounds` of an output of `shape` [b, ...] whose
        b rows are global rows `rows`: row g's elements are g * per_row + [0, per_row)."""
        per_row = 1
        for n in shape[1:]:
            per_row *= n
        within = _layout.element_index(shape[1:], bounds[1:]) if len(shape) > 1 else torch.zeros(1, dtype=torch.int64)
        first, end = bounds[0]
        return (rows[first:end].reshape(-1, 1) * per_row + within.reshape(1, -1)).reshape(-1)

    def reduce(self, stage, gather, sum_over):
        """(order, {name: statistics}, unplaced) of `stage` over every rank (collective):
        gather(obj) -> every rank's obj; sum_over(list, "sum") sums a float list."""
        table = self.stages[stage]
        mine = {n: (table[n].counts is None, table[n].dtensor, table[n].digest.hexdigest(), table[n].rowwise)
                for n in self.order if n in table}
        every = gather(mine)
        # Every module some rank saw (a data-dependent branch, an expert without tokens on one
        # rank: the others' rows are all its rows), in rank 0's order, then the others'.
        names = []
        for r in every:
            names += [n for n in r if n not in names]
        unplaced = [n for n in names if not self._placeable(n, every)]
        flat = []
        for n in names:
            keep = n in table and n not in unplaced and self._counts(n, table[n])
            flat += table[n].linear if keep else [0.0] * LINEAR
        flat = sum_over(flat, "sum")
        placed = [n for n in names if n not in unplaced]
        out = {n: from_linear(flat[i * LINEAR:(i + 1) * LINEAR]) for i, n in enumerate(names) if n in placed}
        return placed, out, unplaced

    def _placeable(self, name, every):
        seen = [r[name] for r in every if name in r]
        if any(s[0] for s in seen):
            return False  # a pending reduction
        if seen[0][1]:
            return True  # a DTensor: its placements place it
        if not seen[0][3]:  # not per row: the same bytes on every rank
            return len(seen) == len(every) and len({s[2] for s in seen}) == 1
        return not self.split or self._replicas_agree(name, every)

    def _replicas_agree(self, name, every):
        """Whether the ranks of each tp x cp group (same data coordinates) that saw the module
        hold equal bytes."""
        groups = {}
        for rank, r in enumerate(every):
            if name not in r:
                continue
            key = tuple(self._all_coords[rank][a] for a in _layout.DATA_AXES if a in self._all_coords[rank])
            groups.setdefault(key, set()).add(r[name][2])
        return all(len(d) == 1 for d in groups.values())

    def _counts(self, name, acc):
        if acc.dtensor:
            return acc.counts
        axes = SPLIT_AXES if acc.rowwise else self.coords
        return all(self.coords.get(a, 0) == 0 for a in axes)

    def set_all_coords(self, all_coords):
        """Every rank's mesh coordinates ({axis: coordinate} by world rank)."""
        self._all_coords = all_coords


__all__ = ["ModuleProbes", "first_tensor", "from_linear"]
