"""zarr-torch-dataset 0.0.9 (import name ``zarrdataset``), the course's starting point, as its README shows it:
chunk shuffle with a shared seed, buffer shuffle, its ``ZarrDataLoader`` (persistent workers). The row numbers
come as its ``targets`` (the store's ``idx``).

Recipe: the package's README (../shared/reference/000_*.txt), as benchmarks/harness.py ``run_reference`` runs it.
It takes the rank and world size from ``torch.distributed`` only, so the simulated ranks patch
``torch.distributed.is_initialized/get_rank/get_world_size`` (forked workers inherit the patch). It has no
``set_epoch``: an epoch is one more ``iter(loader)``. It has no state to save (no resume API).
"""

import torch
import zarr
from common import Ctx, Peer, main


def simulate_rank(rank: int, world: int) -> None:
    torch.distributed.is_initialized = lambda: world > 1
    torch.distributed.get_rank = lambda group=None: rank
    torch.distributed.get_world_size = lambda group=None: world


class ZarrDataset(Peer):
    name = "zarr-torch-dataset 0.0.9"
    recipe = "zarr-torch-dataset 0.0.9 README (PyPI); benchmarks/harness.py run_reference"

    def open(self, ctx: Ctx, *, rank: int, world: int, workers: int):
        from zarrdataset import ZarrDataLoader, ZarrIterableDataset

        simulate_rank(rank, world)
        group = zarr.open_group(ctx.store, mode="r")
        ds = ZarrIterableDataset(
            samples=group["x"],
            targets=group["idx"],
            shuffle_chunks=True,
            chunks_shuffle_seed=ctx.seed,
            shuffle_buffer=True,
        )
        return ZarrDataLoader(dataset=ds, num_workers=workers, batch_size=ctx.batch_size, drop_last=True)

    def rows_of(self, batch) -> list[int]:
        return [int(i) for i in batch[1]]


if __name__ == "__main__":
    main(ZarrDataset())
