"""How a dataset reads its store (:class:`ReadOptions`), and the arguments of the dataset and the loader
checked up front, with messages that say what is allowed: a bad value found later, inside a worker, would
surface as a less readable error in every process at once."""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import dataclass, field

import numpy as np
from torch.utils.data import default_convert

from zarrtorch._read.cache import ChunkCache
from zarrtorch._read.columns import CF_DTYPES
from zarrtorch._read.fetch import RetryPolicy
from zarrtorch._read.source import fork_unsafe_stores
from zarrtorch._util.arguments import flag, whole_number

MISSING_CHUNKS = ("error", "fill")  # ReadOptions(missing_chunks=...)


@dataclass(frozen=True, kw_only=True)
class ReadOptions:
    """How a :class:`~zarrtorch.ZarrIterableDataset` reads its store, in one object (made once, shared by the
    datasets of a job, like :class:`~zarrtorch.RetryPolicy`).

    Args:
        decode_threads: threads decoding chunks per process (default: the process's share of the CPUs;
            one for a local store of small chunks, :func:`zarrtorch.readplan.default_decode_threads`).
        requests_in_flight: chunks read ahead at once per process, fixed; default ``decode_threads + 1`` for a
            local store, and for a remote one, where each request waits for the network, from 32 (at least 8) up to
            what 256 MiB of decoded chunks hold (at most 256), grown while the reads wait on latency, not in a queue.
        storage_options: for a URL: fsspec options (``endpoint_url``, ``key``/``secret``, ``anon``...);
            secrets among them never appear in a message.
        retry: timeout and retries for each remote request.
        missing_chunks: what a chunk with no stored object is: ``"error"`` (default) raises, naming it (and at
            construction where the store can list its keys); ``"fill"`` reads the array's fill value, as zarr
            does, for a store written with zarr's default ``write_empty_chunks=False``, which stores no chunk
            equal to the fill value everywhere. Stores written by ``prepare_zarr`` hold every chunk.
        decode_cf: decode CF-packed arrays (``scale_factor``, ``add_offset``, ``_FillValue``, ``_Unsigned``) as xarray
            does, time arrays and static arrays alike (the rule: :mod:`zarrtorch._read.columns`).
        cf_dtype: the dtype of decoded values: ``"float32"`` (xarray's values, computed in float64 as xarray computes
            them, rounded to float32) or ``"float64"`` (xarray's values exactly, twice the memory of a batch).
        cache_dir: a folder on the node's local disk (or RAM, ``/dev/shm``) where the chunks of a remote store are
            kept as stored, shared by the node's ranks and workers, so that later epochs read them from there
            instead of the network (:mod:`zarrtorch._read.cache`; ``docs/cache.md``). Local stores are read as
            they are. Emptied by ``zarrtorch.clear_cache(cache_dir)``.
        cache_limit_bytes: the most bytes ``cache_dir`` holds (the least recently used chunks are deleted to
            make room); ``None``: no limit.
    """

    decode_threads: int | None = None
    requests_in_flight: int | None = None
    storage_options: dict | None = field(default=None, hash=False)
    retry: RetryPolicy = RetryPolicy()
    missing_chunks: str = "error"
    decode_cf: bool = True
    cf_dtype: str = "float32"
    cache_dir: str | None = None
    cache_limit_bytes: int | None = None

    def __post_init__(self):
        for name in ("decode_threads", "requests_in_flight"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
                raise ValueError(f"{name} must be an integer >= 1 or None (the default), got {value!r}")
        object.__setattr__(self, "cf_dtype", _cf_dtype(self.cf_dtype))
        if self.missing_chunks not in MISSING_CHUNKS:
            raise ValueError(f"missing_chunks must be 'error' or 'fill', got {self.missing_chunks!r}")
        if not isinstance(self.retry, RetryPolicy):
            raise TypeError(f"retry must be a zarrtorch.RetryPolicy, got {type(self.retry).__name__}")
        self._check_cache()

    def _check_cache(self) -> None:
        """Refuse a cache that cannot work now, by name: a folder that cannot be made or written, a limit that
        is not a positive whole number, a limit without a folder."""
        if self.cache_limit_bytes is not None:
            limit = whole_number(self.cache_limit_bytes, "cache_limit_bytes (the cache's size in bytes)", least=1)
            object.__setattr__(self, "cache_limit_bytes", limit)
            if self.cache_dir is None:
                raise ValueError(
                    "cache_limit_bytes bounds the chunk cache: give its folder too, ReadOptions(cache_dir=...)"
                )
        if self.cache_dir is None:
            return
        if not isinstance(self.cache_dir, (str, os.PathLike)) or not str(self.cache_dir):
            raise TypeError(f"cache_dir must be a folder's path (a str or Path), got {self.cache_dir!r}")
        object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
        try:
            self.chunk_cache().prepare()
        except OSError as exc:
            raise ValueError(
                f"cache_dir={self.cache_dir!r} cannot hold the chunk cache ({type(exc).__name__}: {exc}): give a "
                "folder on the node's local disk that this process can write, e.g. /tmp/zarrtorch-cache"
            ) from None

    def chunk_cache(self) -> ChunkCache | None:
        """The chunk cache these options ask for (``None``: none)."""
        return None if self.cache_dir is None else ChunkCache(self.cache_dir, self.cache_limit_bytes)


def _cf_dtype(value) -> str:
    """``value`` as one of :data:`~zarrtorch._read.columns.CF_DTYPES` (a string, or a numpy dtype or type)."""
    try:
        name = np.dtype(value).name if value is not None else None
    except TypeError:
        name = None
    if name not in CF_DTYPES:
        raise ValueError(f"cf_dtype must be 'float32' (the default) or 'float64', got {value!r}")
    return name


BATCH_ORDERS = ("worker", "rank")


def check_loader_settings(
    dataset, batch_size, num_workers, rank, world_size, work_ahead, transport, kwargs, batch_order="worker"
) -> None:
    """Refuse ZarrDataLoader arguments that cannot work, saying what to do instead (``kwargs`` loses the
    sampler arguments, which the dataset's own settings replace). The numbers are checked by
    :func:`loader_numbers` first."""
    for name in ("sampler", "batch_sampler", "shuffle"):
        if kwargs.get(name) not in (None, False):
            raise ValueError(
                f"{name}= is not used by ZarrDataLoader: order and shuffling are set on the "
                "ZarrIterableDataset (shuffle=, seed=, buffer_chunks=)"
            )
        kwargs.pop(name, None)
    if kwargs.get("collate_fn") not in (None, default_convert):
        raise ValueError(
            "collate_fn= is not used by ZarrDataLoader: it yields whole batches, assembled in the workers from "
            "the shuffle buffer, as dicts of tensors. To change a batch, pass transform= (a picklable function "
            "batch dict -> batch dict) to ZarrIterableDataset; it runs on every batch, in the workers"
        )
    if kwargs.get("in_order", True) is False:
        raise ValueError("in_order=False would make the batch order depend on timing; resuming needs it True")
    if dataset.keep_in_memory and num_workers > 0 and not kwargs.get("persistent_workers", False):
        raise ValueError("keep_in_memory=True keeps rows in the worker processes: also pass persistent_workers=True")
    check_start_method(dataset, num_workers, kwargs.get("multiprocessing_context"))
    if transport not in (None, "ring", "queue"):
        raise ValueError(f"transport must be 'ring' or 'queue' (zarrtorch._workers.ring) or None, got {transport!r}")
    if transport == "ring" and (dataset.transform is not None or dataset.stack):
        what = "transform" if dataset.transform is not None else "stack"
        raise ValueError(
            f"transport='ring' carries batches in slots shaped like the stored arrays, and a {what} changes them "
            "after they are gathered: leave transport to the loader (None: the queue for such a dataset) or pass "
            "transport='queue'"
        )
    check_batch_order(dataset, num_workers, transport, batch_order)


def check_batch_order_name(batch_order) -> None:
    """Refuse a ``batch_order`` that is not one of :data:`BATCH_ORDERS`, saying what each means."""
    if batch_order not in BATCH_ORDERS:
        raise ValueError(
            f"batch_order must be 'worker' (the default: each DataLoader worker forms its own batches, which then "
            f"depend on num_workers) or 'rank' (the rank's batches are the same for any num_workers), got "
            f"{batch_order!r}"
        )


def check_batch_order(dataset, num_workers, transport, batch_order) -> None:
    """Refuse a ``batch_order`` that is not one, and what ``batch_order="rank"`` cannot combine with when workers
    read (with ``num_workers=0`` the one process reads and assembles, as in the default order)."""
    check_batch_order_name(batch_order)
    if batch_order != "rank" or num_workers == 0:
        return
    if transport == "ring":
        raise ValueError(
            "transport='ring' carries batches formed in the workers, and with batch_order='rank' the training "
            "process forms them from the pieces the workers read: leave transport out (or pass 'queue')"
        )
    if dataset.keep_in_memory:
        raise ValueError(
            "keep_in_memory=True with batch_order='rank' and num_workers > 0 is not supported: the rows would be "
            "kept by workers that each read another share of the pieces, which changes with num_workers. Pass "
            "num_workers=0 (the training process reads and keeps them), or batch_order='worker'"
        )


def worker_start_method(context) -> str:
    """How DataLoader will start the workers: the ``multiprocessing_context`` given (a name or a context), else
    the start method set in this process, else the platform's default (read without fixing it)."""
    if isinstance(context, str):
        return context
    if context is not None:
        return context.get_start_method()
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]


def check_start_method(dataset, num_workers: int, context) -> None:
    """Refuse workers that could not read the dataset's stores (:func:`~zarrtorch._read.source.fork_unsafe_stores`):
    they would wait out every chunk's retries instead of failing now."""
    if num_workers == 0:
        return
    method = worker_start_method(context)
    if fork_unsafe_stores([a.store for a in dataset.arrays.values()], method):
        raise ValueError(
            f"this dataset reads through obstore (zarr.storage.ObjectStore), which does not work in workers started "
            f"by {method!r}: a forked worker's requests are never answered. Pass multiprocessing_context='forkserver'"
            " (or 'spawn') to ZarrDataLoader, or num_workers=0, or open the store by its URL (zarrtorch's own client)"
        )


def loader_numbers(batch_size, drop_last, num_workers, rank, world_size, work_ahead, check_ranks) -> tuple:
    """The loader's numbers and flags as ints and bools, each refused by name when it is not one (``rank=1.7``
    ran as rank 1, ``drop_last="no"`` as True)."""
    batch_size = whole_number(batch_size, "batch_size", least=1)
    num_workers = whole_number(num_workers, "num_workers", least=0)
    work_ahead = whole_number(work_ahead, "work_ahead (batches assembled ahead)", least=0)
    if (rank is None) != (world_size is None):
        raise ValueError("give both rank and world_size, or neither (then torch.distributed decides)")
    if world_size is not None:
        world_size = whole_number(world_size, "world_size", least=1)
        rank = whole_number(rank, "rank", least=0, below=world_size)
    return (
        batch_size,
        flag(drop_last, "drop_last"),
        num_workers,
        rank,
        world_size,
        work_ahead,
        flag(check_ranks, "check_ranks"),
    )
