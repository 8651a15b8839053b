"""zarrtorch itself, as ``make bench`` runs it: ``ZarrDataLoader(ZarrIterableDataset(store))``, shuffled, seed 0,
``drop_last=True``, persistent workers; simulated ranks through ``rank=``/``world_size=``.

Recipe: this repository, README.md and benchmarks/harness.py (``zarrtorch_loader``).
"""

from common import Ctx, LoaderStatePeer, main

from zarrtorch import ZarrDataLoader, ZarrIterableDataset


class Zarrtorch(LoaderStatePeer):
    name = "zarrtorch"
    recipe = "this repository: benchmarks/harness.py zarrtorch_loader"

    def open(self, ctx: Ctx, *, rank: int, world: int, workers: int):
        ds = ZarrIterableDataset(ctx.store, shuffle=True, seed=ctx.seed)
        persistent = {"persistent_workers": True} if workers else {}
        return ZarrDataLoader(
            ds,
            batch_size=ctx.batch_size,
            num_workers=workers,
            drop_last=True,
            rank=rank,
            world_size=world,
            **persistent,
        )

    def epoch(self, loader, epoch: int):
        loader.set_epoch(epoch)
        return iter(loader)


if __name__ == "__main__":
    main(Zarrtorch())
