"""``ZarrIterableDataset``: each DataLoader worker streams whole batches of its share of an epoch.

Every process (rank, worker) evaluates the same pure plan (:mod:`zarrtorch.plan`) and reads only its own
pieces; batches are assembled inside the worker through the bounded shuffle buffer
(:mod:`zarrtorch.buffer`), so whole batches, not samples, cross the process boundary. The epoch, the
resume point and the rank/world size are set by :class:`zarrtorch.ZarrDataLoader` in a small shared-memory
tensor, which reaches workers whatever their start method, persistent or not.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from zarrtorch.buffer import SlotBuffer, buffer_rng, id_reader, rank_batches, schedule
from zarrtorch.layout import FirstAxisLayout, check_first_axis_layout
from zarrtorch.plan import RankPlan, epoch_plan, resume_roles
from zarrtorch.reader import PieceReader
from zarrtorch.source import open_arrays

# Layout of the shared context tensor written by ZarrDataLoader.
CTX_EPOCH, CTX_SKIP, CTX_RANK, CTX_WORLD, CTX_SET = range(5)


@dataclass(frozen=True)
class LoaderConfig:
    """What the DataLoader decides and every worker must agree on."""

    batch_size: int
    drop_last: bool
    num_workers: int


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class ZarrIterableDataset(IterableDataset):
    """Stream rows of first-axis-chunked Zarr arrays as batches: ``{name: tensor}``.

    Iterate it through :class:`zarrtorch.ZarrDataLoader`, which sets the batch size, epoch and topology.

    Args:
        source: a zarr Group, a path/URL of a store, a mapping name -> zarr.Array, or a store written by
            xarray (its data variables sharing the first dimension).
        arrays: subset of array names to load (default: all data arrays).
        shuffle: shuffle the chunk order every epoch (shared seed) and rows in the buffer.
        seed: the seed every process shares; together with the epoch it fixes the whole epoch's order.
        buffer_chunks: shuffle-buffer size per worker, in chunks; memory per worker is about
            ``(buffer_chunks + decode_threads + 2) x chunk bytes`` (see ``worker_memory_bytes``).
            ``0`` means *chunk order only*: with ``shuffle=True`` the chunk order still changes every
            epoch, but there is no row buffer, so each worker streams its rows in order (increasing runs
            inside each chunk) and holds no buffer memory. Without ``shuffle`` the buffer is not used.
        decode_threads: threads decoding chunks per process (default: the process's share of the CPUs).
        cache: keep the rows a process reads in RAM and reuse them in later epochs; the chunk-to-rank
            assignment is then frozen at epoch 0's (the order inside each process still changes).
            For data that fits in the cluster's memory.
        allow_shards: accept sharded arrays, the shard being the unit of reading and distribution.
        return_index: add ``"index"``, the global row numbers of the batch (useful to check and to
            de-duplicate evaluation padding).
        transform: a picklable callable applied to each batch dict inside the worker.
        check_chunks: raise if a chunk is missing from the store instead of reading the fill value.
        row_range: ``(start, stop)``: use only these rows, e.g. a training period and a validation
            period of one store, without copying. ``start`` must fall on a chunk boundary, and so must
            ``stop`` unless it is the end. Row numbers (``return_index``) stay those of the store.
    """

    def __init__(self, source, *, arrays: Sequence[str] | None = None, shuffle: bool = True, seed: int = 0,
                 buffer_chunks: int = 8, decode_threads: int | None = None, cache: bool = False,
                 allow_shards: bool = False, return_index: bool = False,
                 transform: Callable[[dict], dict] | None = None, check_chunks: bool = True,
                 row_range: tuple[int, int] | None = None):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int shared by every process, got {seed!r}")
        if isinstance(buffer_chunks, bool) or int(buffer_chunks) != buffer_chunks or buffer_chunks < 0:
            raise ValueError(f"buffer_chunks must be an integer >= 0 (0: chunk order only, no row buffer), "
                             f"got {buffer_chunks!r}")
        if decode_threads is not None and decode_threads < 1:
            raise ValueError(f"decode_threads must be >= 1, got {decode_threads}")
        self.arrays = open_arrays(source, arrays)
        self.layout = check_first_axis_layout(self.arrays, allow_shards=allow_shards)
        self.row_offset = 0
        if row_range is not None:
            self.row_offset, self.layout = restrict_rows(self.layout, row_range)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.buffer_chunks = int(buffer_chunks)
        self.decode_threads = decode_threads
        self.cache = bool(cache)
        self.return_index = bool(return_index)
        self.transform = transform
        self.check_chunks = bool(check_chunks)
        self.config: LoaderConfig | None = None
        self._ctx: torch.Tensor | None = None
        self._cache_store: dict | None = None
        self._cache_owner: int | None = None

    # -- set-up by ZarrDataLoader -------------------------------------------------------------------
    def for_loader(self, config: LoaderConfig, ctx: torch.Tensor) -> "ZarrIterableDataset":
        """A copy bound to one loader (two loaders may share a dataset with other batch sizes)."""
        bound = copy.copy(self)
        bound.config = config
        bound._ctx = ctx
        bound._cache_store = None
        return bound

    @property
    def rows(self) -> int:
        return self.layout.rows

    @property
    def chunk_rows(self) -> int:
        return self.layout.chunk_rows

    @property
    def buffer_rows(self) -> int:
        return self.buffer_chunks * self.chunk_rows

    @property
    def row_bytes(self) -> int:
        """Bytes of one row of every array together (decoded)."""
        return sum(int(np.dtype(a.dtype).itemsize * np.prod(a.shape[1:], dtype=np.int64)) for a in self.arrays.values())

    def worker_memory_bytes(self, decode_threads: int = 1) -> int:
        """Decoded data one worker holds at most: the buffer, the chunks being decoded ahead, and one
        batch-sized chunk being consumed (see ``buffer_chunks``; no buffer without ``shuffle`` or with
        ``buffer_chunks=0``)."""
        held_chunks = (self.buffer_chunks if self._row_shuffle else 0) + decode_threads + 2
        return held_chunks * self.chunk_rows * self.row_bytes

    def _require_config(self) -> LoaderConfig:
        if self.config is None:
            raise TypeError(
                "iterate a ZarrIterableDataset through zarrtorch.ZarrDataLoader(dataset, batch_size=...): "
                "the loader decides the batch size, epoch and rank split that every worker must agree on"
            )
        return self.config

    def topology(self) -> tuple[int, int, int, int]:
        """(epoch, batches to skip, rank, world size) as set by the loader, else from torch.distributed."""
        if self._ctx is not None and int(self._ctx[CTX_SET]):
            e, s, r, w = (int(v) for v in self._ctx[:4])
            return e, s, r, w
        if get_worker_info() is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise RuntimeError("this worker cannot know its rank: iterate the dataset through zarrtorch.ZarrDataLoader")
        rank, world = distributed_topology()
        return 0, 0, rank, world

    def plan(self, *, epoch: int, rank: int = 0, world_size: int = 1, num_workers: int | None = None,
             batch_size: int | None = None, drop_last: bool | None = None) -> RankPlan:
        """The epoch's plan for one rank (defaults from the loader's configuration)."""
        cfg = self.config
        return epoch_plan(
            self.rows, self.chunk_rows, seed=self.seed, epoch=epoch,
            batch_size=batch_size if batch_size is not None else self._require_config().batch_size,
            drop_last=drop_last if drop_last is not None else self._require_config().drop_last,
            world_size=world_size, rank=rank,
            num_workers=num_workers if num_workers is not None else (cfg.num_workers if cfg else 0),
            shuffle=self.shuffle, freeze_partition=self.cache,
        )

    @property
    def _row_shuffle(self) -> bool:
        """Whether rows go through the shuffle buffer (``shuffle`` and ``buffer_chunks >= 1``)."""
        return self.shuffle and self.buffer_chunks > 0

    def _buffer_rng(self, epoch: int, rank: int, worker: int):
        """The buffer's generator; ``None`` streams the rows in order (no shuffle, or chunk order only)."""
        return buffer_rng(self.seed, epoch, rank, worker, self._row_shuffle)

    def batch_row_ids(self, *, epoch: int, rank: int = 0, world_size: int = 1, num_workers: int | None = None,
                      batch_size: int | None = None, drop_last: bool | None = None) -> list[np.ndarray]:
        """The global row numbers of every batch the loader yields on ``rank``, in order — computed
        without reading data (the same schedule the workers run)."""
        plan = self.plan(epoch=epoch, rank=rank, world_size=world_size, num_workers=num_workers,
                         batch_size=batch_size, drop_last=drop_last)
        batches = rank_batches(plan, seed=self.seed, chunk_rows=self.chunk_rows, buffer_chunks=self.buffer_chunks,
                               row_shuffle=self._row_shuffle)
        return [b + self.row_offset for b in batches]

    def __len__(self) -> int:
        cfg = self._require_config()
        _, _, rank, world = self.topology()
        return self.plan(epoch=0, rank=rank, world_size=world, num_workers=cfg.num_workers).batches

    # -- iteration (runs in each worker, or in the main process) ------------------------------------
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        cfg = self._require_config()
        epoch, skip, rank, world = self.topology()
        info = get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info is not None else (0, 0)
        if n_workers != cfg.num_workers:
            raise RuntimeError(f"the loader was configured for {cfg.num_workers} workers but runs {n_workers}")
        plan = self.plan(epoch=epoch, rank=rank, world_size=world, num_workers=n_workers)
        logical, worker_skip = resume_roles([len(w.batch_sizes) for w in plan.workers], skip)[worker]
        threads = self.decode_threads or max(1, available_cpus() // max(1, n_workers))
        if self.cache and (self._cache_store is None or self._cache_owner != logical):
            self._cache_store, self._cache_owner = {}, logical  # rows of another share would never be reused
        reader = PieceReader(self.arrays, self.chunk_rows, threads=threads, prefetch=threads + 1,
                             check_missing=self.check_chunks, cache=self._cache_store if self.cache else None)
        return self._stream(reader, plan.workers[logical], self._buffer_rng(epoch, rank, logical), worker_skip)

    def _columns(self):
        cols = {"index": ((), np.dtype(np.int64))}
        cols.update({n: (tuple(a.shape[1:]), np.dtype(a.dtype)) for n, a in self.arrays.items()})
        return cols

    def _stream(self, reader: PieceReader, wplan, rng, skip: int) -> Iterator[dict[str, torch.Tensor]]:
        pieces, sizes = wplan.pieces + self.row_offset, wplan.batch_sizes
        capacity = max(self.buffer_rows, int(max(sizes, default=1))) if rng is not None else 0
        steps = schedule(sizes, wplan.rows, capacity=self.buffer_rows, warmup_rows=self.chunk_rows, rng=rng)
        buf = SlotBuffer(capacity, self._columns())
        filled, piece, offset = 0, 0, 0
        if skip:  # replay the schedule on row ids only, then load what the buffer holds at that point
            ids = SlotBuffer(capacity, {"index": ((), np.dtype(np.int64))})
            id_read = id_reader(pieces)
            for _ in range(skip):
                _, filled = ids.apply(next(steps), id_read, filled)
            ids.flush()  # the last step's refill is deferred: run it before reading the buffer's contents
            piece, offset = id_read.state["piece"], id_read.state["offset"]
            if filled:
                held = ids.slots["index"][:filled]
                for name, rows in reader.read_rows(held).items():
                    buf.slots[name][:filled] = rows
                buf.slots["index"][:filled] = held
        chunks = reader.iter_pieces(pieces[piece:])
        current = {"data": None, "start": 0, "offset": offset, "rows": 0, "piece": piece - 1}

        def read(n: int) -> list[dict[str, np.ndarray]]:
            out = []
            while n > 0:
                if current["data"] is None or current["offset"] == current["rows"]:
                    current["piece"] += 1
                    current["data"] = next(chunks)
                    lo, hi = pieces[current["piece"]]
                    current["start"], current["rows"] = int(lo), int(hi - lo)
                    if current["piece"] != piece:
                        current["offset"] = 0
                a = current["offset"]
                b = min(current["rows"], a + n)
                seg = {name: col[a:b] for name, col in current["data"].items()}
                seg["index"] = np.arange(current["start"] + a, current["start"] + b, dtype=np.int64)
                out.append(seg)
                n -= b - a
                current["offset"] = b
            return out

        copy_views = self.cache  # cached arrays are reused: never hand out views of them
        try:
            for step in steps:
                batch, filled = buf.apply(step, read, filled)
                yield self._to_torch(batch, copy_views and bool(step.direct))
        finally:
            chunks.close()

    def _to_torch(self, batch: dict[str, np.ndarray], copy_arrays: bool) -> dict[str, torch.Tensor]:
        out = {}
        for name, arr in batch.items():
            if name == "index" and not self.return_index:
                continue
            out[name] = torch.from_numpy(arr.copy() if copy_arrays else arr)
        return self.transform(out) if self.transform is not None else out


def restrict_rows(layout: FirstAxisLayout, row_range: tuple[int, int]) -> tuple[int, FirstAxisLayout]:
    """Offset and layout of a chunk-aligned row window (a split that keeps whole chunks)."""
    start, stop = (int(v) for v in row_range)
    c = layout.chunk_rows
    if not 0 <= start < stop <= layout.rows:
        raise ValueError(f"row_range {row_range} must satisfy 0 <= start < stop <= {layout.rows} (the rows)")
    if start % c or (stop % c and stop != layout.rows):
        raise ValueError(f"row_range {row_range} must start on a chunk boundary (a multiple of {c}) and end on one "
                         f"or at the last row ({layout.rows}), so that chunks are not shared between splits")
    return start, FirstAxisLayout(rows=stop - start, chunk_rows=c, sharded=layout.sharded)


def distributed_topology() -> tuple[int, int]:
    """(rank, world size) of this process from torch.distributed, or (0, 1) outside DDP."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
