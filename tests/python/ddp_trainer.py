#!/usr/bin/env python3
"""A small PyTorch training loop of its own (a 2-layer causal transformer, float64, AdamW, global
norm clipping), run by tests/python/torch_writer.py under torchrun with DDP, or DDP with
ZeroRedundancyOptimizer, or on one process: the foreign trainer whose evidence mih judges. It
calls python/mih_evidence.py's hooks (about 15 lines of the loop below, marked `ev.`).

The global batch of each step is 8 rows of 16 tokens with an uneven label mask (row r masks its
first (3 r) mod 7 targets), so each rank holds a different number of valid targets. The loss is
normalized by the global valid-target count (the contract every split must keep); --bug plants
one of two classic DDP bugs:
  per_rank_mean  each rank averages over its own valid targets (DDP then averages the ranks'
                 gradients: a weighted mean, not the global one);
  no_sync_drop   the last micro-batch runs under no_sync (its gradient is never all-reduced:
                 each rank keeps its own, and the other rank's micro-batch is dropped);
  rank_lr_last   rank 1 steps with twice the lr at the last step (its copy of the model leaves
                 rank 0's, which alone the probes see);
  rows_as_first  under --rows strided, each micro-batch declared by its first row as if its rows
                 were contiguous (all the 0.2 writer could say of a DistributedSampler's rows).
--rows strided gives rank r of W the rows r, r + W, ... of each step's global batch, as a
DistributedSampler does, declared to the writer row by row (mih_evidence.sampler_rows).
"""
import argparse
import contextlib
import gc
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.environ.get("MIH_PYTHON_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "python")))
import mih_evidence  # noqa: E402

VOCAB, HIDDEN, HEADS, LAYERS, ROWS, SEQ = 64, 32, 4, 2, 8, 16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.ln2 = nn.LayerNorm(HIDDEN)
        self.fc1 = nn.Linear(HIDDEN, 4 * HIDDEN)
        self.fc2 = nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x):  # [b, s, H]
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(HIDDEN, dim=-1)
        heads = lambda t: t.view(b, s, HEADS, HIDDEN // HEADS).transpose(1, 2)  # noqa: E731
        q, k, v = heads(q), heads(k), heads(v)
        scores = q @ k.transpose(-1, -2) / math.sqrt(HIDDEN // HEADS)
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, HIDDEN)
        x = x + self.proj(attn)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, input_ids):  # [b, s] -> logits [b, s, V]
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def global_batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    input_ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=g)
    labels = torch.roll(input_ids, -1, 1)
    labels[:, -1] = -100
    for r in range(ROWS):
        labels[r, : (3 * r) % 7] = -100
    return input_ids, labels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="the case directory")
    ap.add_argument("--case", required=True)
    ap.add_argument("--compare-to", default="")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--micro-batches", type=int, default=1)
    ap.add_argument("--zero", action="store_true", help="ZeroRedundancyOptimizer over the DDP ranks")
    ap.add_argument("--rows", choices=["contiguous", "strided"], default="contiguous")
    ap.add_argument("--bug", choices=["none", "per_rank_mean", "no_sync_drop", "rank_lr_last", "rows_as_first"],
                    default="none")
    a = ap.parse_args()

    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)
    model = TinyLM().double()
    ddp = nn.parallel.DistributedDataParallel(model) if distributed else model
    # Weight decay on matrices, none on norm scales and biases (OptimizerLayout's rule).
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    if a.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        optimizer = ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, lr=1e-3)
    else:
        optimizer = torch.optim.AdamW(groups, lr=1e-3)

    ev = mih_evidence.Session(a.out, ddp, case=a.case, compare_to=a.compare_to, steps=a.steps,
                              config={"dp_replicate": world})
    if distributed:
        ddp.register_comm_hook(None, ev.ddp_comm_hook)
    ev.attach_optimizer(optimizer)

    rows = ROWS // world
    mb_rows = rows // a.micro_batches
    for step in range(a.steps):
        ev.begin_step(step)
        input_ids, labels = global_batch(step)
        valid = int(labels.ne(-100).sum())  # the global valid-target count every rank knows
        local_sum = torch.zeros((), dtype=torch.float64)
        optimizer.zero_grad(set_to_none=True)
        for mb in range(a.micro_batches):
            first = rank * rows + mb * mb_rows
            if a.rows == "strided":
                mine = mih_evidence.sampler_rows(rank, world, mb * mb_rows, mb_rows)
                ids, lab = input_ids[mine], labels[mine]
                declared = first if a.bug == "rows_as_first" else mine
            else:
                ids, lab = input_ids[first:first + mb_rows], labels[first:first + mb_rows]
                declared = first
            ev.record_batch(step, mb, declared, {"input_ids": ids, "labels": lab})
            # DDP all-reduces at the backward of a forward run outside no_sync: once per step,
            # at the last micro-batch (the accumulated gradients of all of them).
            last = mb == a.micro_batches - 1
            sync = last if a.bug != "no_sync_drop" else (not last)
            with ddp.no_sync() if distributed and not sync else contextlib.nullcontext():
                logits = ddp(ids)
                token_losses = F.cross_entropy(logits.reshape(-1, VOCAB), lab.reshape(-1), ignore_index=-100,
                                               reduction="none")
                if a.bug == "per_rank_mean":
                    own = int(labels[rank * rows:(rank + 1) * rows].ne(-100).sum())
                    loss = token_losses.sum() / own  # DDP averages over ranks: x world / world
                else:
                    loss = token_losses.sum() / valid * world  # DDP divides the summed gradients by world
                loss.backward()
            local_sum += token_losses.detach().sum()
        ev.after_backward_before_clip(step)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        ev.after_clip(step, norm)
        if a.bug == "rank_lr_last" and rank == 1 and step == a.steps - 1:
            for group in optimizer.param_groups:
                group["lr"] *= 2  # rank 1's copy leaves the others' at the last step
        optimizer.step()
        ev.after_optimizer(step)
        if distributed:
            dist.all_reduce(local_sum)
        ev.end_step(step, loss=float(local_sum) / valid, lr=optimizer.param_groups[0]["lr"])
    ev.finish()
    # Tear down while the interpreter is alive: DDP's reducer holds the group and the comm
    # hook's futures (Python callbacks); left to interpreter exit, a gloo worker thread may
    # drop the last of them after Python is gone (SIGABRT: 'terminate called without an
    # active exception').
    del ev, ddp, optimizer
    gc.collect()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
