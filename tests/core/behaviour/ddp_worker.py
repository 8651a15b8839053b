"""One DDP rank for test_ddp.py: run like torchrun does (env RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), iterate a ZarrDataLoader for a few epochs with an ``all_reduce`` after every batch (as DDP's
gradient sync would), and write the rows this rank saw to ``OUT/rank{RANK}.npz``. With ``--stop-after N``
it stops after N batches of epoch 0 and rank 0 saves the loader state; ``--resume STATE`` continues from it
(possibly on another world size or number of workers).

Unequal batch counts across ranks make the extra ``all_reduce`` fail or time out: the process group has a
60 s timeout so such a bug fails the test instead of hanging it.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--store", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--drop-last", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--stop-after", type=int, default=0, help="stop after this many batches of epoch 0, save state")
    p.add_argument("--resume", default=None, help="a state saved by --stop-after (JSON) to continue from")
    p.add_argument("--batch-order", default="worker", help="ZarrDataLoader(batch_order=...)")
    p.add_argument("--context", default="spawn", help="the workers' multiprocessing context")
    args = p.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    ds = ZarrIterableDataset(args.store, seed=7, buffer_chunks=2, return_index=True, read=ReadOptions(decode_threads=1))
    extra = dict(multiprocessing_context=args.context, persistent_workers=True) if args.num_workers else {}
    loader = ZarrDataLoader(
        ds,
        batch_size=args.batch_size,
        drop_last=bool(args.drop_last),
        num_workers=args.num_workers,
        batch_order=args.batch_order,
        **extra,
    )  # rank and world size from torch.distributed
    result = {"topology": np.array(loader.topology()), "len": np.array(len(loader))}
    first_epoch = 0
    if args.resume:
        with open(args.resume) as f:
            loader.load_state_dict(json.load(f))
        first_epoch = loader.epoch
        result["len"] = np.array(len(loader))
    for epoch in range(first_epoch, args.epochs):
        if epoch != first_epoch or not args.resume:
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
            if args.stop_after and len(sizes) == args.stop_after:
                break
        counts = torch.tensor([len(sizes)])
        dist.all_reduce(counts, op=dist.ReduceOp.MAX)
        assert int(counts.item()) == len(sizes), f"rank {rank}: {len(sizes)} batches, another rank {int(counts)}"
        result[f"index_{epoch}"] = np.concatenate(index)
        result[f"x_{epoch}"] = np.concatenate(x_rows)
        result[f"y_{epoch}"] = np.concatenate(y)
        result[f"sizes_{epoch}"] = np.array(sizes)
        if args.stop_after:  # the job "hit its time limit": save where the loader is, and stop
            if rank == 0:
                with open(os.path.join(args.out, "state.json"), "w") as f:
                    json.dump(loader.state_dict(), f)
            break
    np.savez(os.path.join(args.out, f"rank{rank}.npz"), **result)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
