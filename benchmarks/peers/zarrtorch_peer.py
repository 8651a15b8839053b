"""zarrtorch itself, as ``make bench`` runs it: ``ZarrDataLoader(ZarrIterableDataset(store))``, shuffled, seed 0,
``drop_last=True``, persistent workers; simulated ranks through ``rank=``/``world_size=``. ``--uncompressed``
(the peer "zarrtorch, uncompressed copy"): the same, on a copy of the store written by ``prepare_zarr`` without a
codec, beside the uncompressed copies LitData and MosaicML Streaming read. ``--rank-order`` (the peer
"zarrtorch, batch_order='rank'"): the same with batches that do not depend on the worker count.

The ``layout`` job reads ``beluga_layouts.py``'s stores with default settings: rows, or windows of 2 input and
``frames - 2`` target steps (``Windows(history=2, lead=frames - 2)``).

Recipe: this repository, README.md and benchmarks/harness.py (``zarrtorch_loader``).
"""

import sys

import beluga_layouts as layouts
from common import Ctx, LoaderStatePeer, NoAPI, main

from zarrtorch import ReadOptions, Windows, ZarrDataLoader, ZarrIterableDataset, prepare_zarr

LAYOUT_VARIABLES = {"course": ["x"], "frame": [layouts.DATA], "sharded": [layouts.DATA], "wb2": layouts.wb2_variables()}


class Zarrtorch(LoaderStatePeer):
    name = "zarrtorch"
    recipe = "this repository: benchmarks/harness.py zarrtorch_loader"

    batch_order = "worker"

    def _loader(self, ds, ctx: Ctx, *, rank: int, world: int, workers: int):
        persistent = {"persistent_workers": True} if workers else {}
        return ZarrDataLoader(
            ds,
            batch_size=ctx.batch_size,
            num_workers=workers,
            drop_last=True,
            rank=rank,
            world_size=world,
            batch_order=self.batch_order,
            **persistent,
        )

    def source(self, ctx: Ctx) -> str:
        return ctx.store

    def open(self, ctx: Ctx, *, rank: int, world: int, workers: int):
        ds = ZarrIterableDataset(self.source(ctx), shuffle=True, seed=ctx.seed)
        return self._loader(ds, ctx, rank=rank, world=world, workers=workers)

    def epoch(self, loader, epoch: int):
        loader.set_epoch(epoch)
        return iter(loader)

    def open_remote(self, ctx: Ctx, *, remote: str, cache_dir, workers: int):
        """The cache case: the store's URL read through ``ReadOptions(cache_dir=...)`` (docs/cache.md)."""
        ds = ZarrIterableDataset(remote, shuffle=True, seed=ctx.seed, read=ReadOptions(cache_dir=str(cache_dir)))
        return self._loader(ds, ctx, rank=0, world=1, workers=workers)

    def open_layout(self, ctx: Ctx, *, kind: str, frames: int, workers: int):
        if ctx.batch_size == 0:
            raise NoAPI  # zarrtorch hands out batches only
        windows = Windows(history=2, lead=frames - 2) if frames > 1 else None
        ds = ZarrIterableDataset(
            ctx.store, variables=LAYOUT_VARIABLES[kind], shuffle=True, seed=ctx.seed, windows=windows
        )
        return self._loader(ds, ctx, rank=0, world=1, workers=workers)

    def samples_in(self, batch) -> int:
        return len(next(iter(batch.values())))


class ZarrtorchUncompressed(Zarrtorch):
    name = "zarrtorch, uncompressed copy"
    recipe = "this repository: prepare_zarr(..., codec=None), then as zarrtorch"
    converts = True

    def convert(self, ctx: Ctx) -> None:
        import zarr

        group = zarr.open_group(ctx.store, mode="r")
        arrays = {name: group[name] for name in ("x", "idx")}
        prepare_zarr(arrays, ctx.converted, chunk_rows=ctx.chunk_rows, codec=None, overwrite=True, progress=False)

    def source(self, ctx: Ctx) -> str:
        return str(ctx.converted)


class ZarrtorchRankOrder(Zarrtorch):
    name = "zarrtorch, batch_order='rank'"
    recipe = "this repository: docs/batch-order.md, ZarrDataLoader(..., batch_order='rank')"
    batch_order = "rank"


FLAGS = {"--uncompressed": ZarrtorchUncompressed, "--rank-order": ZarrtorchRankOrder}

if __name__ == "__main__":
    chosen = [flag for flag in FLAGS if flag in sys.argv]
    for flag in chosen:
        sys.argv.remove(flag)
    main(FLAGS[chosen[0]]() if chosen else Zarrtorch())
