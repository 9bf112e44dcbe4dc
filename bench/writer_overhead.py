"""The PyTorch writer's cost on a step (a benchmark, not a timed test): the torch 2.x training loop
of tests/python/hf_trainer.py (a tiny Hugging Face Llama, float64 on the CPU, gloo) with
python/mih_evidence's hooks, against the same loop with hooks that do nothing, interleaved in
one run (R rounds of S steps each way, on the same model), per parallel layout.

    <venv>/bin/python -m torch.distributed.run --nproc_per_node 2 bench/writer_overhead.py \
        [--layout dp_shard=2|tp=2|dp_shard=2,tp=2] [--rounds 5] [--steps 3] [--hidden 32] [--layers 2]

Prints, on rank 0, the median step time (ms, slowest rank) without and with the writer and
their ratio. Setting up a session (its files, the parameter table) is not in the step time."""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import hf_trainer  # noqa: E402
import mih_evidence  # noqa: E402


class NoWriter:
    """The hooks of mih_evidence.Session, doing nothing."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def timed_steps(model, optimizer, ev, mesh, steps):
    """Each step's wall time in ms, the slowest rank's."""
    out = []
    for step in steps:
        dist.barrier()
        t0 = time.perf_counter()
        hf_trainer.train_steps(model, optimizer, ev, mesh, [step])
        ms = torch.tensor([(time.perf_counter() - t0) * 1e3], dtype=torch.float64)
        dist.all_reduce(ms, op=dist.ReduceOp.MAX)
        out.append(float(ms[0]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", default="dp_shard=2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=32, help="the Llama's hidden size (the test model's: 32)")
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    axes = {k: int(v) for k, v in (item.split("=") for item in a.layout.split(","))}
    torch.manual_seed(0)
    config = hf_trainer.LlamaConfig(vocab_size=64, hidden_size=a.hidden, intermediate_size=2 * a.hidden,
                                    num_hidden_layers=a.layers, num_attention_heads=4, num_key_value_heads=2,
                                    max_position_embeddings=64, attn_implementation="eager")
    model = hf_trainer.LlamaForCausalLM(config).to(torch.float64)
    mesh = hf_trainer.parallelize(model, axes)
    optimizer = hf_trainer.adamw(model)
    plain, hooked = [], []
    work = tempfile.mkdtemp(prefix="mih-writer-bench-") if dist.get_rank() == 0 else None
    work = [work]
    dist.broadcast_object_list(work)
    for r in range(a.rounds):
        plain += timed_steps(model, optimizer, NoWriter(), mesh, range(a.steps))
        ev = mih_evidence.Session(os.path.join(work[0], f"round{r}"), model, case=f"round{r}", mesh=mesh,
                                  config={"sequence_parallel": "tp" in axes})
        ev.attach_optimizer(optimizer)
        hooked += timed_steps(model, optimizer, ev, mesh, range(a.steps))
        ev.finish()
    if dist.get_rank() == 0:
        p, h = statistics.median(plain), statistics.median(hooked)
        print(f"hidden {a.hidden} x {a.layers} layers, {a.layout} on {dist.get_world_size()} ranks, {a.rounds} x {a.steps} steps each way: "
              f"{p:.1f} ms per step without the writer, {h:.1f} ms with it: ratio {h / p:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
