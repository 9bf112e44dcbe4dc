#!/usr/bin/env python3
"""The example loop of docs/evidence.md, whole and runnable: a PyTorch DDP training loop that
writes mih's evidence contract with mih_evidence.py (installed beside it, in
share/mih/python). Its data comes through a DistributedSampler (shuffled, rank r of W takes the
sampler's positions r, r + W, ...) and a DataLoader, in micro-batches; the lines marked `ev.`
are all that the writer adds to the loop.

    python3 mih_evidence_example.py --out runs/example/Reference --case Reference
    torchrun --nproc_per_node 2 -r 1 -t 1 mih_evidence_example.py --out runs/example/DpReplicate2 \\
        --case DpReplicate2 --compare-to Reference --micro-batches 2
    mih check runs        # NumericParity, InputIdentity, ReplicaConsistency against the 1-rank run

The model is a tiny causal LSTM language model over random tokens (float64 on CPU, gloo);
replace it, the data set and the optimizer by your own.
"""
import argparse
import gc
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mih_evidence  # noqa: E402

VOCAB, HIDDEN, SEQ = 48, 32, 12


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.rnn = nn.Linear(HIDDEN, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids):  # [b, s] -> [b, s, V]
        x = self.embed(ids)
        x = x + torch.tanh(self.rnn(x.cumsum(1) / torch.arange(1, ids.shape[1] + 1, dtype=x.dtype)[:, None]))
        return self.head(self.norm(x))


def dataset(rows):
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (rows, SEQ + 1), generator=g)
    labels = ids[:, 1:].clone()
    labels[torch.arange(rows) % 3 == 0, :4] = -100  # an uneven mask: ranks hold unequal target counts
    return TensorDataset(ids[:, :-1], labels)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the case directory, new for each run")
    ap.add_argument("--case", required=True)
    ap.add_argument("--compare-to", default="")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--global-batch", type=int, default=8, help="rows per step over all ranks")
    ap.add_argument("--micro-batches", type=int, default=1)
    a = ap.parse_args()

    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.manual_seed(0)
    model = TinyLM().double()
    ddp = nn.parallel.DistributedDataParallel(model) if distributed else model
    # Weight decay on matrices, none on norm scales and biases (mih's OptimizerLayout checks it).
    optimizer = torch.optim.AdamW([{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
                                   {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}],
                                  lr=1e-2)
    data = dataset(a.global_batch * a.steps)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    per_rank = a.global_batch // world
    mb_rows = per_rank // a.micro_batches
    loader = iter(DataLoader(data, batch_size=mb_rows, sampler=sampler))

    ev = mih_evidence.Session(a.out, ddp, case=a.case, compare_to=a.compare_to, steps=a.steps,  # ev.
                              config={"dp_replicate": world})
    if distributed:
        ddp.register_comm_hook(None, ev.ddp_comm_hook)                                         # ev.
    ev.attach_optimizer(optimizer)                                                             # ev.
    for step in range(a.steps):
        ev.begin_step(step)                                                                    # ev.
        batches = [next(loader) for _ in range(a.micro_batches)]
        local_valid = sum(int(labels.ne(-100).sum()) for _, labels in batches)
        valid = torch.tensor(float(local_valid), dtype=torch.float64)
        if distributed:
            dist.all_reduce(valid)  # the global target count: the loss's normalizer on every rank
        local_sum = torch.zeros((), dtype=torch.float64)
        optimizer.zero_grad(set_to_none=True)
        for mb, (ids, labels) in enumerate(batches):
            # This micro-batch's global rows: the sampler's positions of this rank.
            rows = mih_evidence.sampler_rows(rank, world, mb * mb_rows, mb_rows)
            ev.record_batch(step, mb, rows, {"input_ids": ids, "labels": labels})              # ev.
            sync = mb == a.micro_batches - 1  # DDP all-reduces once, at the last micro-batch
            with ddp.no_sync() if distributed and not sync else torch.enable_grad():
                token_losses = F.cross_entropy(ddp(ids).reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100,
                                               reduction="none")
                (token_losses.sum() / valid * world).backward()  # DDP averages: x world / world
            local_sum += token_losses.detach().sum()
        ev.after_backward_before_clip(step)                                                    # ev.
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        ev.after_clip(step, norm)                                                              # ev.
        optimizer.step()
        ev.after_optimizer(step)                                                               # ev.
        if distributed:
            dist.all_reduce(local_sum)
        ev.end_step(step, loss=float(local_sum / valid), lr=optimizer.param_groups[0]["lr"])   # ev.
    ev.finish()                                                                                # ev.
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
