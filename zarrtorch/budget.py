"""The host memory a loader holds at most, all of its processes together: the figure to size a job with.

A job's memory per GPU is the loader's data on top of what any PyTorch process holds: the decoded chunks of
every reading process (:func:`reader_bytes`), with ``keep_in_memory=True`` the rows each
process keeps, the stored bytes its reading threads hold (a chunk file read into a thread's buffer, or the
answer of a remote request in flight), the ring of batch slots the main process shares with its workers
(:mod:`zarrtorch._workers.ring`) or, with ``pin_memory=True`` and no workers on a GPU, the page-locked slots batches
are gathered into (:mod:`zarrtorch._workers.pinned`), the batches waiting in the main process, and what each
process of the loader holds besides its data (:data:`MAIN_PROCESS_BYTES`, :data:`WORKER_PROCESS_BYTES`). Pages of
library files (torch's, numpy's code) are not counted: they are the OS page cache's, shared by every process that maps
them. ``benchmarks/run.py`` compares this prediction with what it measures (``benchmarks/README.md``, "Memory").
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from zarrtorch._read.columns import decode_block_bytes
from zarrtorch._read.fastpath import SHARD_INDEX_CACHE_BYTES, read_buffer_bytes, shard_index_cache_bytes
from zarrtorch._read.source import is_local
from zarrtorch._util.cgroup import cgroup_memory_limit
from zarrtorch._util.sizes import held_chunks
from zarrtorch._workers.dealt import PIECES_PER_ITEM
from zarrtorch.plan import Topology, shuffles_rows
from zarrtorch.readplan import ReadPlan
from zarrtorch.window_stream import window_chunks_for_batches

MiB = 2**20
# What a process of the loader holds besides its data (anonymous and private dirty memory): the main process's
# reading threads' stacks and the loader's Python objects; a forked DataLoader worker's own objects and
# allocator heap, its threads' stacks and the pages it and its parent copy on write after the fork. Both are
# measured by benchmarks/run.py; the figures behind these margins are in benchmarks/README.md ("Memory").
MAIN_PROCESS_BYTES = 6 * MiB
WORKER_PROCESS_BYTES = 16 * MiB
# The most of a cgroup memory limit (a container's, a Kubernetes pod's, a JupyterHub kernel's) the loaders of
# the processes in it should take: the kernel kills at the limit, and the rest holds the model, the optimiser,
# PyTorch itself, the notebook's own objects and the page cache the cgroup is charged for.
MEMORY_LIMIT_SHARE = 0.5


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes, at most: ``readers`` processes holding ``per_reader`` decoded data each, the rows ``kept`` by
    all of them together (``keep_in_memory=True``), their ``read_buffers`` (compressed chunk files), the ``ring``
    of shared batch slots (or the pinned ones), ``batches`` of ``batch_bytes`` held in the main process outside
    them, and with ``batch_order="rank"`` and workers, the decoded data the main process forms the batches from
    (``assembler``: its shuffle buffer and the pieces the workers sent ahead)."""

    readers: int
    per_reader: int
    ring: int
    batches: int
    batch_bytes: int
    kept: int = 0
    read_buffers: int = 0
    processes: int = 0  # what the main process and the workers hold besides the data
    memory_limit: int = 0  # the cgroup memory limit of the process that computed this budget; 0: none
    assembler: int = 0

    @property
    def total(self) -> int:
        decoded = self.readers * self.per_reader + self.kept + self.assembler
        return decoded + self.read_buffers + self.ring + self.batches * self.batch_bytes + self.processes

    @property
    def within_memory_limit(self) -> bool:
        """This loader takes at most :data:`MEMORY_LIMIT_SHARE` of the cgroup's memory limit (true without one).
        One loader: the ranks of a node that share a container share its limit (``audit --ranks-per-node``)."""
        return within_memory_limit(self.total, self.memory_limit)


@dataclass(frozen=True)
class MixMemory:
    """The memory of a :class:`zarrtorch.MixedLoader`: every source's loader holds its own processes, buffers and
    ring at once (a source not drawn at a step keeps its workers and its work-ahead batches), so the figure to size
    a job with is their sum."""

    sources: dict[str, MemoryBudget]

    @property
    def total(self) -> int:
        return sum(budget.total for budget in self.sources.values())

    @property
    def memory_limit(self) -> int:
        return max((budget.memory_limit for budget in self.sources.values()), default=0)

    @property
    def within_memory_limit(self) -> bool:
        return within_memory_limit(self.total, self.memory_limit)


def within_memory_limit(need: int, limit: int) -> bool:
    """``need`` bytes of loaders take at most :data:`MEMORY_LIMIT_SHARE` of a ``limit`` (0: no limit)."""
    return not limit or need <= MEMORY_LIMIT_SHARE * limit


def memory_limit_lines(need: int, limit: int) -> list[str]:
    """The audit's lines on this process's cgroup memory limit, for loaders needing ``need`` bytes: the limit
    and their share of it, and where that is over :data:`MEMORY_LIMIT_SHARE`, what to lower."""
    if not limit:
        return ["  memory limit         none on this process's cgroup (no container or pod limit)"]
    share, most = need / limit, f"{MEMORY_LIMIT_SHARE:.0%}"
    lines = [
        f"  memory limit         {limit / 2**30:,.2f} GiB (this process's cgroup: its container, pod or job); "
        f"the loader(s) take {share:.0%} of it, at most {most} advised"
    ]
    if not within_memory_limit(need, limit):
        lines.append(
            f"  {'OVER ' + most + ' OF LIMIT':<21}the model, PyTorch and the rest need what is left, and the "
            "kernel kills the process at the limit: lower num_workers, buffer_chunks, "
            "ReadOptions(requests_in_flight=...) or ReadOptions(decode_threads=...) until the loader(s) take at "
            f"most {most}, or ask for more memory"
        )
    return lines


def stored_bytes_bound(arr) -> int:
    """The most bytes one stored object of ``arr`` (a chunk, or a shard) can take: what a request for it
    receives. Its decoded size plus what a compressor may add (``ZSTD_COMPRESSBOUND`` and headers)."""
    shape = getattr(arr, "shards", None) or arr.chunks
    n = math.prod(shape) * np.dtype(arr.dtype).itemsize
    return n + (n >> 8) + max(0, (128 << 10) - n) // 2048 + (64 << 10)


def fetched_bytes(arrays: dict, threads: int) -> int:
    """Stored bytes one reading process holds at most in its ``threads`` reading threads: a local array's
    chunk file (or a shard's inner chunks read at once) in each thread's reusable buffer
    (:func:`zarrtorch._read.fastpath.read_buffer_bytes`); a remote array's answer to each request in flight (a
    whole chunk or shard, or a byte range of one), plus one more being copied on the event loop that receives
    them (the client joins the parts it received, zarr copies the buffer into ``bytes``); and the shard indexes
    the process caches (:func:`zarrtorch._read.fastpath.shard_index_cache_bytes`)."""
    local = sum(read_buffer_bytes(a) for a in arrays.values() if is_local(a))
    remote = sum(stored_bytes_bound(a) for a in arrays.values() if not is_local(a))
    indexes = min(SHARD_INDEX_CACHE_BYTES, sum(shard_index_cache_bytes(a) for a in arrays.values()))
    return threads * local + (threads + 1 if remote else 0) * remote + indexes


def reader_bytes(data, plan: ReadPlan, batch_size: int) -> int:
    """Decoded data one reading process holds at most (``data`` a :class:`~zarrtorch.ZarrIterableDataset`, its
    reads as ``plan`` says, batches of ``batch_size``): rows, the shuffle buffer (grown to a batch when a batch
    holds more rows: :func:`zarrtorch.buffer.buffer_capacity`), one chunk per read ahead and the chunk being
    consumed (:func:`zarrtorch._util.sizes.held_chunks`); windows, the chunks its batches draw from
    (:func:`zarrtorch.window_stream.window_chunks_for_batches`) and those read ahead; and what it decodes
    CF-packed columns in (:func:`decode_bytes`)."""
    if data.windows is not None:
        held = window_chunks_for_batches(data, batch_size) + plan.chunks_ahead
        return held * data.store_chunk_rows * data.row_bytes + decode_bytes(data, batch_size)
    row_shuffle = shuffles_rows(data.shuffle, data.buffer_chunks)
    held = held_chunks(buffer_chunks=data.buffer_chunks, in_flight=plan.chunks_ahead, row_shuffle=row_shuffle)
    grown = max(0, int(batch_size) - data.buffer_rows) if row_shuffle else 0
    return (held * data.chunk_rows + grown) * data.row_bytes + decode_bytes(data, batch_size)


def decode_bytes(data, batch_size: int) -> int:
    """Bytes a reading process holds to decode CF-packed columns: one batch of them gathered as stored, and
    the float64 block the decode computes in (:func:`~zarrtorch._read.columns.decode_block_bytes`)."""
    packed = data.packed_columns
    if not packed:
        return 0
    out, stored = data.out_columns, data.columns
    values = {c: int(np.prod(out[c][0], dtype=np.int64)) for c in packed}
    gathered = int(batch_size) * sum(values[c] * stored[n][1].itemsize for c, n in packed.items())
    return gathered + max(decode_block_bytes(v, int(batch_size)) for v in values.values())


def loader_memory(loader) -> MemoryBudget | MixMemory:
    """The memory budget of a :class:`~zarrtorch.ZarrDataLoader` with its current settings (of a
    :class:`~zarrtorch.MixedLoader`: every source's, :class:`MixMemory`).

    Outside the ring (or the pinned slots, which hold them: :mod:`zarrtorch._workers.pinned`) the main process
    holds the work-ahead queue's batches, one more in the work-ahead thread's hands and the consumer's current and
    previous ones; with workers and DataLoader's own queue,
    also the ``prefetch_factor`` batches each worker may have in flight. With ``keep_in_memory=True`` every piece of
    this rank's (frozen) share stays in its process as the decoded chunk it was cut from, and that is all
    the decoded data its readers hold (``per_reader`` is what they decode CF-packed columns in). A remote
    store's requests in flight hold their answers (:func:`fetched_bytes`), counted with the most requests in
    flight the loader may reach. The budget also carries this process's cgroup memory limit
    (:attr:`MemoryBudget.within_memory_limit`)."""
    mixed_sources = getattr(loader, "sources", None)
    if mixed_sources is not None:
        return MixMemory({name: loader_memory(source) for name, source in mixed_sources.items()})
    job = loader.job
    if job.deals_pieces:
        return dealt_memory(loader)
    ds, workers, batch = job.data, job.num_workers, job.spec.batch_size
    per_reader = reader_bytes(ds, job.read_plan, batch)
    read_buffers = max(1, workers) * fetched_bytes(ds.arrays, job.read_plan.threads)
    batch_bytes = batch * (ds.batch_row_bytes + 8)  # + the int64 row index
    ring = job.ring.nbytes if job.ring is not None else 0
    if job.pinned is not None:  # the batches received and not yet freed are in these slots
        ring += job.pinned.nbytes
    batches = 0
    if job.ring is None and job.pinned is None:
        batches = (loader.work_ahead + 1 if loader.work_ahead else 0) + 2
        if workers:
            batches += workers * (loader.prefetch_factor or 2)
    kept = 0
    if ds.keep_in_memory:  # a reader keeps every piece it reads (those in flight too) and buffers row ids only
        rank, world = loader.topology()
        pieces = sum(len(w.pieces) for w in job.spec.plan(0, Topology(rank, world, workers)).workers)
        per_reader, kept = decode_bytes(ds, batch), pieces * ds.chunk_rows * ds.row_bytes
    processes = MAIN_PROCESS_BYTES + workers * WORKER_PROCESS_BYTES
    limit = cgroup_memory_limit() or 0
    return MemoryBudget(max(1, workers), per_reader, ring, batches, batch_bytes, kept, read_buffers, processes, limit)


def dealt_memory(loader) -> MemoryBudget:
    """:func:`loader_memory` with ``batch_order="rank"`` and workers: each worker holds the pieces it reads ahead
    and the one it copies into shared memory to send (no buffer, no batch); the ring of piece slots they send
    through (:func:`zarrtorch._workers.dealt.piece_ring`), allocated once; the main process holds the shuffle
    buffer (or the chunks held for windows), the pieces the workers sent ahead (``prefetch_factor`` items of
    ``PIECES_PER_ITEM`` each, and those of the item being taken, waiting in DataLoader's queue or its reorder
    buffer: counted again outside the ring, for those a worker sends through the queue when it finds every slot
    held) and the one it takes rows from, and the batches it formed."""
    job = loader.job
    ds, workers, plan = job.data, job.num_workers, job.read_plan
    piece_bytes = (ds.store_chunk_rows if ds.windows is not None else ds.chunk_rows) * ds.row_bytes
    sent_ahead = (workers * (loader.prefetch_factor or 2) + 1) * PIECES_PER_ITEM  # and the item being taken
    assembling = dataclasses.replace(plan, pieces_ahead=sent_ahead, pieces_per_read=1)
    batches = (loader.work_ahead + 1 if loader.work_ahead else 0) + 2
    return MemoryBudget(
        readers=workers,
        per_reader=(plan.chunks_ahead + 1) * piece_bytes,
        ring=job.ring.nbytes if job.ring is not None else 0,
        batches=batches,
        batch_bytes=job.spec.batch_size * (ds.batch_row_bytes + 8),
        read_buffers=workers * fetched_bytes(ds.arrays, plan.threads) + fetched_bytes(ds.arrays, 1),
        processes=MAIN_PROCESS_BYTES + workers * WORKER_PROCESS_BYTES,
        memory_limit=cgroup_memory_limit() or 0,
        assembler=reader_bytes(ds, assembling, job.spec.batch_size),
    )
