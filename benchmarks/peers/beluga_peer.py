"""zarr-beluga 0.3.0 (``import beluga``): a Rust reader handed each epoch's whole order, one process, samples
handed to torch without a copy; ``beluga.torch.BelugaDataset`` in a ``DataLoader`` that stacks its samples.

Recipe, from the installed package itself (the PyPI wheel's README in its METADATA, and the docstrings of
``beluga``, ``beluga._open`` and ``beluga.torch``): ``beluga.open_zarr_group(dir, group, variables=...)`` for a
group of one array per variable, ``beluga.Reader(dir, root=..., source="zarr", scheduler="zarrs", sched=...)`` for
a single array ``data`` (with the settings ``open_zarr_group`` uses, ``beluga._open.SCHED``, and the
``zarr_read = fetch_decode`` of the Reader docstring's example; over HTTP ``store="objstore-rt"`` with
``beluga._open.REMOTE_STORE_OPTIONS`` and ``allow_http``, as ``open_zarr_group`` opens a URL), then
``BelugaDataset(reader or reader factory, frames=..., seed=..., rank=..., world_size=..., drop_last=True)``
iterated through ``torch.utils.data.DataLoader``; ``set_epoch`` before each epoch; with workers, a picklable
reader factory (each worker opens its own reader and streams every ``num_workers``-th sample of the rank's
order: "works but loses the benefits", beluga.torch's docstring says). Neither the dataset nor the reader
offers a state to save: mid-epoch resume is ``no API``.

Its readers name dimensions themselves: ``(time, [level,] lat, lon)`` for a group, an array called ``data``
for a single array. The peers' store (``x`` of ``(row, channel, lat, lon)``, 128 rows per chunk) is therefore
converted (``convert``) into beluga's own frame layout, one row per chunk, Blosc lz4 + shuffle
(``layouts.write_frame``), and read there; the ``layout`` job also reads the store as it is, through a
metadata-only view (``layouts.write_view``), where beluga reads and decodes a whole 128-row chunk for every
row it delivers.

The row numbers: beluga returns only the float data (no ``idx``), so each sample is matched to its row of the
peers' store by its first four values (:func:`row_keys`, read from the store with zarr; checked unique), so the
checks still judge rows the loader read, and a sample that is no row of the store is an error.
"""

from __future__ import annotations

import functools

import beluga
import beluga_layouts as layouts
import numpy as np
import torch
import zarr
from beluga._open import REMOTE_STORE_OPTIONS, SCHED
from beluga.torch import BelugaDataset
from common import Ctx, NoAPI, Peer, main

KEY_VALUES = 4  # values of a row (channel 0, first line of the grid) that identify it


# a single array: open_zarr_group's tuned settings, reading whole chunks asynchronously and decoding them with
# zarrs (``zarr_read = fetch_decode``, the Reader docstring's example; faster than the default here, on disk and
# over HTTP, where the default keeps about one request in flight)
SINGLE_ARRAY_SCHED = {**SCHED, "extra": {"zarr_read": "fetch_decode"}}


def open_reader(kind: str, path: str) -> beluga.Reader:
    """A reader over the store at ``path`` (a folder, or an ``http://`` URL) laid out as ``kind`` (a module-level
    function: picklable for workers)."""
    remote = "://" in path
    folder, _, name = path.rstrip("/").rpartition("/")
    if kind in ("frame", "sharded"):
        options = {**REMOTE_STORE_OPTIONS, "allow_http": "true"}
        where = {"store": "objstore-rt", "store_options": options} if remote else {}
        return beluga.Reader(folder, root=name, source="zarr", scheduler="zarrs", sched=SINGLE_ARRAY_SCHED, **where)
    options = {"store_options": {"allow_http": "true"}} if remote else {}
    if kind == "wb2":
        return beluga.open_zarr_group(folder, name, variables=layouts.wb2_variables(), **options)
    if kind == "view":
        return beluga.open_zarr_group(folder, name, variables=["x"], **options)
    raise ValueError(f"unknown layout {kind!r}")


@functools.cache
def row_keys(store: str) -> dict[bytes, int]:
    """``{first values of a row: its row number}`` of the peers' store (``x``), read with zarr."""
    x = zarr.open_group(store, mode="r")["x"]
    keys = np.ascontiguousarray(x[:, 0, 0, :KEY_VALUES])
    table = {keys[r].tobytes(): r for r in range(len(keys))}
    if len(table) != len(keys):
        raise ValueError(f"{len(keys) - len(table)} rows of {store} share their first values: pick more KEY_VALUES")
    return table


class Beluga(Peer):
    name = "zarr-beluga 0.3.0"
    recipe = "the zarr-beluga 0.3.0 wheel: README (METADATA), beluga/_open.py, beluga/torch.py docstrings"
    converts = True

    def convert(self, ctx: Ctx) -> None:
        layouts.write_frame(zarr.open_group(ctx.store, mode="r")["x"], ctx.converted)

    def _loader(self, reader_factory, ctx: Ctx, *, frames: int, rank: int, world: int, workers: int):
        """``BelugaDataset`` in a ``DataLoader`` of ``ctx.batch_size``; with batch size 0 the dataset alone
        (its samples one by one, zero-copy views: what a GPU loop uploads and stacks on the device, as beluga's
        ``WindowLoader`` does). The hand-over queue holds two batches, as ``WindowLoader`` sets it."""
        dataset = BelugaDataset(
            reader_factory,
            frames=frames,
            shuffle=True,
            seed=ctx.seed,
            rank=rank,
            world_size=world,
            drop_last=True,
            queue_depth=2 * max(1, ctx.batch_size),
        )
        if ctx.batch_size == 0:
            if workers:
                raise NoAPI  # samples one by one: in this process only
            return dataset
        return torch.utils.data.DataLoader(dataset, batch_size=ctx.batch_size, num_workers=workers, drop_last=True)

    def open(self, ctx: Ctx, *, rank: int, world: int, workers: int):
        self.keys = row_keys(ctx.store)
        factory = functools.partial(open_reader, "frame", str(ctx.converted))
        return self._loader(factory, ctx, frames=1, rank=rank, world=world, workers=workers)

    def epoch(self, loader, epoch: int):
        getattr(loader, "dataset", loader).set_epoch(epoch)
        return iter(loader)

    def rows_of(self, batch) -> list[int]:
        """Each sample's row, found by its first values (a sample that is no row of the store raises)."""
        first = np.ascontiguousarray(batch[:, 0, 0, 0, :KEY_VALUES].numpy())
        try:
            return [self.keys[k.tobytes()] for k in first]
        except KeyError:
            raise AssertionError("beluga delivered a sample that is no row of the peers' store") from None

    def state(self, loader, iterator):
        if not hasattr(loader.dataset, "state_dict"):  # BelugaDataset 0.3.0 has none, nor has its reader
            raise NoAPI
        return loader.dataset.state_dict()

    def open_layout(self, ctx: Ctx, *, kind: str, frames: int, workers: int):
        path = ctx.store
        if kind == "course":  # the peers' store as it is: read through a view with beluga's dimension names
            path = str(layouts.write_view(ctx.store, "x", ctx.work / "view.zarr"))
            kind = "view"
        factory = functools.partial(open_reader, kind, path)
        return self._loader(factory, ctx, frames=frames, rank=0, world=1, workers=workers)

    def samples_in(self, batch) -> int:
        return 1 if batch.dim() == 4 else len(batch)  # a sample (frames, channels, lat, lon) or a batch of them


if __name__ == "__main__":
    main(Beluga())
