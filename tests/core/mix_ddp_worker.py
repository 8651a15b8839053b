"""One DDP rank for tests/core/test_mix.py: run like torchrun does (env RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), iterate a MixedLoader of two stores for two epochs with an ``all_reduce`` of the batch's source index
after every batch (as DDP's gradient sync of a head per source would need), and write the sources and rows this
rank drew to ``OUT/rank{RANK}.json``. The process group has a 60 s timeout so a rank left waiting fails."""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from zarrtorch import MixedLoader, ZarrDataLoader, ZarrIterableDataset


def main() -> None:
    era, cerra, out = sys.argv[1:4]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    names = ["era", "cerra"]
    sources = {
        name: ZarrDataLoader(ZarrIterableDataset(path, seed=3, return_index=True), batch_size=8, drop_last=True)
        for name, path in zip(names, (era, cerra), strict=True)
    }
    mix = MixedLoader(sources, rows={"era": 96, "cerra": 48})  # two epochs: cerra's 96 rows once
    drawn = {"sources": [], "rows": {n: [] for n in names}}
    for epoch in range(2):
        mix.set_epoch(epoch)
        for batch in mix:
            head = torch.tensor([names.index(batch["source"])])
            dist.all_reduce(head, op=dist.ReduceOp.MAX)
            assert int(head) == names.index(batch["source"]), f"rank {rank} drew {batch['source']}, another not"
            drawn["sources"].append(batch["source"])
            drawn["rows"][batch["source"]] += batch["index"].tolist()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(drawn, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
