"""xbatcher 0.4: ``BatchGenerator`` over the store opened with xarray, its ``loaders.torch.MapDataset`` in a
``DataLoader(batch_size=None)`` (each item is already a batch).

Recipe: github.com/xarray-contrib/xbatcher doc/user-guide/training-a-neural-network-with-Pytorch-and-xbatcher.ipynb
(``xr.open_dataset(..., engine="zarr", chunks={})``, ``BatchGenerator(input_dims={"sample": n, ...})`` for the
samples and one for the labels, ``MapDataset(X_bgen, y_bgen)``, ``DataLoader(batch_size=None, prefetch_factor=3,
persistent_workers=True, multiprocessing_context="forkserver")``); the labels here are the row numbers ``idx``.
xbatcher has no sampler and no rank API: the ranks and the per-epoch shuffle come from torch's
``DistributedSampler`` over the batch numbers (``set_epoch``), as for any map-style dataset. A batch is a
contiguous block of rows (xbatcher cuts the sample dimension in order); only the order of the blocks is shuffled.
"""

import xarray as xr
import xbatcher
import xbatcher.loaders.torch
from common import Ctx, Peer, main
from torch.utils.data import DataLoader, DistributedSampler


class Xbatcher(Peer):
    name = "xbatcher"
    recipe = (
        "github.com/xarray-contrib/xbatcher doc/user-guide/training-a-neural-network-with-Pytorch-and-xbatcher.ipynb"
    )

    def open(self, ctx: Ctx, *, rank: int, world: int, workers: int):
        ds = xr.open_dataset(ctx.store, engine="zarr", chunks={})
        dims = dict(zip(ds["x"].dims, ds["x"].shape, strict=True)) | {"row": ctx.batch_size}
        x_gen = xbatcher.BatchGenerator(ds["x"], input_dims=dims, preload_batch=False)
        y_gen = xbatcher.BatchGenerator(ds["idx"], input_dims={"row": ctx.batch_size}, preload_batch=False)
        dataset = xbatcher.loaders.torch.MapDataset(x_gen, y_gen)
        sampler = DistributedSampler(
            dataset, num_replicas=world, rank=rank, shuffle=True, seed=ctx.seed, drop_last=True
        )
        extra = {"prefetch_factor": 3, "persistent_workers": True, "multiprocessing_context": "forkserver"}
        loader = DataLoader(
            dataset, batch_size=None, sampler=sampler, num_workers=workers, **(extra if workers else {})
        )
        return loader

    def epoch(self, loader, epoch: int):
        loader.sampler.set_epoch(epoch)
        return iter(loader)

    def rows_of(self, batch) -> list[int]:
        return [int(i) for i in batch[1]]


if __name__ == "__main__":
    main(Xbatcher())
