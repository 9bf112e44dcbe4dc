"""The collectives a step ran, ledgered per mesh axis: a TorchDispatchMode (torch 2.x) that sees
every c10d op (FSDP2's all-gather and reduce-scatter, HSDP's all-reduce, DDP's buckets) and
every functional collective (DTensor's redistributions: tensor and sequence parallelism) on
this rank, and adds its input payload in bytes to the axis of its process group.

Only while a step runs (Session.begin_step to end_step); a collective on a group of no mesh
axis (the session's own, the world's) is ledgered under "world"."""
try:
    from torch.utils._python_dispatch import TorchDispatchMode
except ImportError:  # pragma: no cover - torch 1.13 has it too; older has no dispatch modes
    TorchDispatchMode = object

import torch
import torch.distributed as dist

# op name -> (kind, the argument holding the input payload)
_OPS = {
    "c10d.allreduce_": ("all_reduce", 0), "c10d.allreduce_coalesced_": ("all_reduce", 0),
    "c10d.reduce_scatter_": ("reduce_scatter", 1), "c10d._reduce_scatter_base_": ("reduce_scatter", 1),
    "c10d.allgather_": ("all_gather", 1), "c10d._allgather_base_": ("all_gather", 1),
    "c10d.allgather_into_tensor_coalesced_": ("all_gather", 1), "c10d.broadcast_": ("broadcast", 0),
    "c10d.alltoall_base_": ("all_to_all", 1), "c10d.alltoall_": ("all_to_all", 1),
    "_c10d_functional.all_reduce": ("all_reduce", 0), "_c10d_functional.all_reduce_coalesced": ("all_reduce", 0),
    "_c10d_functional.reduce_scatter_tensor": ("reduce_scatter", 0),
    "_c10d_functional.reduce_scatter_tensor_coalesced": ("reduce_scatter", 0),
    "_c10d_functional.all_gather_into_tensor": ("all_gather", 0),
    "_c10d_functional.all_gather_into_tensor_coalesced": ("all_gather", 0),
    "_c10d_functional.all_to_all_single": ("all_to_all", 0), "_c10d_functional.broadcast": ("broadcast", 0),
}


def _bytes(value):
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 0


def _group(value):
    """The process group an op argument is (a group object, or a group's name), or None."""
    if isinstance(value, str):
        try:
            from torch.distributed.distributed_c10d import _resolve_process_group
            return _resolve_process_group(value)
        except (ImportError, RuntimeError, ValueError, KeyError):  # a string that names no group
            return None
    if isinstance(value, torch.ScriptObject):
        try:
            return dist.ProcessGroup.unbox(value)
        except (RuntimeError, AttributeError):  # a ReduceOp, an options object
            return None
    return value if isinstance(value, dist.ProcessGroup) else None


def _ranks(group):
    try:
        return frozenset(dist.get_process_group_ranks(group))
    except (RuntimeError, ValueError):
        return None


class CommLedger(TorchDispatchMode):
    """Bytes per axis and call site ("c10d.reduce_scatter") of the collectives this rank runs
    while it is entered. axes: {process group: mesh axis}, the mesh's groups. A collective on
    another group of the same ranks is that axis's: DTensor keeps the groups of the first mesh
    equal to this one (the same ranks and dim names) and redistributes over them."""

    def __init__(self, axes):
        super().__init__()
        self.by_ranks = {_ranks(g): axis for g, axis in axes.items()}
        self.axes = {}  # group name -> axis (or "world"), resolved once per group
        self.sites = {}  # axis -> {site: bytes}
        self.paused = 0  # > 0 while the session runs collectives of its own
        self.known = {}  # op overload -> its _OPS entry or None (resolved once per op)

    def quiet(self):
        """A context in which nothing is ledgered (the session's own collectives)."""
        ledger = self

        class _Quiet:
            def __enter__(self):
                ledger.paused += 1

            def __exit__(self, *exc):
                ledger.paused -= 1
        return _Quiet()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        entry = self.known.get(func, False)
        if entry is False:
            name = f"{func.namespace}.{func._opname}" if hasattr(func, "_opname") else str(func).rsplit(".", 1)[0]
            entry = self.known[func] = _OPS.get(name)
        if entry is not None and not self.paused:
            kind, at = entry
            axis = "world"
            for value in list(args) + list(kwargs.values()):
                group = _group(value)
                if group is not None:
                    axis = self._axis(group)
                    break
            payload = _bytes(args[at]) if at < len(args) else 0
            site = f"{func.namespace.lstrip('_')}.{kind}"
            per_axis = self.sites.setdefault(axis, {})
            per_axis[site] = per_axis.get(site, 0) + payload
        return func(*args, **kwargs)

    def _axis(self, group):
        name = group.group_name
        if name not in self.axes:
            self.axes[name] = self.by_ranks.get(_ranks(group), "world")
        return self.axes[name]

    def reducing_bytes(self):
        """{axis: bytes} of the reducing collectives (all-reduce, reduce-scatter)."""
        return {axis: sum(b for site, b in sites.items() if site.endswith(("all_reduce", "reduce_scatter")))
                for axis, sites in self.sites.items()}
