#!/usr/bin/env python3
"""A plain torch 2.x training loop of a Hugging Face transformers model (LlamaForCausalLM built
from a tiny config: float64 on the CPU, random init, no hub), parallelized the way torch 2.x
trainers do it (FSDP2's fully_shard, HSDP on a 2-D mesh, DTensor tensor parallelism with
sequence parallelism via parallelize_module, FSDP x TP, a torch.distributed.checkpoint save and a
resharding load), on gloo. Run by tests/python/torch2_writer.py under torchrun; it calls
python/mih_evidence's hooks (marked `ev.`) and writes each case's evidence under --root.

Every case trains 3 steps of AdamW on a global batch of 8 rows of 16 tokens whose label mask is
uneven (row r masks its first (3 r) mod 7 targets), so the data-parallel ranks hold different
numbers of valid targets; each rank's loss is its targets' summed loss over the global count
times the data-parallel size (FSDP2 averages the ranks' gradients).

--cases runs several cases in one process, one after the other, each `<case>` of hf_llama or
`hf_qwen3:<case>` of the tiny Qwen3 (per-head q_norm and k_norm). Cases (the mesh they need):
  Reference      1 rank, no parallelism
  DpShard2       dp_shard 2: fully_shard per decoder layer and the root
  Hsdp           dp_replicate 2 x dp_shard 2: fully_shard on the 2-D mesh
  Tp2Sp          tp 2: ColwiseParallel / RowwiseParallel, SequenceParallel norms
  DpShard2Tp2    dp_shard 2 x tp 2: the tp plan, then fully_shard over dp_shard
  DcpResume      saved by torch.distributed.checkpoint at dp_shard 2 after step 1 (before_save/),
                 loaded at tp 2 and trained at step 2
  DpShard2Tp2Resume  saved at dp_shard 4, loaded at dp_shard 2 x tp 2 (FSDP x TP) and trained on
Planted bugs (each a case of its own):
  BugPerRankMean   DpShard2, each rank's loss averaged over its own valid targets
  BugUnsharded     DpShard2, fully_shard on the decoder layers only: the embedding, the final
                   norm and the head stay plain tensors whose gradients are never reduced
  BugSpNorm        Tp2Sp, the final norm left out of the sequence-parallel plan: it runs on its
                   rank's tokens with a plain weight whose gradient is never reduced over tp
  BugDcpNoOptim    DcpResume, the load restores the model but not the optimizer's state
  BugDecayNorms    DpShard2Tp2, AdamW with weight decay on every parameter, norm scales too
  BugSameRows      DpShard2, both data-parallel ranks read the first half of the global batch
  BugTorchClip     hf_qwen3 Tp2Sp, torch.nn.utils.clip_grad_norm_ on the DTensor gradients: where it
                   clips (step 2) its coefficient's epsilon is sqrt(2) x 1e-6, not 1e-6
  BugTpUntied      hf_llama_tied Tp2Sp, the tp plan shards the embedding the head shares (tied) and
                   the trainer does not tie them again: each trains its own copy
  BugQkNorm        hf_qwen3 Tp2Sp, q_norm and k_norm left out of the tp plan: plain weights that each
                   normalize this rank's heads, whose gradients are never summed over tp
  BugPartialNorm   Tp2Sp, the norms' Partial() gradients clipped unreduced: clip_grad_norm_ of
                   torch 2.8 then reports (and clips by) a global norm 7.7e-5 off
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_model_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, os.environ.get("MIH_PYTHON_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "python")))
import mih_evidence  # noqa: E402

ROWS, SEQ, STEPS, SAVE_AFTER, LR = 8, 16, 3, 1, 1e-2
SPEC = "hf_llama"
MESHES = {"Reference": {}, "DpShard2": {"dp_shard": 2}, "Hsdp": {"dp_replicate": 2, "dp_shard": 2},
          "Tp2Sp": {"tp": 2}, "DpShard2Tp2": {"dp_shard": 2, "tp": 2},
          "BugPerRankMean": {"dp_shard": 2}, "BugUnsharded": {"dp_shard": 2}, "BugSpNorm": {"tp": 2},
          "BugPartialNorm": {"tp": 2}, "BugDecayNorms": {"dp_shard": 2, "tp": 2}, "BugSameRows": {"dp_shard": 2},
          "BugQkNorm": {"tp": 2}, "BugTorchClip": {"tp": 2}, "BugTpUntied": {"tp": 2}}
# case -> (the save's mesh, the load's mesh, whether the load drops the optimizer's state)
RESUMES = {"DcpResume": ({"dp_shard": 2}, {"tp": 2}, False),
           "DpShard2Tp2Resume": ({"dp_shard": 4}, {"dp_shard": 2, "tp": 2}, False),
           "BugDcpNoOptim": ({"dp_shard": 2}, {"tp": 2}, True)}


def build_model(spec=SPEC):
    """The tiny model of `spec`: hf_llama (LlamaForCausalLM), hf_llama_frozen (its final norm
    frozen), hf_llama_tied (the head tied to the embedding) or hf_qwen3 (Qwen3ForCausalLM, whose attention normalizes q and k per head: q_norm,
    k_norm over head_dim)."""
    torch.manual_seed(0)
    sizes = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager")
    if spec == "hf_qwen3":
        return Qwen3ForCausalLM(Qwen3Config(head_dim=8, **sizes)).to(torch.float64)
    model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=spec == "hf_llama_tied", **sizes)).to(torch.float64)
    if spec == "hf_llama_frozen":  # the final norm frozen (not in the optimizer, no gradient)
        model.model.norm.weight.requires_grad_(False)
    return model


def adamw(model, decay_all=False):
    """AdamW as trainers build it: the trainable parameters, weight decay on matrices, none on
    norm scales (1-D)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if decay_all:
        return torch.optim.AdamW(params, lr=LR, weight_decay=0.1)
    decay = [p for p in params if p.dim() >= 2]
    plain = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": plain, "weight_decay": 0.0}], lr=LR)


def tp_plan(model, tp, bug):
    top = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1),
                                                 use_local_output=False),
           "model.norm": SequenceParallel(use_local_output=False),
           "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate(), use_local_output=True)}
    if bug == "sp_norm":  # the norm runs on its rank's tokens as plain tensors: its weight stays plain
        top["model.norm"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),),
                                               use_local_output=True)
    parallelize_module(model, tp, top)
    for layer in model.model.layers:
        parallelize_module(layer, tp, {
            "input_layernorm": SequenceParallel(use_local_output=False),
            "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                            desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            "post_attention_layernorm": SequenceParallel(use_local_output=False),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)})
        if hasattr(layer.self_attn, "q_norm") and bug != "qk_norm":
            # Qwen3's per-head norms run on this rank's heads ([b, s, heads / tp, head_dim]): their
            # weights are replicated and their gradients summed over tp (heads cut along dim 2).
            parallelize_module(layer.self_attn, tp, {
                "q_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
                "k_norm": SequenceParallel(sequence_dim=2, use_local_output=True)})


def parallelize(model, axes, bug=None):
    """The model on a mesh of `axes` ({axis: size}), as a torch 2.x trainer builds it."""
    if not axes:
        return None
    names = tuple(axes)
    mesh = init_device_mesh("cpu", tuple(axes.values()), mesh_dim_names=names)
    if "tp" in axes:
        tp_plan(model, mesh["tp"], bug)
        if model.config.tie_word_embeddings and bug != "untied":
            # parallelize_module gives the embedding and the head a new DTensor parameter each:
            # tie them again (both Shard(0) over the vocabulary), or each trains its own copy.
            model.lm_head.weight = model.model.embed_tokens.weight
    dp = tuple(n for n in names if n.startswith("dp_"))
    if dp:
        dp_mesh = mesh[dp] if len(dp) > 1 else mesh[dp[0]]
        for layer in model.model.layers:
            fully_shard(layer, mesh=dp_mesh)
        if bug != "unsharded":
            fully_shard(model, mesh=dp_mesh)
    return mesh


def settle_gradients(model):
    """Pure tensor parallelism leaves a replicated parameter's gradient Partial() over tp (a
    pending sum) until a DTensor op needs it; torch 2.8's clip_grad_norm_ then takes the norm
    of the local partial sums (mih found its global norm 7.7e-5 off). Reduce them first."""
    for p in model.parameters():
        g = p.grad
        if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
            p.grad = g.redistribute(g.device_mesh, [Replicate() if pl.is_partial() else pl for pl in g.placements])


def clip_gradients(model, max_norm, bug=None):
    """Clips the gradients to a global norm of max_norm and returns the norm before clipping:
    each gradient's norm (a DTensor's made whole: full_tensor of a scalar), then their norm,
    whatever mix of meshes and plain tensors the gradients are on. (torch 2.8's clip_grad_norm_
    adds its 1e-6 to the DTensor total norm while it is still _NormPartial, i.e. to each tp
    rank's partial norm: measured, its coefficient divides by N + 1.414e-6 at tp 2 instead of
    N + 1e-6, which mih found: BugTorchClip. TorchTitan's get_total_norm + full_tensor stacks the
    norms, which fails when they are on two meshes.)"""
    if bug == "torch_clip":
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norms = [torch.linalg.vector_norm(g, 2.0) for g in grads]
    total = torch.stack([n.full_tensor() if isinstance(n, DTensor) else n for n in norms]).norm()
    coef = min(1.0, max_norm / (float(total) + 1e-6))
    for g in grads:
        g.mul_(coef)
    return total


def global_batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, 64, (ROWS, SEQ + 1), generator=g)
    labels = tokens[:, 1:].clone()
    for r in range(ROWS):
        labels[r, :(3 * r) % 7] = -100
    return tokens[:, :SEQ].contiguous(), labels


def data_coordinate(mesh):
    """(this rank's data-parallel index, the data-parallel size, whether it counts the loss)."""
    if mesh is None:
        return 0, 1, True
    names = mesh.mesh_dim_names
    coord = dict(zip(names, mesh.get_coordinate()))
    size = dict(zip(names, mesh.shape))
    index, total = 0, 1
    for axis in ("dp_replicate", "dp_shard"):
        if axis in size:
            index, total = index * size[axis] + coord[axis], total * size[axis]
    return index, total, coord.get("tp", 0) == 0


def train_steps(model, optimizer, ev, mesh, steps, bug=None):
    d, data, counts = data_coordinate(mesh)
    per = ROWS // data
    if bug == "same_rows":  # every data-parallel rank reads the first rows (a sampler without its rank)
        d = 0
    for step in steps:
        ev.begin_step(step)
        inputs, labels = global_batch(step)
        x, y = inputs[d * per:(d + 1) * per], labels[d * per:(d + 1) * per]
        ev.record_batch(step, 0, d * per, {"input_ids": x, "labels": y})
        logits = model(input_ids=x).logits
        token_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                       ignore_index=-100, reduction="sum")
        total = int(labels.ne(-100).sum())
        mine = int(y.ne(-100).sum())
        loss = token_loss / (mine if bug == "per_rank_mean" else total) * data
        loss.backward()
        if bug != "partial_norm":
            settle_gradients(model)
        ev.after_backward_before_clip(step)
        norm = clip_gradients(model, 1.0, bug)
        ev.after_clip(step, norm)
        optimizer.step()
        ev.after_optimizer(step)
        summed = torch.tensor([float(token_loss.detach()) if counts else 0.0], dtype=torch.float64)
        if dist.is_initialized():
            dist.all_reduce(summed)
        ev.end_step(step, loss=float(summed[0]) / total, lr=LR)
        optimizer.zero_grad()


def session(root, case, model, mesh, axes, sub="", spec=SPEC):
    compare_to = "" if case == "Reference" else "Reference"
    config = {"sequence_parallel": "tp" in axes}
    return mih_evidence.Session(os.path.join(root, spec, case, sub), model, case=case, compare_to=compare_to,
                                mesh=mesh, config=config, steps=STEPS)


def run_case(root, case, spec):
    bug = {"BugPerRankMean": "per_rank_mean", "BugUnsharded": "unsharded", "BugSpNorm": "sp_norm",
           "BugPartialNorm": "partial_norm", "BugDecayNorms": "decay_norms", "BugSameRows": "same_rows",
           "BugQkNorm": "qk_norm", "BugTorchClip": "torch_clip", "BugTpUntied": "untied"}.get(case)
    model = build_model(spec)
    axes = MESHES[case]
    mesh = parallelize(model, axes, bug)
    optimizer = adamw(model, decay_all=bug == "decay_norms")
    ev = session(root, case, model, mesh, axes, spec=spec)
    ev.attach_optimizer(optimizer)
    train_steps(model, optimizer, ev, mesh, range(STEPS), bug)
    ev.finish()


def run_resume(root, case, ckpt, save_axes, load_axes, drop_optimizer):
    """Saved on a mesh of save_axes after step SAVE_AFTER by DCP, loaded on one of load_axes
    (a reshard) and trained on."""
    model = build_model()
    mesh = parallelize(model, save_axes)
    optimizer = adamw(model)
    ev = session(root, case, model, mesh, save_axes, sub="before_save")
    ev.attach_optimizer(optimizer)
    train_steps(model, optimizer, ev, mesh, range(SAVE_AFTER + 1))
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=ckpt)
    ev.capture_checkpoint_payload("save", SAVE_AFTER + 1)
    ev.finish()

    model = build_model()
    mesh = parallelize(model, load_axes)
    optimizer = adamw(model)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd} if drop_optimizer else {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=ckpt)
    if drop_optimizer:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    ev = session(root, case, model, mesh, load_axes)
    ev.attach_optimizer(optimizer)
    ev.capture_checkpoint_payload("load", SAVE_AFTER + 1)
    train_steps(model, optimizer, ev, mesh, range(SAVE_AFTER + 1, STEPS))
    ev.finish()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--cases", required=True, help="comma-separated case names")
    ap.add_argument("--ckpt", default="", help="where the resumes' DCP checkpoints go")
    ap.add_argument("--bug-root", default="", help="where the Bug* cases go (default: --root)")
    a = ap.parse_args()
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    for name in a.cases.split(","):
        spec, _, case = name.rpartition(":")
        spec = spec or SPEC
        root = a.bug_root if case.startswith("Bug") and a.bug_root else a.root
        if spec not in ("hf_llama", "hf_llama_frozen", "hf_llama_tied", "hf_qwen3"):
            sys.exit(f"hf_trainer.py: unknown model {spec!r} in {name!r}; the models are hf_llama, hf_llama_frozen, "
                     f"hf_llama_tied and hf_qwen3")
        if case in RESUMES and spec == SPEC:
            run_resume(root, case, os.path.join(a.ckpt, case), *RESUMES[case])
        elif case in MESHES:
            run_case(root, case, spec)
        else:
            sys.exit(f"hf_trainer.py: unknown case {case!r}; the cases are {sorted(MESHES) + sorted(RESUMES)}")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
