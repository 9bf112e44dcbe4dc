"""The loop of build/bin/mih_bench_collectives in PyTorch (Debian's python3-torch, Gloo):
back-to-back small collectives on N processes, median microseconds of the slowest rank.
Usage: python3 bench/collective_latency.py [RANKS] [ITERATIONS] [NUMEL]"""
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world_size, store, iterations, numel, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world_size)
    t = torch.ones(numel)
    out = [torch.empty(numel) for _ in range(world_size)]
    timings = {}
    for name, op in [("all_reduce", lambda: dist.all_reduce(t)), ("broadcast", lambda: dist.broadcast(t, 0)),
                     ("all_gather", lambda: dist.all_gather(out, t)), ("barrier", dist.barrier)]:
        for _ in range(10):
            op()
        dist.barrier()
        us = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            op()
            us.append((time.perf_counter() - t0) * 1e6)
        us.sort()
        timings[name] = us[len(us) // 2]
    results[rank] = timings
    dist.destroy_process_group()


if __name__ == "__main__":
    ranks = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    numel = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    results = mp.Manager().dict()
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(ranks, d + "/store", iterations, numel, results), nprocs=ranks)
    print(f"{ranks} ranks, {numel} elements (float32), median of {iterations} calls, slowest rank:")
    for name in results[0]:
        print(f"  {name:<24} {max(r[name] for r in results.values()):8.1f} us")
