"""One DDP rank for tests/test_ddp.py: run like torchrun does (env RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), iterate a ZarrDataLoader for a few epochs with an ``all_reduce`` after every batch (as DDP's
gradient sync would), and write the rows this rank saw to ``OUT/rank{RANK}.npz``.

Unequal batch counts across ranks make the extra ``all_reduce`` fail or time out: the process group has a
60 s timeout so such a bug fails the test instead of hanging it.
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from zarrtorch import ZarrDataLoader, ZarrIterableDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--store", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--drop-last", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    ds = ZarrIterableDataset(args.store, seed=7, buffer_chunks=2, return_index=True, decode_threads=1)
    extra = dict(multiprocessing_context="spawn", persistent_workers=True) if args.num_workers else {}
    loader = ZarrDataLoader(
        ds, batch_size=args.batch_size, drop_last=bool(args.drop_last), num_workers=args.num_workers, **extra
    )  # rank and world size from torch.distributed
    result = {"topology": np.array(loader.topology()), "len": np.array(len(loader))}
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        index, x_rows, y, sizes = [], [], [], []
        for batch in loader:
            index.append(batch["index"].numpy())
            x_rows.append(batch["x"].numpy()[:, 0, 0])
            y.append(batch["y"].numpy())
            sizes.append(len(batch["index"]))
            token = torch.ones(1)
            dist.all_reduce(token)  # blocks (then fails) if another rank has no batch left
            assert int(token.item()) == world
        counts = torch.tensor([len(sizes)])
        dist.all_reduce(counts, op=dist.ReduceOp.MAX)
        assert int(counts.item()) == len(sizes), f"rank {rank}: {len(sizes)} batches, another rank {int(counts)}"
        result[f"index_{epoch}"] = np.concatenate(index)
        result[f"x_{epoch}"] = np.concatenate(x_rows)
        result[f"y_{epoch}"] = np.concatenate(y)
        result[f"sizes_{epoch}"] = np.array(sizes)
    np.savez(os.path.join(args.out, f"rank{rank}.npz"), **result)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
