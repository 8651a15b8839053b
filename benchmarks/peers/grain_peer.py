"""Grain 0.2.18: ``MapDataset`` pipeline with a chunk-friendly shuffle, converted to an ``IterDataset`` with
threaded reads, ``mp_prefetch`` for worker processes.

Recipe: github.com/google/grain docs/tutorials/dataset_basic_tutorial.md (``MapDataset.source``/``range``,
``shuffle``, slicing as the way to shard, ``batch``, ``to_iter_dataset(grain.ReadOptions(num_threads=...))``,
``DatasetIterator.get_state()/set_state()``), docs/data_sources/protocol.rst (a random-access source:
``__len__`` + thread-safe ``__getitem__``) and the ``MapDataset.pipe`` docstring (``WindowShuffleMapDataset``).
The best read pattern those allow here: a global row shuffle would decode a whole 8 MiB chunk for every
64 KiB row, and batched reads (``_getitems`` pushed down by ``batch``) are switched off in 0.2.18, so the order
is chunk-wise: the chunks in a shuffled order (``MapDataset.range(chunks).shuffle``), rows shuffled inside each
chunk (``WindowShuffleMapDataset`` with a window of one chunk), and a source that keeps its last decoded
chunks (thread-safe), so a chunk is decoded about once per process. Each rank takes an equal contiguous slice
of that order, a whole number of chunk lengths. A partial last chunk is one more chunk in the shuffled order:
the windows of the row shuffle then follow chunk lengths from the start of the order, so the windows after the
short chunk straddle two chunks (still every row once; a window reads two chunks instead of one).
"""

import threading
from collections import OrderedDict

import grain
import numpy as np
import zarr
from common import Ctx, Peer, main


class ZarrRowSource:
    """Random-access source of rows; decodes a row's whole chunk once and keeps the last ``keep`` chunks."""

    def __init__(self, store: str, chunk_rows: int, keep: int = 4):
        self.store, self.chunk_rows, self.keep = store, chunk_rows, keep
        self.n = zarr.open_group(store, mode="r")["idx"].shape[0]
        self._chunks, self._lock, self._group = OrderedDict(), None, None

    def __len__(self) -> int:
        return self.n

    def _chunk(self, c: int) -> dict:
        if self._lock is None:  # per process (forked workers): the arrays and the lock are opened here
            self._lock, self._group = threading.Lock(), zarr.open_group(self.store, mode="r")
        with self._lock:
            entry = self._chunks.get(c)
            if entry is None:
                entry = self._chunks[c] = {"ready": threading.Event(), "data": None}
                owner = True
                while len(self._chunks) > self.keep:
                    self._chunks.popitem(last=False)
            else:
                owner = False
        if owner:
            s = slice(c * self.chunk_rows, (c + 1) * self.chunk_rows)
            entry["data"] = {"x": self._group["x"][s], "idx": self._group["idx"][s]}
            entry["ready"].set()
        entry["ready"].wait()
        return entry["data"]

    def __getitem__(self, row: int) -> dict:
        c, i = divmod(int(row), self.chunk_rows)
        data = self._chunk(c)
        return {"x": data["x"][i], "idx": data["idx"][i]}


def chunk_ordered_rows(chunks: list[int], chunk_rows: int, rows: int) -> np.ndarray:
    """The store's rows chunk by chunk in the order ``chunks``, each chunk's rows in order (the last chunk may be
    shorter): entry ``p`` is the row at position ``p`` of the epoch before the row shuffle inside each window. On
    whole chunks it is ``chunks[p // c] * c + p % c``."""
    return np.concatenate([np.arange(k * chunk_rows, min((k + 1) * chunk_rows, rows)) for k in chunks])


class Grain(Peer):
    name = "Grain"
    recipe = "github.com/google/grain docs/tutorials/dataset_basic_tutorial.md, docs/data_sources/protocol.rst"

    def open(self, ctx: Ctx, *, rank: int, world: int, workers: int):
        return {
            "ctx": ctx,
            "rank": rank,
            "world": world,
            "workers": workers,
            "source": ZarrRowSource(ctx.store, ctx.chunk_rows),
        }

    def dataset(self, loader: dict, epoch: int):
        ctx, c = loader["ctx"], loader["ctx"].chunk_rows
        seed = ctx.seed + 1000 * epoch  # a new order every epoch
        shuffled = grain.MapDataset.range(-(-ctx.rows // c)).shuffle(seed=seed)  # the partial last chunk too
        chunks = [shuffled[i] for i in range(len(shuffled))]  # once: indexing grain's shuffle costs ms
        in_chunk_order = chunk_ordered_rows(chunks, c, ctx.rows)
        positions = grain.MapDataset.range(ctx.rows).pipe(
            grain.experimental.WindowShuffleMapDataset, window_size=c, seed=seed
        )
        rows = positions.map(lambda p: in_chunk_order[p])
        share = ctx.rows // loader["world"] // c * c  # as many rows per rank, a whole number of chunk lengths
        rows = rows[loader["rank"] * share : (loader["rank"] + 1) * share]
        ds = rows.map(loader["source"].__getitem__).batch(ctx.batch_size, drop_remainder=True)
        it = ds.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=2 * ctx.batch_size))
        if loader["workers"]:
            it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=loader["workers"]))
        return it

    def epoch(self, loader, epoch: int):
        loader["epoch"] = epoch
        return iter(self.dataset(loader, epoch))

    def state(self, loader, iterator):
        return {"epoch": loader["epoch"], "iterator": iterator.get_state()}

    def restore(self, ctx: Ctx, state, *, rank: int, world: int, workers: int):
        loader = self.open(ctx, rank=rank, world=world, workers=workers)
        loader["restore"] = state
        return loader

    def epoch_after_restore(self, loader, epoch):  # noqa: D401 - used by epoch() when a state is pending
        it = iter(self.dataset(loader, epoch))
        it.set_state(loader.pop("restore")["iterator"])
        return it


def _epoch(self, loader, epoch: int):
    loader["epoch"] = epoch
    return self.epoch_after_restore(loader, epoch) if "restore" in loader else iter(self.dataset(loader, epoch))


Grain.epoch = _epoch

if __name__ == "__main__":
    main(Grain())
