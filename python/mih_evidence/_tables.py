"""The tables a session writes once the model is parallelized and its optimizer built: the
parameter table with placements per mesh axis (check/structure.json), the FSDP2 units with
their mixed-precision policy, and the optimizer's parameter groups
(check/optimizer_layout_initial.json); and the per-step records of the optimizer's state."""
import torch

from . import _layout

MOMENTS = ("exp_avg", "exp_avg_sq")  # Adam's and AdamW's state tensors CheckpointRoundTrip hashes


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def fsdp_units(model):
    """{module FQN ("" for the root): the FSDP2 module} for every module fully_shard was
    applied to; empty under torch < 2.6 or without FSDP2."""
    if int(torch.__version__.split(".")[0]) < 2:
        return {}  # torch 1.13's FSDP is not FSDP2 (and does not import on Python 3.11)
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch 2.0-2.5: FSDP2 lived under torch.distributed._composable.fsdp
        try:
            from torch.distributed._composable.fsdp import FSDPModule
        except ImportError:
            return {}
    return {name: m for name, m in model.named_modules() if isinstance(m, FSDPModule)}


def unit_of(fqn, units):
    """The innermost FSDP2 unit holding parameter `fqn` ("" = the root), or None."""
    best = None
    for name in units:
        if name == "" or fqn.startswith(name + "."):
            if best is None or len(name) > len(best):
                best = name
    return best


def mixed_precision(unit):
    """An FSDP2 unit's MixedPrecisionPolicy as {param_dtype, reduce_dtype, output_dtype}
    (None: the parameter's own dtype)."""
    state = unit._get_fsdp_state() if hasattr(unit, "_get_fsdp_state") else None
    policy = getattr(state, "_mp_policy", None)
    if policy is None:
        return {}
    return {k: (dtype_name(getattr(policy, k)) if getattr(policy, k, None) is not None else None)
            for k in ("param_dtype", "reduce_dtype", "output_dtype")}


def parameter_rows(params, sizes, grad_domain, units):
    """check/structure.json's parameter rows: rank 0's piece of every parameter (its box, shape
    and placements per axis), its gradient's domain and its FSDP2 unit."""
    rows = []
    for fqn, p in params:
        where = f"parameter '{fqn}'"
        bounds = _layout.box(p, where)
        row = {"fqn": fqn, "global_shape": list(p.shape), "local_shape": [e - s for s, e in bounds],
               "local_offset": [s for s, _ in bounds], "dtype": dtype_name(p.dtype),
               "requires_grad": bool(p.requires_grad), "placements": _layout.placements(p, sizes, where),
               "gradient_kind": "DENSE", "grad_domain": grad_domain(fqn, p)}
        unit = unit_of(fqn, units)
        if unit is not None:
            row["fsdp_unit"] = unit or "root"
        rows.append(row)
    return rows


def unit_table(rows, units, sizes):
    """check/structure.json's fsdp_units: per unit its FSDP-sharded parameters, their
    "<dtype>@<mesh>/DENSE" signatures and its mixed-precision policy."""
    out = {}
    for name, module in units.items():
        out[name or "root"] = {"parameters": [], "dtypes": [], "mixed_precision": mixed_precision(module)}
    for row in rows:
        unit = row.get("fsdp_unit")
        if unit is None or not row["placements"].get("dp_shard", "").startswith("Shard"):
            continue
        signature = f"{row['dtype']}@dp_shard={sizes.get('dp_shard', 1)}/DENSE"
        out[unit]["parameters"].append(row["fqn"])
        if signature not in out[unit]["dtypes"]:
            out[unit]["dtypes"].append(signature)
    return out


def optimizer_groups(optimizer, names):
    """The optimizer's parameter groups: index, lr, weight_decay and the FQNs of its tensors
    (`names`: id(parameter) -> FQN; "<not a live parameter [shape]>" for another tensor)."""
    groups = []
    for i, g in enumerate(optimizer.param_groups):
        groups.append({"index": i, "lr": float(g.get("lr", 0.0)), "weight_decay": float(g.get("weight_decay", 0.0)),
                       "parameters": [names.get(id(p), f"<not a live parameter {list(p.shape)}>")
                                      for p in g["params"]]})
    return groups


def state_shapes(optimizer, params):
    """{fqn: {state name: this rank's local shape}} of the optimizer's tensor state (a
    ZeroRedundancyOptimizer's: its local optimizer's, this rank's partition)."""
    out = {}
    states = optimizer.optim.state if type(optimizer).__name__ == "ZeroRedundancyOptimizer" else optimizer.state
    for fqn, p in params:
        state = states.get(p, {})
        shapes = {k: list(_layout.local(v).shape) for k, v in state.items()
                  if isinstance(v, torch.Tensor) and v.dim() > 0}
        if shapes:
            out[fqn] = shapes
    return out

