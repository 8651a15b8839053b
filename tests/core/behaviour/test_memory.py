"""The memory bound of a worker, measured by instrumenting the reads: every piece array the reader returns
is tracked with a weak reference until it is freed, so the tests see how many decoded pieces (and bytes)
one process holds at once, and how many reads happen before the first batch.

Claim (ZarrIterableDataset docstring): a worker holds at most the shuffle buffer (``buffer_chunks``
chunks) plus ``decode_threads + 2`` chunks being decoded or consumed, whatever the size of the array.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref

import numpy as np
import pytest
import torch

import zarrtorch.epoch
from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch._read.fastpath import read_buffer_bytes
from zarrtorch._read.reader import PieceReader
from zarrtorch.budget import MAIN_PROCESS_BYTES, WORKER_PROCESS_BYTES, reader_bytes
from zarrtorch.buffer import SlotBuffer

CHUNK, FEATURES = 32, 256  # 32 rows x 1 KiB per chunk of x
THREADS, BUFFER_CHUNKS = 2, 3


class Tracker:
    """Live piece arrays of this process (reset in a forked worker on first use)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        self.pid = os.getpid()
        self.live = self.live_bytes = self.peak = self.peak_bytes = self.reads = 0
        self.buffer_bytes = 0
        self.reads_before_first_batch = None

    def _check_pid(self):
        if os.getpid() != self.pid:
            self.reset()

    def add_piece(self, piece: dict[str, np.ndarray]) -> None:
        self._check_pid()
        with self.lock:
            self.reads += 1
            self.live += 1
            self.live_bytes += sum(a.nbytes for a in piece.values())
            self.peak = max(self.peak, self.live)
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        first = next(iter(piece.values()))
        weakref.finalize(first, self._drop, 1, 0)  # the piece lives as long as its first array
        for a in piece.values():
            weakref.finalize(a, self._drop, 0, a.nbytes)

    def _drop(self, pieces: int, nbytes: int) -> None:
        with self.lock:
            self.live -= pieces
            self.live_bytes -= nbytes

    def add_buffer(self, buf: SlotBuffer) -> None:
        self._check_pid()
        self.buffer_bytes = max(self.buffer_bytes, sum(c.nbytes for name, c in buf.slots.items() if name != "index"))

    def first_batch(self) -> None:
        self._check_pid()
        if self.reads_before_first_batch is None:
            self.reads_before_first_batch = self.reads

    def report(self) -> dict[str, int]:
        return {
            "peak_pieces": self.peak,
            "peak_piece_bytes": self.peak_bytes,
            "buffer_bytes": self.buffer_bytes,
            "reads": self.reads,
            "reads_before_first_batch": self.reads_before_first_batch,
        }


TRACK = Tracker()
TRACK.test = 0  # which test the readers counted belong to


@pytest.fixture()
def tracked(monkeypatch):
    read_piece, init, reader_init = PieceReader.read_piece, SlotBuffer.__init__, PieceReader.__init__
    TRACK.test += 1  # reads of an earlier test's readers (its next epoch's early reads) may still finish now

    def tracked_reader_init(self, *args, **kwargs):
        self.tracked_test = TRACK.test  # before __init__: it may start its first reads at once
        reader_init(self, *args, **kwargs)

    def tracked_read_piece(self, start, stop):
        out = read_piece(self, start, stop)
        if getattr(self, "tracked_test", None) == TRACK.test:
            TRACK.add_piece(out)
        return out

    def tracked_init(self, capacity, columns, slots=None):
        init(self, capacity, columns, slots)
        TRACK.add_buffer(self)

    monkeypatch.setattr(PieceReader, "read_piece", tracked_read_piece)
    monkeypatch.setattr(PieceReader, "__init__", tracked_reader_init)
    monkeypatch.setattr(SlotBuffer, "__init__", tracked_init)
    TRACK.reset()
    return TRACK


def report_in_batch(batch):
    """A transform: runs in the worker, so the worker's own numbers travel with each batch."""
    TRACK.first_batch()
    return {**batch, **{k: torch.tensor(-1 if v is None else v) for k, v in TRACK.report().items()}}


def make_store(path, chunks, shard_chunks=None):
    """``chunks`` chunks of ``CHUNK`` rows, the last one partial; with ``shard_chunks``, v3 shards of that many."""
    rows = chunks * CHUNK - 5  # a partial last chunk
    x = np.broadcast_to(np.arange(rows, dtype=np.float32)[:, None], (rows, FEATURES))
    prepare_zarr({"x": x, "y": np.arange(rows)}, path, chunk_rows=CHUNK, shard_chunks=shard_chunks, progress=False)
    return path


def chunk_bytes(ds) -> int:
    return ds.chunk_rows * ds.row_bytes


@pytest.mark.parametrize(("chunks", "shard_chunks"), [(12, None), (96, None), (96, 4)])
def test_memory_bound_in_process(tracked, tmp_path, chunks, shard_chunks):
    """The bound holds with the shard as the unit too (shards of 4 chunks, read by default since issue 43):
    the loader reads, holds and counts whole shards (``ds.chunk_rows`` is the shard's rows)."""
    ds = ZarrIterableDataset(
        make_store(tmp_path / "d.zarr", chunks, shard_chunks),
        buffer_chunks=BUFFER_CHUNKS,
        transform=report_in_batch,
        read=ReadOptions(decode_threads=THREADS),
    )
    # work_ahead=0: the transform (report_in_batch) runs as each batch is made, not when the consumer takes it; with
    # a work-ahead thread the reads counted "before the first batch" would include those of the batches made ahead
    loader = ZarrDataLoader(ds, batch_size=16, work_ahead=0)
    reports = [{k: int(v) for k, v in b.items() if k not in ("x", "y")} for b in loader]
    last = reports[-1]
    held_pieces = last["peak_pieces"]
    print(
        f"\n{chunks} chunks: peak {held_pieces} pieces ({last['peak_piece_bytes']} B) + buffer "
        f"{last['buffer_bytes']} B; chunk {chunk_bytes(ds)} B; {last['reads_before_first_batch']} reads before "
        f"batch 1 of {last['reads']}"
    )
    assert ds.chunk_rows == CHUNK * (shard_chunks or 1)
    assert last["reads"] >= ds.layout.n_chunks  # every piece was read (and tracked)
    ahead = loader.job.read_plan.chunks_ahead  # (THREADS + 1) reads in flight, pieces_per_read chunks each
    assert held_pieces <= ahead + 1
    assert last["peak_piece_bytes"] <= (ahead + 1) * chunk_bytes(ds)
    assert last["buffer_bytes"] <= BUFFER_CHUNKS * chunk_bytes(ds)
    assert last["peak_piece_bytes"] + last["buffer_bytes"] <= bound(loader)
    # the first batch needs one chunk; the reader runs at most `ahead` pieces ahead
    assert last["reads_before_first_batch"] <= ahead + 1


def bound(loader) -> int:
    """The decoded bytes one reading process of ``loader`` holds at most, as its budget counts them."""
    return reader_bytes(loader.data, loader.job.read_plan, loader.spec.batch_size)


def test_memory_bound_counts_a_buffer_grown_to_a_batch(tracked, tmp_path):
    """A batch larger than the shuffle buffer makes the buffer grow to hold it: batches of 8,192 rows of 8 KiB
    from a buffer of 1,024 held 64 MiB more per worker than worker_memory_bytes counted (found by measuring)."""
    ds = ZarrIterableDataset(
        make_store(tmp_path / "d.zarr", 96),
        buffer_chunks=BUFFER_CHUNKS,
        transform=report_in_batch,
        read=ReadOptions(decode_threads=THREADS),
    )
    batch = 48 * CHUNK  # more rows than the buffer's chunks and the reads in flight together
    loader = ZarrDataLoader(ds, batch_size=batch, work_ahead=0)
    last = [{k: int(v) for k, v in b.items() if k not in ("x", "y")} for b in loader][-1]
    assert last["buffer_bytes"] > BUFFER_CHUNKS * chunk_bytes(ds)  # it did grow past the buffer's chunks
    assert last["peak_piece_bytes"] + last["buffer_bytes"] <= bound(loader)


@pytest.mark.parametrize("chunk_rows", [1, CHUNK])
def test_memory_bound_counts_the_decoded_chunks_the_buffer_holds_rows_of(tmp_path, monkeypatch, chunk_rows):
    """With one-row chunks the shuffle buffer holds references to the decoded chunks, not copies
    (zarrtorch/ref_buffer.py, issue 43): a chunk is alive while any of its rows waits in the buffer, so the
    chunks themselves are tracked here (a piece is a view: the view is freed long before its chunk). Within the
    bound with one-row chunks; with chunks of several rows (copied into slots) too."""
    live, peak, lock = [0], [0], threading.Lock()
    read_piece = PieceReader.read_piece

    def drop(nbytes):
        with lock:
            live[0] -= nbytes

    def tracked_read_piece(self, start, stop):
        out = read_piece(self, start, stop)
        for a in out.values():
            chunk = a if a.base is None else a.base
            with lock:
                live[0] += chunk.nbytes
                peak[0] = max(peak[0], live[0])
            weakref.finalize(chunk, drop, chunk.nbytes)
        return out

    monkeypatch.setattr(PieceReader, "read_piece", tracked_read_piece)
    rows = 40 * CHUNK
    x = np.broadcast_to(np.arange(rows, dtype=np.float32)[:, None], (rows, FEATURES))
    store = prepare_zarr({"x": x}, tmp_path / "d.zarr", chunk_rows=chunk_rows, progress=False)
    ds = ZarrIterableDataset(
        store, buffer_chunks=BUFFER_CHUNKS * CHUNK // chunk_rows, read=ReadOptions(decode_threads=1)
    )
    loader = ZarrDataLoader(ds, batch_size=16, work_ahead=0)
    assert sum(len(b["x"]) for b in loader) == rows
    if chunk_rows == 1:  # the buffer's rows are held as their decoded chunks (no slot copies), and counted here
        assert peak[0] > BUFFER_CHUNKS * CHUNK * ds.row_bytes // 2
    assert peak[0] <= bound(loader)


@pytest.mark.slow
def test_memory_bound_per_worker(tracked, tmp_path):
    """The same bound in each of two forked DataLoader workers (the instrumented class is inherited)."""
    ds = ZarrIterableDataset(
        make_store(tmp_path / "d.zarr", 96),
        buffer_chunks=BUFFER_CHUNKS,
        transform=report_in_batch,
        read=ReadOptions(decode_threads=THREADS),
    )
    loader = ZarrDataLoader(ds, batch_size=16, num_workers=2, multiprocessing_context="fork")
    per_worker = {}
    for i, b in enumerate(loader):
        per_worker[i % 2] = {k: int(v) for k, v in b.items() if k not in ("x", "y")}  # round-robin: worker i % 2
    for w, rep in sorted(per_worker.items()):
        print(f"\nworker {w}: {rep}")
        assert rep["reads"] >= 96 // 2
        assert rep["peak_pieces"] <= loader.job.read_plan.chunks_ahead + 1
        assert rep["peak_piece_bytes"] + rep["buffer_bytes"] <= bound(loader)
        # a worker's share may begin inside a chunk: its first batch (one chunk of rows) then needs two pieces
        assert rep["reads_before_first_batch"] <= loader.job.read_plan.chunks_ahead + 2


def test_loader_budget_counts_the_batches_the_main_process_holds(tmp_path, monkeypatch):
    """Without workers, the main process never holds more batches than ``loader_memory`` counts, even with a
    slow consumer that keeps the previous batch (the work-ahead queue full, its thread waiting to put)."""
    import time

    from zarrtorch.budget import loader_memory

    live, peak = [0], [0]

    def drop():
        live[0] -= 1

    to_torch = zarrtorch.epoch.as_tensors

    def counted(self, batch):
        out = to_torch(self, batch)
        live[0] += 1
        peak[0] = max(peak[0], live[0])
        weakref.finalize(out["x"], drop)
        return out

    monkeypatch.setattr(zarrtorch.epoch, "as_tensors", counted)
    ds = ZarrIterableDataset(
        make_store(tmp_path / "d.zarr", 12), buffer_chunks=BUFFER_CHUNKS, read=ReadOptions(decode_threads=1)
    )
    loader = ZarrDataLoader(ds, batch_size=16, work_ahead=2)
    budget = loader_memory(loader)
    previous = None
    for batch in loader:
        time.sleep(0.01)  # the step: the work-ahead thread fills its queue meanwhile
        previous, batch = batch, None  # noqa: F841 (the consumer keeps the last batch)
    assert 0 < peak[0] <= budget.batches == 2 + 1 + 2
    assert budget.ring == 0 and budget.readers == 1
    assert budget.per_reader == ds.worker_memory_bytes(decode_threads=1)
    assert budget.read_buffers == 1 * sum(read_buffer_bytes(a) for a in ds.arrays.values()) > 0  # one thread
    assert budget.processes == MAIN_PROCESS_BYTES  # no workers: the main process alone
    assert budget.total == (
        budget.per_reader + budget.read_buffers + budget.batches * 16 * (ds.row_bytes + 8) + budget.processes
    )


def test_loader_budget_with_workers_counts_the_ring_or_the_queue(tmp_path):
    """With workers the ring's slots are the batches in flight and in the main process; DataLoader's own
    queue instead adds ``prefetch_factor`` batches per worker to the main process's share."""
    from zarrtorch.budget import loader_memory

    ds = ZarrIterableDataset(
        make_store(tmp_path / "d.zarr", 12), buffer_chunks=BUFFER_CHUNKS, read=ReadOptions(decode_threads=1)
    )
    ring = loader_memory(ZarrDataLoader(ds, batch_size=16, num_workers=2))
    slots = ZarrDataLoader(ds, batch_size=16, num_workers=2).job.ring
    assert ring.ring == slots.nbytes == 2 * slots.shape.slots * 16 * (ds.row_bytes + 8)
    assert ring.batches == 0 and ring.readers == 2
    queue = loader_memory(ZarrDataLoader(ds, batch_size=16, num_workers=2, transport="queue", prefetch_factor=3))
    assert queue.ring == 0 and queue.batches == 2 + 1 + 2 + 2 * 3
    assert queue.processes == ring.processes == MAIN_PROCESS_BYTES + 2 * WORKER_PROCESS_BYTES
    assert queue.total == (
        2 * queue.per_reader + queue.read_buffers + queue.batches * queue.batch_bytes + queue.processes
    )
    assert queue.read_buffers == ring.read_buffers == 2 * sum(read_buffer_bytes(a) for a in ds.arrays.values())


def test_loader_budget_counts_the_pinned_slots_that_hold_every_batch(tmp_path, monkeypatch):
    """``pin_memory=True`` and no workers on a GPU: the batches are gathered into page-locked slots
    (zarrtorch._workers.pinned), counted as the allocator rounds their block, in place of the pooled batches; a
    consumer that keeps the previous batch never finds every slot held (no batch falls back to ordinary memory).
    An ordinary allocation stands in for the page-locked one where there is no CUDA."""
    import warnings

    from zarrtorch._workers import pinned
    from zarrtorch.budget import loader_memory

    if not torch.cuda.is_available():  # on a GPU the real slots (DataLoader would copy an ordinary one)
        monkeypatch.setattr(pinned, "pinned_memory", lambda: (lambda n: torch.empty(n, dtype=torch.uint8), False))
    ds = ZarrIterableDataset(
        make_store(tmp_path / "d.zarr", 12), buffer_chunks=BUFFER_CHUNKS, read=ReadOptions(decode_threads=1)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DataLoader: "pin_memory ... no accelerator is found"
        loader = ZarrDataLoader(ds, batch_size=16, work_ahead=2, pin_memory=True)
        plain = loader_memory(ZarrDataLoader(ds, batch_size=16, work_ahead=2))
        slots, budget = loader.job.pinned, loader_memory(loader)
        assert budget.ring == slots.nbytes == pinned.allocated_bytes(slots.slots * slots.slot_bytes)
        assert slots.nbytes & (slots.nbytes - 1) == 0 and slots.slot_bytes >= 16 * (ds.row_bytes + 8)
        assert budget.batches == 0 and slots.slots >= plain.batches  # each batch the plain budget counts
        assert budget.total == plain.total - plain.batches * plain.batch_bytes + slots.nbytes
        previous, n = None, 0
        for batch in loader:
            assert all(slots.holds(t) for t in batch.values()), f"batch {n} fell back to ordinary memory"
            previous, batch, n = batch, None, n + 1  # noqa: F841 (the consumer keeps the last batch)
    assert n > slots.slots


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


@pytest.mark.parametrize("world", [1, 3])
def test_loader_budget_counts_the_cache(tmp_path, world):
    """``cache=True``: the decoded buffers the process keeps after an epoch (each distinct one counted once)
    fit ``loader_memory(...).kept``, and the rest of the budget is the uncached loader's."""
    from zarrtorch.budget import loader_memory

    store = make_store(tmp_path / "d.zarr", 12)
    kw = dict(batch_size=16, rank=world - 1, world_size=world)
    ds = ZarrIterableDataset(
        store, buffer_chunks=BUFFER_CHUNKS, keep_in_memory=True, read=ReadOptions(decode_threads=1)
    )
    loader = ZarrDataLoader(ds, **kw)
    budget = loader_memory(loader)
    list(loader)
    roots = {
        id(r): r for r in (_root(a) for piece in loader.dataset.process_state().kept.values() for a in piece.values())
    }
    held = sum(r.nbytes for r in roots.values())
    assert 0 < held <= budget.kept
    assert budget.kept - held < ds.chunk_rows * ds.row_bytes  # at most one chunk's slack (a partial piece)
    plain = loader_memory(
        ZarrDataLoader(
            ZarrIterableDataset(store, buffer_chunks=BUFFER_CHUNKS, read=ReadOptions(decode_threads=1)), **kw
        )
    )
    assert budget.per_reader == 0 and budget.total == plain.total - plain.per_reader + budget.kept


def test_cache_buffers_row_ids_only(tmp_path, monkeypatch):
    """With ``cache=True`` the rows stay in the cache, so no shuffle buffer of rows is allocated (the memory
    ``loader_memory`` leaves out); without it, one per epoch."""
    made = []
    init = SlotBuffer.__init__

    def record(self, capacity, columns, slots=None):
        made.append(sorted(columns))
        init(self, capacity, columns, slots)

    monkeypatch.setattr(SlotBuffer, "__init__", record)
    store = make_store(tmp_path / "d.zarr", 12)
    for cache in (True, False):
        made.clear()
        loader = ZarrDataLoader(
            ZarrIterableDataset(store, buffer_chunks=BUFFER_CHUNKS, keep_in_memory=cache), batch_size=16
        )
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            assert len(list(loader)) > 0
        assert made.count(["index", "x", "y"]) == (0 if cache else 2), made


def report_frozen_objects(batch):
    """A transform, run in the worker: how many inherited objects its garbage collector leaves alone."""
    return {**batch, "frozen": torch.tensor(gc.get_freeze_count())}


def test_workers_are_forked_with_the_parents_objects_frozen(tmp_path):
    """A forked worker's collections would write into every object it inherited, copying each page that holds
    one: the loader forks its workers with the objects frozen, then unfreezes them in the main process; a
    program that froze objects itself keeps its own freeze."""
    ds = ZarrIterableDataset(make_store(tmp_path / "d.zarr", 12), transform=report_frozen_objects)
    loader = ZarrDataLoader(ds, batch_size=16, num_workers=2, multiprocessing_context="fork")
    assert gc.get_freeze_count() == 0
    assert min(int(b["frozen"]) for b in loader) > 1000  # torch's and numpy's objects, at least
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        mine = gc.get_freeze_count()
        loader.set_epoch(1)
        assert len(list(loader)) > 0 and gc.get_freeze_count() > mine // 2  # (frozen objects freed leave it)
    finally:
        gc.unfreeze()


def test_remote_requests_in_flight_hold_their_answers(tmp_path):
    """Over HTTP each request in flight holds the stored bytes it received (and one more answer is being
    copied on the event loop): ``read_buffers`` counts them for the most requests in flight, at the bound of a
    stored chunk; a local store counts one chunk-file buffer per reading thread instead."""
    from zarrtorch.budget import loader_memory, stored_bytes_bound
    from zarrtorch.course.servers import HttpStoreServer

    store = make_store(tmp_path / "d.zarr", 12)
    read = ReadOptions(decode_threads=1, requests_in_flight=4)
    local = loader_memory(ZarrDataLoader(ZarrIterableDataset(store, read=read), batch_size=16))
    with HttpStoreServer(tmp_path) as server:
        ds = ZarrIterableDataset(f"{server.url}/d.zarr", read=read)
        remote = loader_memory(ZarrDataLoader(ds, batch_size=16, num_workers=2))
        threads = 3  # reading_threads(1 decode thread, 4 in flight)
        per_request = sum(stored_bytes_bound(a) for a in ds.arrays.values())
        assert per_request > ds.chunk_rows * ds.row_bytes  # a stored chunk may be larger than decoded
        assert remote.read_buffers == 2 * (threads + 1) * per_request
        assert remote.per_reader == ds.worker_memory_bytes(decode_threads=1)
    assert local.read_buffers == threads * sum(read_buffer_bytes(a) for a in ZarrIterableDataset(store).arrays.values())


def test_held_memory_leaves_library_pages_out():
    """The benchmark's measure of what a loader holds: anonymous + shared resident memory grows with what the
    process allocates and writes, not with pages of library files it maps; smaps by kind says where it lives."""
    import mmap
    import subprocess
    import sys

    from zarrtorch.course.memory import anon_rss, held_by_kind, private_bytes, smaps_by_kind

    pid = os.getpid()
    before, kinds_before = anon_rss(pid), smaps_by_kind(pid)
    block = np.ones(32 << 20, np.uint8)  # 32 MiB written: anonymous memory
    shared = mmap.mmap(-1, 8 << 20)  # 8 MiB of shared memory, written
    shared.write(b"x" * (8 << 20))
    grown = anon_rss(pid) - before
    # at least what was written; the slack above it is other threads of this test process (xdist, pools left by
    # earlier tests) and the kernel's per-CPU counters, 9 MiB seen once in CI: 16 MiB stays far below a second block
    assert 40 << 20 <= grown <= 56 << 20, grown >> 20
    kinds = smaps_by_kind(pid)
    assert kinds["shmem"]["Rss"] - kinds_before["shmem"]["Rss"] >= 8 << 20
    assert kinds["anon"]["Rss"] + kinds["heap"]["Rss"] + kinds["arena"]["Rss"] >= 32 << 20
    assert held_by_kind(kinds)["file shared"] + held_by_kind(kinds)["file private"] > 0  # this process's libraries
    # a library file read through a mapping: resident, but neither anonymous nor private dirty
    import numpy._core._multiarray_umath as compiled  # numpy's compiled module: a library file of some MiB

    with open(compiled.__file__, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        start = anon_rss(pid)
        dirty = private_bytes(pid)[1]
        assert sum(mapped[i] for i in range(0, len(mapped), 4096)) >= 0  # every page touched
        assert abs(anon_rss(pid) - start) < 2 << 20
        assert private_bytes(pid)[1] - dirty < 2 << 20
    del block, shared
    assert private_bytes(-1) is None and anon_rss(-1) is None and smaps_by_kind(-1) is None
    # a forked child holds privately (dirty) only what it writes; what it inherited stays shared
    code = "import numpy as np, sys; a = np.ones(16 << 20, np.uint8); print(a.sum()); sys.stdout.flush(); input()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        child.stdout.readline()
        assert private_bytes(child.pid)[1] >= 16 << 20
    finally:
        child.stdin.close()
        child.wait(30)


def cgroup_memory_max(root, limit: str):
    """A cgroup v2 fixture tree under ``root`` standing for ``/``: this process in /pod, ``memory.max`` there."""
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "self" / "cgroup").write_text("0::/pod\n")
    (root / "sys" / "fs" / "cgroup" / "pod").mkdir(parents=True)
    (root / "sys" / "fs" / "cgroup" / "pod" / "memory.max").write_text(limit + "\n")
    return root


def test_loader_budget_knows_the_cgroup_memory_limit(tmp_path, monkeypatch):
    """A JupyterHub pod or a container is killed at its cgroup's memory limit, not at the node's memory: the
    budget carries the limit of the process it is computed in and says whether the loader stays within its
    share (``MEMORY_LIMIT_SHARE``, the rest being the model's and PyTorch's); no limit ("max") is within."""
    from zarrtorch._util import cgroup
    from zarrtorch.budget import MEMORY_LIMIT_SHARE, loader_memory

    loader = ZarrDataLoader(ZarrIterableDataset(make_store(tmp_path / "d.zarr", 12)), batch_size=16, num_workers=2)
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", str(cgroup_memory_max(tmp_path / "none", "max")))
    unlimited = loader_memory(loader)
    assert unlimited.memory_limit == 0 and unlimited.within_memory_limit
    need = unlimited.total
    for limit in (int(need / MEMORY_LIMIT_SHARE), int(need / MEMORY_LIMIT_SHARE) - 1, need):
        monkeypatch.setattr(cgroup, "CGROUP_ROOT", str(cgroup_memory_max(tmp_path / str(limit), str(limit))))
        budget = loader_memory(loader)
        assert budget.memory_limit == limit and budget.total == need
        assert budget.within_memory_limit is (need <= MEMORY_LIMIT_SHARE * limit)


@pytest.mark.parametrize("windows", [False, True])
def test_a_dropped_loader_frees_its_buffers_without_the_garbage_collector(tmp_path, windows):
    """Lesson 01 on a hub was killed for memory (2 GiB limit): each chunk length's loader, dropped after its
    epoch, kept its shuffle buffer and the next epoch's early reads alive in reference cycles (the reader held
    a callback holding the reader; the early reads held the reader's bound method), freed only when the cyclic
    garbage collector happened to run. Dropped, a loader and its dataset are freed by reference counting."""
    import tracemalloc

    from zarrtorch import Windows

    path = tmp_path / "s.zarr"
    prepare_zarr(
        {"x": np.arange(640 * FEATURES, dtype=np.float32).reshape(640, FEATURES)},
        path,
        chunk_rows=CHUNK,
        progress=False,
    )
    windows = Windows(history=1, lead=1) if windows else None
    sum(1 for _ in ZarrDataLoader(ZarrIterableDataset(path, windows=windows), batch_size=16))  # lazy imports, caches
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ds = ZarrIterableDataset(path, seed=3, windows=windows)
        loader = ZarrDataLoader(ds, batch_size=16)
        assert sum(1 for _ in loader) > 0  # an epoch to its end: the next one's reads start early
        ref = weakref.ref(ds)
        held = tracemalloc.get_traced_memory()[0] - before
        del loader, ds
        deadline = time.monotonic() + 30  # reads of the next epoch still running hold the reader until they end
        while ref() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        freed = held - (tracemalloc.get_traced_memory()[0] - before)
        assert ref() is None, "the dataset outlived its loader: a reference cycle holds it"
        assert freed > 0.9 * held, f"{held - freed:,} of {held:,} bytes still held after the loader was dropped"
    finally:
        tracemalloc.stop()
        gc.enable()
