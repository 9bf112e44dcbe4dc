"""The same work as `mih launch -n N ping`, done by PyTorch's own launcher: spawn N processes
with torch.multiprocessing.spawn, rendezvous through a FileStore, all-reduce one tensor over
Gloo, exit. Prints the launch-only seconds (spawn to join) on the last line."""
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world_size, store_path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank, world_size=world_size)
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world_size
    dist.destroy_process_group()


def main():
    world_size = int(sys.argv[1])
    with tempfile.TemporaryDirectory() as d:
        start = time.perf_counter()
        mp.spawn(worker, args=(world_size, os.path.join(d, "store")), nprocs=world_size, join=True)
        print(f"launch_seconds {time.perf_counter() - start:.4f}")


if __name__ == "__main__":
    main()
