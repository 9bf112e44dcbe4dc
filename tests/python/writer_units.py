#!/usr/bin/env python3
"""One process of the torch 2.x venv (gloo, world 1), run by tests/python/torch2_writer.py:
python/mih_evidence on what a 2-rank run does not show. Writes under --out and exits 1 naming
each failed check.

  bf16/      a bfloat16 Hugging Face Llama, one step (digests and statistics of bf16 tensors)
  mixed/     FSDP2 with MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), one step:
             the unit's policy recorded in check/fsdp_units.json
  refusals   a mesh whose dims are not mih's axes, a watch list naming no parameter, a hook out of
             the step's order, a step without record_batch: ValueError naming the fix
"""
import argparse
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import hf_trainer  # noqa: E402
import mih_evidence  # noqa: E402

FAILED = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        FAILED.append(what)


def one_step(out, case, model, mesh):
    optimizer = hf_trainer.adamw(model)
    ev = mih_evidence.Session(out, model, case=case, mesh=mesh, steps=1)
    ev.attach_optimizer(optimizer)
    hf_trainer.train_steps(model, optimizer, ev, mesh, range(1))
    ev.finish()
    with open(os.path.join(out, "check", "structure.json")) as f:
        return json.load(f)


def bf16(out):
    table = one_step(os.path.join(out, "bf16", "Reference"), "Reference", hf_trainer.build_model().bfloat16(), None)
    check(all(r["dtype"] == "bfloat16" for r in table["parameters"]), "bf16: every parameter recorded as bfloat16")


def mixed(out):
    model = hf_trainer.build_model().float()
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp_shard",))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    table = one_step(os.path.join(out, "mixed", "Reference"), "Reference", model, mesh)
    units = table.get("fsdp_units", {})
    policies = {u: v.get("mixed_precision", {}) for u, v in units.items()}
    check(len(units) == 3 and all(p.get("param_dtype") == "bfloat16" and p.get("reduce_dtype") == "float32"
                                  for p in policies.values()),
          f"mixed: 3 FSDP2 units, each recording param_dtype bfloat16 and reduce_dtype float32 ({policies})")


def hooks_in_order(out):
    model = hf_trainer.build_model()
    ev = mih_evidence.Session(os.path.join(out, "order", "Reference"), model, case="Reference", steps=1)
    ev.attach_optimizer(hf_trainer.adamw(model))
    x, y = hf_trainer.global_batch(0)
    refused("record_batch before begin_step", lambda: ev.record_batch(0, 0, 0, {"input_ids": x}),
            "call begin_step first", "/nonexistent")
    ev.begin_step(0)
    refused("a step without record_batch", lambda: ev.after_backward_before_clip(0), "recorded no micro-batch",
            "/nonexistent")


def refused(what, make, needle, out):
    try:
        make()
    except ValueError as e:
        check(needle in str(e) and not os.path.exists(out), f"refusals: {what}: ValueError naming {needle!r}")
        return
    check(False, f"refusals: {what}: no ValueError")


def refusals(out):
    model = hf_trainer.build_model()
    wrong = init_device_mesh("cpu", (1,), mesh_dim_names=("data",))
    target = os.path.join(out, "refused", "A")
    refused("a mesh dim named 'data'", lambda: mih_evidence.Session(target, model, case="A", mesh=wrong),
            "mesh_dim_names", target)
    refused("a watch list naming no parameter",
            lambda: mih_evidence.Session(target, model, case="A", watch=["model.nothing.weight"]),
            "not parameters of the model", target)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    bf16(a.out)
    mixed(a.out)
    refusals(a.out)
    hooks_in_order(a.out)
    dist.destroy_process_group()
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
