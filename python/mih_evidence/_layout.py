"""Where a rank's piece lies in its global tensor: DTensor placements (FSDP2's Shard(0) over
dp_shard, HSDP's Replicate() over dp_replicate, tensor parallelism's Shard/Replicate over tp,
FSDP x TP's strided shard) read per mesh axis, the piece's box in global coordinates, its global
element indices, and whether this rank's copy is the one counted (each element counted once).

A mesh axis is named by the DeviceMesh's dim names, which must be mih's axis names (pp,
dp_replicate, dp_shard, cp, tp, ep). A cut follows torch.chunk (ceil(n / size) elements per
chunk, the last ones shorter or empty), as DTensor's Shard and FSDP2's dim-0 sharding do."""
import torch

AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep")
DATA_AXES = ("dp_replicate", "dp_shard")  # ranks along these see different rows

try:  # torch >= 2.4 (torch 2.0-2.3 had it under torch.distributed._tensor)
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # pragma: no cover - torch 1.13: no DTensor parameters exist
    try:
        from torch.distributed._tensor import DTensor, Replicate, Shard
    except ImportError:
        DTensor = Replicate = Shard = None


def is_dtensor(t):
    return DTensor is not None and isinstance(t, DTensor)


def local(t):
    """The rank's piece of t (a DTensor's local tensor; t itself otherwise)."""
    return t.to_local() if is_dtensor(t) else t


def settled(t):
    """t with every pending reduction done (a DTensor gradient that is Partial() over tp, as pure
    tensor parallelism leaves a replicated parameter's gradient until the optimizer reads it,
    redistributed to Replicate(): collective over that axis); t itself otherwise."""
    if not is_dtensor(t) or not any(p.is_partial() for p in t.placements):
        return t
    return t.redistribute(t.device_mesh, [Replicate() if p.is_partial() else p for p in t.placements])


def _cuts(t, where):
    """The cuts of DTensor t as (axis, dim, size, coordinate), in the order they apply: a
    strided shard (FSDP over a dim tensor parallelism cut first) after the plain ones."""
    mesh = t.device_mesh
    names = mesh.mesh_dim_names
    if names is None or any(n not in AXES for n in names):
        raise ValueError(f"mih_evidence: {where} is a DTensor on a mesh whose dims are named {names}: name them "
                         f"with mih's axes {AXES} (init_device_mesh(..., mesh_dim_names=('dp_shard', 'tp')))")
    coord = mesh.get_coordinate()
    plain, strided = [], []
    for i, p in enumerate(t.placements):
        if p.is_replicate():
            continue
        if not p.is_shard():
            raise ValueError(f"mih_evidence: {where} has placement {p} over '{names[i]}' (a pending reduction): "
                             f"record it after the reduction, when it is Shard or Replicate")
        dim = p.dim if p.dim >= 0 else p.dim + t.dim()
        (strided if type(p).__name__ == "_StridedShard" else plain).append((names[i], dim, mesh.size(i), coord[i]))
    return plain + strided


def placements(t, mesh_axes, where):
    """{axis: "Shard(<dim>)" | "Replicate()"} for every axis of `mesh_axes` (the session's
    mesh: {axis: size}) of size > 1, in the order the cuts apply (dict order)."""
    out = {}
    if is_dtensor(t):
        for axis, dim, _, _ in _cuts(t, where):
            out[axis] = f"Shard({dim})"
    for axis, size in mesh_axes.items():
        if size > 1 and axis not in out:
            out[axis] = "Replicate()"
    return out


def box(t, where):
    """The piece of global tensor t this rank holds: [(start, end)] per dim, elements."""
    bounds = [(0, n) for n in t.shape]
    if is_dtensor(t):
        for _, dim, size, coord in _cuts(t, where):
            start, end = bounds[dim]
            chunk = -(-(end - start) // size)
            bounds[dim] = (start + min(coord * chunk, end - start), start + min((coord + 1) * chunk, end - start))
    return bounds


def box_text(bounds):
    """mih's box notation "[0:4, 8:16]"; "" for a piece without elements."""
    if any(e <= s for s, e in bounds) and bounds:
        return ""
    return "[" + ", ".join(f"{s}:{e}" for s, e in bounds) + "]"


def element_index(shape, bounds):
    """The global element index (row-major over `shape`) of every element of the piece `bounds`,
    as a flat int64 tensor in the piece's own row-major order."""
    index = torch.zeros((), dtype=torch.int64)
    stride = 1
    strides = []
    for n in reversed(list(shape)):
        strides.append(stride)
        stride *= n
    strides.reverse()
    for (s, e), st in zip(bounds, strides):
        index = index.unsqueeze(-1) + torch.arange(s, e, dtype=torch.int64) * st
    return index.reshape(-1)


def counted(t, coords, where):
    """Whether this rank's copy of t is the one counted: its coordinate 0 along every axis of
    the session's mesh (`coords`: {axis: coordinate}) that does not cut t."""
    cut = {axis for axis, _, _, _ in _cuts(t, where)} if is_dtensor(t) else set()
    return all(c == 0 for axis, c in coords.items() if axis not in cut)
