"""One rank of test_torchrun.py, started by ``python -m torch.distributed.run --standalone``: a MixedLoader of a
local store and a remote one read through the node's chunk cache with placement (``redeal_every=2``), for two
epochs, with an ``all_reduce`` of the batch's source after every batch (a head per source under DDP). Writes the
sources and rows (with their ``y``) this rank drew to ``OUT/rank{RANK}.json``; between the epochs rank 0 asks the
server for ``MARK`` so the test can count the second epoch's requests. Then rank 1 raises at the start of a third
epoch while rank 0 enters it: the launch must end, not hang."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from datetime import timedelta

import torch
import torch.distributed as dist

from zarrtorch import MixedLoader, ReadOptions, ZarrDataLoader, ZarrIterableDataset
from zarrtorch._read.cache import wait_for_writes

MARK = "second-epoch-begins"
RAISED = "rank 1 raises at the start of epoch 2"


def main() -> None:
    local, url, cache_dir, out = sys.argv[1:5]
    rank = int(os.environ["RANK"])
    assert os.environ["WORLD_SIZE"] == "2"
    assert os.environ["LOCAL_WORLD_SIZE"] == "2" and os.environ["LOCAL_RANK"] == str(rank)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # torchrun's env: MASTER_ADDR/PORT, RANK
    remote = ZarrIterableDataset(url, seed=3, return_index=True, redeal_every=2, read=ReadOptions(cache_dir=cache_dir))
    sources = {
        "local": ZarrDataLoader(ZarrIterableDataset(local, seed=3, return_index=True), batch_size=8, drop_last=True),
        "remote": ZarrDataLoader(remote, batch_size=8, drop_last=True),
    }
    mix = MixedLoader(sources)  # every source's rows once per mix epoch
    names = mix.names
    drawn = []
    for epoch in range(2):
        if epoch == 1:
            wait_for_writes()  # the first epoch's chunks are in the cache's files
            dist.barrier()
            if rank == 0:
                try:
                    urllib.request.urlopen(f"{url}/{MARK}")
                except urllib.error.HTTPError:  # 404: only counted
                    pass
            dist.barrier()
        mix.set_epoch(epoch)
        steps = {"sources": [], "rows": {n: [] for n in names}, "y": {n: [] for n in names}}
        for batch in mix:
            head = torch.tensor([names.index(batch["source"])])
            dist.all_reduce(head, op=dist.ReduceOp.MAX)
            assert int(head) == names.index(batch["source"]), f"rank {rank} drew {batch['source']}, another not"
            steps["sources"].append(batch["source"])
            steps["rows"][batch["source"]] += batch["index"].tolist()
            steps["y"][batch["source"]] += batch["y"].tolist()
        drawn.append(steps)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(drawn, f)
    dist.barrier()
    mix.set_epoch(2)
    if rank == 1:
        raise RuntimeError(RAISED)
    for _ in mix:  # waits in the ranks' check for rank 1, which is gone
        pass


if __name__ == "__main__":
    main()
