"""torchdata 0.11 ``StatefulDataLoader`` over a map-style Zarr dataset with a chunk-aware sampler.

Recipe: pytorch/data torchdata/stateful_dataloader/README.md (``StatefulDataLoader`` as a drop-in DataLoader;
``state_dict`` counts the batches yielded and fast-forwards a deterministic sampler on ``load_state_dict``) and
the ``__getitems__`` batched fetch of torch.utils.data (a dataset with ``__getitems__`` gets a whole batch of
indices at once). The sampler is what such a user writes for a first-axis-chunked store: the chunk order is
shuffled every epoch (seed + epoch), rows are shuffled inside each chunk, each rank takes an equal contiguous
share of that order (``drop_last``), so a batch falls in one or two chunks and is read as one slice of them.
"""

import numpy as np
import torch
import zarr
from common import Ctx, LoaderStatePeer, main
from torch.utils.data import BatchSampler, Dataset, Sampler
from torchdata.stateful_dataloader import StatefulDataLoader


class ZarrRows(Dataset):
    """Map-style: ``__getitems__`` reads the smallest slice covering a batch's rows, then picks them."""

    def __init__(self, store: str):
        self.store, self.arrays = store, None
        self.n = zarr.open_group(store, mode="r")["idx"].shape[0]

    def __len__(self) -> int:
        return self.n

    def _open(self):
        if self.arrays is None:  # per process: opened after the fork
            group = zarr.open_group(self.store, mode="r")
            self.arrays = {name: group[name] for name in ("x", "idx")}
        return self.arrays

    def __getitems__(self, rows: list[int]) -> dict:
        rows = np.asarray(rows)
        lo, hi = int(rows.min()), int(rows.max()) + 1
        return {name: arr[lo:hi][rows - lo] for name, arr in self._open().items()}

    def __getitem__(self, row: int) -> dict:
        return {name: arr[row] for name, arr in self._open().items()}


def as_tensors(batch: dict) -> dict:
    return {name: torch.from_numpy(np.ascontiguousarray(v)) for name, v in batch.items()}


class ChunkShuffleSampler(Sampler[int]):
    """Chunks in a new random order every epoch, rows shuffled inside each chunk, an equal share per rank."""

    def __init__(self, n: int, chunk_rows: int, rank: int, world: int, batch_size: int, seed: int = 0):
        self.n, self.chunk_rows, self.rank, self.world = n, chunk_rows, rank, world
        self.share = (n // world) // batch_size * batch_size
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.share

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        starts = rng.permutation(np.arange(0, self.n, self.chunk_rows))
        order = np.concatenate([rng.permutation(np.arange(s, min(s + self.chunk_rows, self.n))) for s in starts])
        return iter(order[self.rank * self.share : (self.rank + 1) * self.share].tolist())


class Torchdata(LoaderStatePeer):
    name = "torchdata StatefulDataLoader"
    recipe = "github.com/pytorch/data torchdata/stateful_dataloader/README.md"

    def open(self, ctx: Ctx, *, rank: int, world: int, workers: int):
        sampler = ChunkShuffleSampler(ctx.rows, ctx.chunk_rows, rank, world, ctx.batch_size, ctx.seed)
        batches = BatchSampler(sampler, ctx.batch_size, drop_last=True)
        persistent = {"persistent_workers": True} if workers else {}
        loader = StatefulDataLoader(
            ZarrRows(ctx.store), batch_sampler=batches, num_workers=workers, collate_fn=as_tensors, **persistent
        )
        loader.chunk_sampler = sampler
        return loader

    def epoch(self, loader, epoch: int):
        loader.chunk_sampler.set_epoch(epoch)
        return iter(loader)


if __name__ == "__main__":
    main(Torchdata())
