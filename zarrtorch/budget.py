"""The host memory a loader holds at most, all of its processes together: the figure to size a job with.

A job's memory per GPU is the loader's data on top of what any PyTorch process holds: the decoded chunks of
every reading process (:meth:`ZarrIterableDataset.worker_memory_bytes`), with ``keep_in_memory=True`` the rows each
process keeps, the buffers its reading threads read chunk files into, the ring of batch slots the main
process shares with its workers (:mod:`zarrtorch._workers.ring`), and the batches waiting in the main process.
``benchmarks/run.py`` compares this prediction with what it measures.
"""

from __future__ import annotations

from dataclasses import dataclass

from zarrtorch._read.fastpath import read_buffer_bytes
from zarrtorch._read.reader import reading_threads
from zarrtorch.plan import Topology


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes, at most: ``readers`` processes holding ``per_reader`` decoded data each, the rows ``kept`` by
    all of them together (``keep_in_memory=True``), their ``read_buffers`` (compressed chunk files), the ``ring``
    of shared batch slots, and ``batches`` of ``batch_bytes`` held in the main process outside the ring."""

    readers: int
    per_reader: int
    ring: int
    batches: int
    batch_bytes: int
    kept: int = 0
    read_buffers: int = 0

    @property
    def total(self) -> int:
        decoded = self.readers * self.per_reader + self.kept
        return decoded + self.read_buffers + self.ring + self.batches * self.batch_bytes


def loader_memory(loader) -> MemoryBudget:
    """The memory budget of a :class:`~zarrtorch.ZarrDataLoader` with its current settings.

    Outside the ring the main process holds the work-ahead queue's batches, one more in the work-ahead
    thread's hands and the consumer's current and previous ones; with workers and DataLoader's own queue,
    also the ``prefetch_factor`` batches each worker may have in flight. With ``keep_in_memory=True`` every piece of
    this rank's (frozen) share stays in its process as the decoded chunk it was cut from, and that is all
    the decoded data its readers hold (``per_reader`` is 0)."""
    ds, cfg = loader.dataset, loader.config
    workers = cfg.num_workers
    threads = ds.decode_threads(workers)
    per_reader = ds.worker_memory_bytes(decode_threads=threads)
    per_thread = sum(read_buffer_bytes(a) for a in ds.arrays.values())
    read_buffers = max(1, workers) * reading_threads(threads, ds.in_flight(threads)) * per_thread
    batch_bytes = cfg.batch_size * (ds.batch_row_bytes + 8)  # + the int64 row index
    ring = loader.ring.nbytes if loader.ring is not None else 0
    batches = 0
    if loader.ring is None:
        batches = (loader.work_ahead + 1 if loader.work_ahead else 0) + 2
        if workers:
            batches += workers * (loader.prefetch_factor or 2)
    kept = 0
    if ds.keep_in_memory:  # a reader keeps every piece it reads (those in flight too) and buffers row ids only
        rank, world = loader.topology()
        pieces = sum(len(w.pieces) for w in loader.spec.plan(0, Topology(rank, world, workers)).workers)
        per_reader, kept = 0, pieces * ds.chunk_rows * ds.row_bytes
    return MemoryBudget(max(1, workers), per_reader, ring, batches, batch_bytes, kept, read_buffers)
