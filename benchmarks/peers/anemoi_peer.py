"""anemoi-datasets 0.5.47: the store rebuilt by ``anemoi-datasets create`` from a NetCDF copy, read with
``open_dataset`` by the sampling of anemoi-training's ``NativeGridDataset``.

Recipe: github.com/ecmwf/anemoi-datasets docs (building a dataset from a recipe with a ``netcdf`` source:
``dates: {start, end, frequency}``, ``input: {netcdf: {path}}``, then ``anemoi-datasets create recipe.yaml
out.zarr``; reading with ``open_dataset(path)``, ``ds[i]`` = date ``i`` as (variables, ensembles, grid points))
and github.com/ecmwf/anemoi-training ``src/anemoi/training/data/dataset.py`` (how anemoi's own training reads it:
an ``IterableDataset`` that gives each rank a contiguous share of the valid dates, ``len // ranks``, each of
its workers a contiguous part, ``share // workers``, and draws that part in a random order from a generator
seeded once per worker, in ``worker_init_fn``; ``DataLoader(..., persistent_workers=True)``). Written here
from that description with one-date samples (``multistep=1, rollout=0``). anemoi-training refuses
``num_workers=0``; the 0-worker row runs the rank's share as one worker would.

The conversion: the Zarr v3 store to NetCDF in the project's environment (``anemoi_export.py``; this
environment's zarr 2.18 cannot open v3), then ``anemoi-datasets create``; timed together, the disk is the
anemoi dataset's (the NetCDF file is deleted). A few dates are compared with the store's rows after it.
There is no state to save: the resumes are ``no API``.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from anemoi.datasets import open_dataset
from common import Ctx, Peer, main
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

HERE = Path(__file__).resolve().parent
RECIPE = """dates:
  start: 2000-01-01T00:00:00
  end: {end}
  frequency: 6h
input:
  netcdf:
    path: {path}
"""


class AnemoiDates(IterableDataset):
    """One rank's dates, as anemoi-training's ``NativeGridDataset`` samples them (one date per sample)."""

    def __init__(self, path: str, rank: int, world: int, seed: int):
        self.rank, self.world, self.seed = rank, world, seed
        self.data = open_dataset(path)  # in the main process, as anemoi-training passes its ``data_reader``
        self.rng = None

    def per_worker_init(self, n_workers: int, worker_id: int) -> None:
        share = len(self.data) // self.world  # the remainder is dropped, as anemoi-training does
        per_worker = share // n_workers
        low = self.rank * share + worker_id * per_worker
        self.dates = np.arange(low, low + per_worker)
        self.rng = np.random.default_rng(self.seed * (self.rank + 1) - worker_id)

    def __iter__(self):
        if self.rng is None:  # no worker processes: the rank's share read as one worker
            self.per_worker_init(1, 0)
        for i in self.rng.choice(self.dates, size=len(self.dates), replace=False):
            yield {"idx": int(i), "x": torch.from_numpy(self.data[int(i)])}


def worker_init(worker_id: int) -> None:
    info = get_worker_info()
    info.dataset.per_worker_init(info.num_workers, worker_id)


class Anemoi(Peer):
    name = "anemoi-datasets"
    recipe = "github.com/ecmwf/anemoi-datasets (create, open_dataset); ecmwf/anemoi-training data/dataset.py"
    converts = True

    @staticmethod
    def dataset(ctx: Ctx) -> str:
        return str(ctx.converted / "dataset.zarr")  # create wants the .zarr suffix

    def convert(self, ctx: Ctx) -> None:
        netcdf = ctx.work / "rows.nc"
        project_python = os.environ.get("PEERS_PROJECT_PYTHON", sys.executable)
        subprocess.run([project_python, str(HERE / "anemoi_export.py"), ctx.store, str(netcdf)], check=True)
        end = np.datetime64("2000-01-01T00:00") + np.timedelta64(6 * (ctx.rows - 1), "h")
        recipe = ctx.work / "recipe.yaml"
        recipe.write_text(RECIPE.format(end=str(end), path=netcdf))
        create = Path(sys.executable).with_name("anemoi-datasets")
        ctx.converted.mkdir(parents=True)
        done = subprocess.run(
            [str(create), "create", str(recipe), self.dataset(ctx), "--overwrite"], capture_output=True, text=True
        )
        if done.returncode:
            raise RuntimeError(f"anemoi-datasets create failed: {done.stderr.strip().splitlines()[-1:]}")
        self._check(ctx, netcdf)
        netcdf.unlink()
        Path(str(netcdf) + ".check.npz").unlink()

    def _check(self, ctx: Ctx, netcdf: Path) -> None:
        """The dataset anemoi built holds the store's rows, date i = row i (three rows compared, every value)."""
        ds = open_dataset(self.dataset(ctx))
        assert len(ds) == ctx.rows, (len(ds), ctx.rows)
        with np.load(str(netcdf) + ".check.npz") as some:
            for i, row in zip(some["idx"], some["x"], strict=True):
                got = ds[int(i)]  # (variables, ensembles, grid points)
                assert np.array_equal(got[:, 0, :], row), f"date {i} differs from row {i} of the store"

    def open(self, ctx: Ctx, *, rank: int, world: int, workers: int):
        dataset = AnemoiDates(self.dataset(ctx), rank, world, ctx.seed + 42)
        extra = {"worker_init_fn": worker_init, "persistent_workers": True} if workers else {}
        return DataLoader(dataset, batch_size=ctx.batch_size, num_workers=workers, drop_last=True, **extra)


if __name__ == "__main__":
    main(Anemoi())
