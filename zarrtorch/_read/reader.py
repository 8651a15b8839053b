"""Read a worker's pieces (row ranges inside one chunk) ahead of use, in threads.

Decoding (zstd, blosc) releases the GIL, so a few threads per process keep several cores busy without
moving data between processes. A missing chunk would silently read as the fill value and a corrupt one
fails with a codec message that names nothing; both become :class:`ChunkReadError` naming the array,
the chunk and the store key. Arrays in the common layouts are decoded by :mod:`zarrtorch._read.fastpath`.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import zarr

from zarrtorch._read.cache import (
    cached_bytes,
    flush_writes,
    forget_cached,
    keep_cached,
    list_cached,
    may_be_cached,
    reads_through_cache,
    uncached,
)
from zarrtorch._read.chunks import IF_SKIPPED, chunk_key, chunk_keys, fill_text, read_chunk
from zarrtorch._read.early import EarlyReads
from zarrtorch._read.fastpath import Span, direct_decoder
from zarrtorch._read.fetch import RetryPolicy, fetch_soon, get_many, short
from zarrtorch._read.inflight import InFlight
from zarrtorch._read.source import is_local, redact, store_label
from zarrtorch._util.pool import Pools
from zarrtorch._util.sizes import SMALL_CHUNK_BYTES
from zarrtorch._util.sizes import pieces_per_read as local_pieces_per_read

PIECES_LOOKED_UP = 64  # pieces of an epoch looked up in the cache's listing to tell whether it holds the epoch


def reading_threads(threads: int, prefetch: int) -> int:
    """Threads a :class:`PieceReader` reads in: enough for its reads in flight (none of its own when it
    reads one piece at a time). Requests fetched on the event loop (``_fetch_ahead``) need only the decode
    threads."""
    return 1 if max(1, threads) == 1 and prefetch <= 1 else max(threads, prefetch - 1)


def _timed(read: Callable, a: int, b: int, times: list):
    """``read(a, b)`` in a reading thread, noting when its data is there (``times[1]``) for the requests in flight."""
    data = read(a, b)
    times[1] = time.monotonic()
    return data


def _reading_pool(threads: int) -> ThreadPoolExecutor:
    """An epoch's reading threads, named so that profiles and ``--by-thread`` tell them apart."""
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="zarrtorch-read")


_REFETCHED = "zarrtorch: fetched again, with the same result"


def _refetched(exc: BaseException) -> bool:
    return _REFETCHED in getattr(exc, "__notes__", ())


class ChunkReadError(RuntimeError):
    """A chunk could not be read; the message names the array, chunk index, rows and store key."""


class PieceReader:
    """Reads ``arrays[name][start:stop]`` for each piece, ``prefetch`` pieces ahead (the requests in flight),
    in :func:`reading_threads` threads; remote reads follow ``policy`` (:mod:`zarrtorch._read.fetch`);
    decoded chunks come from ``pools`` (:mod:`zarrtorch._util.pool`; the process's, kept across epochs).
    ``early``: reads of the first pieces started before (:mod:`zarrtorch._read.early`), used where they match;
    ``after_last(reader, submit)`` is called once the last piece has been handed out, with this reader and the
    reading threads' ``submit`` (idle from then on: what it submits runs before they end); it returns the next epoch's
    :class:`~zarrtorch._read.early.EarlyReads`, kept as ``started_early``. ``check_missing``: a chunk with no stored
    object is an error (else the fill value, as zarr reads it). ``first``: the epoch's pieces, whose
    first reads start at once (:meth:`read_first`). ``pieces_per_read``: consecutive pieces one task of a reading
    thread reads (small chunks: a task handed to a thread costs about as much as decoding 32 KiB); the reads in
    flight are then that many pieces each.
    """

    def __init__(
        self,
        arrays: dict[str, zarr.Array],
        chunk_rows: int,
        *,
        threads: int = 1,
        prefetch: int = 2,
        check_missing: bool = True,
        cache: dict | None = None,
        policy: RetryPolicy | None = None,
        pools: Pools | None = None,
        early: EarlyReads | None = None,
        after_last: Callable[[PieceReader, Callable], EarlyReads] | None = None,
        first: np.ndarray | None = None,
        secrets: tuple[str, ...] = (),
        in_flight: InFlight | None = None,
        pieces_per_read: int = 1,
    ):
        self.arrays = arrays
        self.chunk_rows = chunk_rows
        self.threads = max(1, threads)
        self.pieces_per_read = max(1, int(pieces_per_read))  # consecutive pieces one reading task reads
        self.in_flight = in_flight or InFlight(prefetch, prefetch)  # ``prefetch`` fixed, or adapted
        self.check_missing = check_missing
        self.cache = cache
        self.policy = policy or RetryPolicy()
        self.early, self.after_last = early, after_last
        self.secrets = secrets  # storage options never shown in a message (zarrtorch._read.source.redact)
        self._pool: ThreadPoolExecutor | None = None  # the reading threads, once started
        self._early_times: dict = {}  # reads started early over HTTP -> [requested, done]
        self.started_early: EarlyReads | None = None  # what after_last returned: the next epoch's reads
        self._direct = {
            name: direct_decoder(arr, self.policy, pools, check_missing=check_missing) for name, arr in arrays.items()
        }
        self._keys = {name: chunk_keys(arr) for name, arr in arrays.items()}  # chunk -> store key
        # asked once, not once per chunk (zarr's ``shape`` is three calls)
        self._local = {name: is_local(arr) for name, arr in arrays.items()}
        self._rows = {name: int(arr.shape[0]) for name, arr in arrays.items()}
        self._no_bytes = {name for name, arr in arrays.items() if 0 in arr.shape[1:]}
        # remote arrays decoded directly: their chunks of one row range are requested together (not a shard's:
        # its decoder requests the index and the inner chunks a piece needs by byte range)
        self._together = [
            n
            for n, a in arrays.items()
            if self._direct[n] is not None and not is_local(a) and getattr(a, "shards", None) is None
        ]
        # every array remote and decoded directly: requests wait on zarr's event loop, not in a thread each
        self._fetch_ahead = bool(arrays) and cache is None and len(self._together) == len(arrays)
        # and each read through the node's chunk cache: what it holds is read and decoded in one reading thread, as
        # a local store's chunks are, and the rest requested at once (:meth:`_fetch_then_decode`)
        self._cached = self._fetch_ahead and all(reads_through_cache(a) for a in arrays.values())
        # chunks kept in the node's cache (any array reading through it): its packs being filled are written at the
        # end of each epoch, so that the next one, and the other workers, find all of them in its files
        self._keeps = any(reads_through_cache(a) for a in arrays.values())
        # consecutive pieces the cache holds that one reading task reads, as a local store's (small chunks), and
        # small chunks it holds read where they are gathered (:data:`SMALL_CHUNK_BYTES`), as a local store's are
        chunk_bytes = chunk_rows * _row_bytes(arrays)
        self._held_per_read = local_pieces_per_read(chunk_bytes) if self._cached else 1
        self._held_inline = self._cached and chunk_bytes <= SMALL_CHUNK_BYTES
        self._early_held: set = set()  # reads started early from the cache's files (no round trip to time)
        # the epoch's listing of the node's cache was made by read_first: one listing routes all of its pieces
        self._listed_at_start = False
        if first is not None:
            self.read_first(first)

    @property
    def prefetch(self) -> int:
        """Pieces read ahead now (the requests in flight)."""
        return self.in_flight.level

    def _where(self, name: str, arr: zarr.Array, chunk: int, start: int, stop: int) -> str:
        return (
            f"chunk {chunk} (rows {start}:{stop}) of array {name!r}, key {chunk_key(arr, chunk)!r} "
            f"in store {store_label(arr, self.secrets)}"
        )

    def _missing_message(self, name: str, arr: zarr.Array, chunk: int, start: int, stop: int) -> str:
        return (
            f"missing {self._where(name, arr, chunk, start, stop)}: Zarr would read it as the fill value "
            f"{fill_text(arr.fill_value)}. {IF_SKIPPED}."
        )

    def read_piece(
        self, start: int, stop: int, into: dict[str, np.ndarray] | None = None, fetched: dict | None = None
    ) -> dict[str, np.ndarray]:
        """The rows ``[start, stop)`` of every array (they lie in one chunk). ``into``: for some arrays, where their
        whole chunk is decoded (rows of the chunk's first row on), which the rows returned are a view of.
        ``fetched``: the chunk's bytes of each array (or the error their request got), requested already."""
        key = (int(start), int(stop))
        if into is not None:
            return self._read_checked(*key, into=into, fetched=fetched)
        if self.cache is not None and key in self.cache:
            return self.cache[key]
        out = self._read_checked(*key, fetched=fetched)
        if self.cache is not None:
            self.cache[key] = out
        return out

    def _fetch_together(self, chunk: int) -> dict[str, bytes | Exception]:
        if len(self._together) < 2:
            return {}
        keys = [(self.arrays[n].store_path.store, self._keys[n](chunk)) for n in self._together]
        return dict(zip(self._together, get_many(keys, self.policy), strict=True))

    def _read_checked(
        self, start: int, stop: int, into: dict[str, np.ndarray] | None = None, fetched: dict | None = None
    ) -> dict[str, np.ndarray]:
        chunk = start // self.chunk_rows
        first = chunk * self.chunk_rows
        if not first <= start < stop <= first + self.chunk_rows:  # a plan's pieces lie in one chunk each
            raise RuntimeError(
                f"zarrtorch internal error: asked to read rows [{start}, {stop}) as one piece, which is not inside "
                f"one chunk of {self.chunk_rows} rows; nothing was read. Please report it with the loader's settings"
            )
        fetched = self._fetch_together(chunk) if fetched is None else fetched
        out = {}
        for name, arr in self.arrays.items():
            if name in self._no_bytes:  # rows of zero elements (shape (n, 0)): zarr writes no chunk, none is read
                out[name] = np.empty((stop - start, *arr.shape[1:]), dtype=arr.dtype)
                continue
            target = into.get(name) if into is not None else None
            try:
                span = Span(start - first, stop - first, min(self.chunk_rows, self._rows[name] - first))
                whole = self._read_chunk(name, arr, chunk, fetched.get(name), target, span)
                out[name] = whole[start - first : stop - first]
            except FileNotFoundError:
                if self.check_missing:
                    raise ChunkReadError(self._missing_message(name, arr, chunk, start, stop)) from None
                fill = arr.fill_value if arr.fill_value is not None else 0  # what zarr reads a missing chunk as
                out[name] = whole = np.full((stop - start, *arr.shape[1:]), fill, dtype=arr.dtype)
            except Exception as exc:  # noqa: BLE001 (any failure is a ChunkReadError naming the chunk; the cause is
                # not chained: its text may hold a credential, redacted here)
                why = short(redact(f"{type(exc).__name__}: {exc}", self.secrets))
                twice = " (the same once fetched again: the stored chunk is damaged)" if _refetched(exc) else ""
                where = self._where(name, arr, chunk, start, stop)
                raise ChunkReadError(f"cannot read {where}: {why}{twice}") from None
            if target is not None and whole is not target:  # not decoded in place: copied there
                target[start - first : stop - first] = out[name]
                out[name] = target[start - first : stop - first]
        return out

    def _read_chunk(
        self, name: str, arr: zarr.Array, chunk: int, fetched, into=None, rows: Span | None = None
    ) -> np.ndarray:
        """The chunk, decoded: directly (:mod:`zarrtorch._read.fastpath`; into ``into`` where it fits; of a shard,
        the inner chunks holding ``rows``) or whole through zarr's codecs
        (:mod:`zarrtorch._read.chunks`); ``fetched``: its bytes, requested already (or the error that got)."""
        if isinstance(fetched, Exception):
            raise fetched
        decode = self._direct[name]
        local = self._local[name]
        try:
            if decode is not None:
                return decode(self._keys[name](chunk), fetched, into, rows)
            return read_chunk(arr, chunk, policy=None if local else self.policy, check_missing=self.check_missing)
        except (ValueError, RuntimeError) as damaged:
            if local or isinstance(damaged, ChunkReadError):
                raise
            # bytes that do not decode may have been damaged on the way (a body cut short can look whole to
            # HTTP): fetched once more before the chunk is called damaged, from the store, not the node's cache
            forget_cached(arr, self._keys[name](chunk))
            try:
                if decode is not None:
                    return decode(self._keys[name](chunk), None, into, rows)
                return read_chunk(arr, chunk, policy=self.policy, check_missing=self.check_missing)
            except (ValueError, RuntimeError):
                forget_cached(arr, self._keys[name](chunk))  # kept as it arrived: a damaged chunk is never served
                damaged.add_note(_REFETCHED)
                raise damaged from None

    def _list_cached(self, pieces: np.ndarray) -> None:
        """At an epoch's start: note which chunks the node's cache holds (one listing per array), so that the
        others are requested at once; when it holds the epoch's ``pieces``, the reads in flight start from their
        floor, as a local store's (:meth:`InFlight.start_from_floor`)."""
        if not self._cached:
            return
        for arr in self.arrays.values():
            list_cached(arr)
        if len(pieces) and self._cache_holds(pieces):
            self.in_flight.start_from_floor()

    def _cache_holds(self, pieces: np.ndarray) -> bool:
        """Whether the node's cache listed the chunks of ``pieces`` (:data:`PIECES_LOOKED_UP` of them, spread
        over the epoch: a guess that sets a starting level only, so its cost stays fixed)."""
        looked = np.unique(np.linspace(0, len(pieces) - 1, min(len(pieces), PIECES_LOOKED_UP)).astype(np.int64))
        chunks = {int(pieces[i][0]) // self.chunk_rows for i in looked}
        return all(
            may_be_cached(arr.store_path.store, self._keys[name](chunk))
            for chunk in chunks
            for name, arr in self.arrays.items()
        )

    def _holds_piece(self, piece: tuple[int, int]) -> bool:
        """Whether the epoch's listing of the node's cache holds the chunk of ``piece`` of every array: then it is
        read as a local store's chunk is (:meth:`_reading_held`), not requested."""
        chunk = piece[0] // self.chunk_rows
        return all(may_be_cached(arr.store_path.store, self._keys[name](chunk)) for name, arr in self.arrays.items())

    def _reading_held(self, read: Callable) -> Callable[[int, int], object]:
        """``read(start, stop)`` of a piece the cache listed, in a reading thread: the chunk's files read and
        checked there (:meth:`_held_chunk`) and decoded by ``read`` in the same thread, as a local store's chunk is:
        no future handed between threads, no event loop."""
        return lambda start, stop: read(start, stop, fetched=self._held_chunk(start // self.chunk_rows))

    def read_held_piece(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """:meth:`read_piece` of a piece the cache listed, its chunk's bytes read from the cache's files
        (:meth:`_held_chunk`)."""
        return self.read_piece(start, stop, fetched=self._held_chunk(start // self.chunk_rows))

    def early_reads(self, pieces: np.ndarray) -> tuple[np.ndarray, Callable[[int, int], dict]]:
        """The first of ``pieces`` (the next epoch's) that may be read before their epoch starts, and what reads
        them: every one of a local store; of a store read through the node's chunk cache, those up to the first
        that the cache holds, read from its files (:meth:`read_held_piece`): an early read is no request to the
        store, which the last epoch would make for nothing if another epoch came. The cache is listed again first:
        the packs this epoch wrote are in its files, neither in the listing made at its start nor waiting to be
        written (after a cold epoch, none of the next epoch's pieces would be read early)."""
        if not self._cached:
            return (pieces if all(self._local.values()) else pieces[:0]), self.read_piece
        for arr in self.arrays.values():
            list_cached(arr)
        held = 0
        while held < len(pieces) and self._holds_piece((int(pieces[held][0]), int(pieces[held][1]))):
            held += 1
        if held and self._cache_holds(pieces):  # the next epoch reads the cache's files: from the floor, as
            self.in_flight.start_from_floor()  # its start would set it, and so do its reads started early
        return pieces[:held], self.read_held_piece

    def _held_chunk(self, chunk: int) -> dict:
        """The chunk's bytes of each array from the node's cache (verified: a damaged file is deleted, not
        served); one the cache no longer holds (evicted, cleared or damaged since the listing) is fetched here from
        the store, and kept. An answer that is an error stands in its place (raised when decoded)."""
        where = {name: (arr.store_path.store, self._keys[name](chunk)) for name, arr in self.arrays.items()}
        fetched = {name: cached_bytes(*place) for name, place in where.items()}
        missing = [name for name, raw in fetched.items() if raw is None]
        if missing:
            answers = get_many([(uncached(where[n][0]), where[n][1]) for n in missing], self.policy)
            for name, answer in zip(missing, answers, strict=True):
                if isinstance(answer, bytes):
                    keep_cached(*where[name], answer)
                fetched[name] = answer
        return fetched

    def read_first(self, pieces: np.ndarray) -> None:
        """Start reading the first of ``pieces`` (an epoch's, in order) now, in threads of their own, instead of
        at the first batch: a DataLoader worker makes its iterator as it starts, well before the first
        index reaches it. :meth:`iter_pieces` takes them as reads started early, and goes on in the same
        threads; nothing when there are some already (the last epoch's) or when pieces are read one at a
        time in the caller's thread."""
        threads = reading_threads(self.threads, self.in_flight.most)
        if self.early is not None or len(pieces) == 0 or (threads == 1 and self.in_flight.most <= 1):
            return
        fetch_ahead = self._fetch_ahead  # requested now, decoded in the decode threads as they arrive
        self._list_cached(pieces)
        self._listed_at_start = True
        self._pool = pool = _reading_pool(self.threads if fetch_ahead else threads)  # the epoch's

        submit_early = weakref.WeakMethod(self._submit_early)  # the early reads are held here: must not hold us

        def submit(read, a, b):
            method = submit_early()
            if method is None:
                raise RuntimeError("the reader is gone")
            return method(pool, fetch_ahead, read, a, b)

        self.early = EarlyReads(submit, self.read_piece, pieces[: self.prefetch])

    def _submit_early(
        self, pool: ThreadPoolExecutor, fetch_ahead: bool, read: Callable, a: int, b: int
    ) -> concurrent.futures.Future:
        times = [time.monotonic(), None]
        if fetch_ahead and self._cached and self._holds_piece((a, b)):  # from the cache's file: no round trip
            future = pool.submit(self._reading_held(read), a, b)
            self._early_held.add(future)
            return future
        if fetch_ahead:
            future = self._fetch_then_decode(pool.submit, [(a, b)], times, read)
        else:
            future = pool.submit(_timed, read, a, b, times)
        self._early_times[future] = times  # the burst's round trips count too (inflight.py)
        return future

    def iter_pieces(
        self, pieces: np.ndarray, ready: list | None = None, read: Callable[[int, int], object] | None = None
    ) -> Iterator[dict[str, np.ndarray]]:
        """Yield the pieces' data in order while the next ones are decoded in the background. ``ready``: the
        data of the first pieces, already read (:mod:`zarrtorch._read.early`); they hold no read buffer.
        ``read(start, stop)``: what the reading threads run for each piece instead of :meth:`read_piece` (its
        result is what is yielded)."""
        try:
            yield from self._iter_pieces(pieces, ready, read)
        finally:  # the epoch's chunks kept in the node's cache: its packs being filled are written now, however few
            if self._keeps:  # they hold, so that the next epoch, and the other workers, find them all in its files
                flush_writes()

    def _iter_pieces(
        self, pieces: np.ndarray, ready: list | None, read: Callable[[int, int], object] | None
    ) -> Iterator[dict[str, np.ndarray]]:
        own = read is None  # reads started early read as read_piece does: used only then
        read = read or self.read_piece
        ready = deque(ready or ())
        # reads started early, as futures held only here: each chunk is freed once its piece is consumed
        early = self.early if own else None
        pending: deque = deque(early.take_leading(pieces[len(ready) :]) if early is not None else ())
        early_times, self._early_times, self.early = self._early_times, {}, None
        early_held, self._early_held = self._early_held, set()
        listed, self._listed_at_start = self._listed_at_start, False
        if len(pieces) == 0:
            return
        if not listed:  # a second listing would route the pieces read early and the rest by two different views
            self._list_cached(pieces)
        threads = reading_threads(self.threads, self.in_flight.most)
        fetch_ahead = self._fetch_ahead and self.in_flight.most > 1
        if threads == 1 and self.in_flight.most <= 1 and not pending and not ready:  # in the caller's thread
            for start, stop in pieces:
                yield read(start, stop)
            return
        pool = self._pool or _reading_pool(self.threads if fetch_ahead else threads)
        self._pool = None
        handed_over = False  # the threads run reads submitted by after_last: let them finish
        todo = map(tuple, np.asarray(pieces[len(ready) + len(pending) :]).tolist())  # (start, stop) as ints

        # future -> [requested, done] (monotonic seconds) of the requests in flight, the early ones taken here too
        timing: dict = {f: early_times[f] for f in pending if f in early_times}
        # reads of the cache's files, as a local store's: not on the wire, nothing to wait for but the decode
        # (a read started early with no round trip timed read files: the cache's, from the reads the last epoch started)
        held_reads = {f for f in pending if f in early_held or f not in early_times}
        del early_times, early_held  # early reads not taken here are not held
        group = self.pieces_per_read
        # the cache's listing decides per piece: what it holds is read as a local store's (several pieces to a
        # task), the rest requested. The pieces read ahead and not handed out yet are counted (``ahead``): a task
        # of several stays within ``held`` pieces, which the memory budget and the window slots count
        from_cache = fetch_ahead and self._cached
        ahead = [len(pending)]
        peeked: list = []  # a piece taken from ``todo`` to end a task of held pieces, not read yet
        read_held = self._reading_held(read) if from_cache else None

        def held_task_size() -> int:
            """Pieces of a task of held pieces: a local store's (:attr:`_held_per_read`), at most half of those held
            ahead, so that a second task is read while the first is consumed."""
            return max(1, min(self._held_per_read, self.in_flight.held // 2))

        def next_task(room: int) -> tuple[list, bool]:
            """The next reading task's pieces (at most ``room`` when the cache holds them) and whether it does; none
            while the room left would make a task of held pieces smaller than :func:`held_task_size` and reads are
            still pending: a task per piece consumed would cost a thread's wake-up and a future per chunk."""
            first = peeked.pop() if peeked else next(todo, None)
            if first is None:
                return [], False
            if not from_cache or not self._holds_piece(first):
                return [first, *itertools.islice(todo, group - 1)], False
            size = held_task_size()
            if pending and room < size:
                peeked.append(first)
                return [], False
            task = [first]
            while len(task) < min(size, room):
                piece = next(todo, None)
                if piece is None:
                    break
                if not self._holds_piece(piece):
                    peeked.append(piece)
                    break
                task.append(piece)
            return task, True

        def timed(task: list, times: list) -> _Read:
            data = _Read(read, task)
            times[1] = time.monotonic()  # before the future holds the data
            return data

        # An adapted level counts the reads on the wire, not the finished ones waiting their turn (inflight.py,
        # ``held``): ``wire[0]`` counts those started, ``landed`` gets an entry as each finishes (in whichever
        # thread finishes it), and ``arrivals`` wakes a consumer waiting for the first piece, to start more.
        # A fixed setting counts every read in ``pending``, finished or not, as before.
        adapted = not self.in_flight.fixed
        landed: deque = deque()
        arrivals = threading.Event()
        wire = [0]

        def land(_future) -> None:
            landed.append(None)
            arrivals.set()

        def started(future) -> None:
            wire[0] += 1
            future.add_done_callback(land)

        def on_wire() -> int:
            while landed:
                landed.pop()
                wire[0] -= 1
            return wire[0]

        if adapted:
            for future in pending:
                if future not in held_reads:
                    started(future)

        def read_ahead():
            held, level = self.in_flight.held, self.prefetch
            while (ahead[0] if from_cache else len(pending)) < held and (not adapted or on_wire() < level):
                task, cached = next_task(held - ahead[0])
                if not task:
                    return
                ahead[0] += len(task)
                if cached:  # read, checked and decoded as a local store's chunks are: in a reading thread, small ones
                    # where they are gathered (when the consumer takes them)
                    run = _Later if self._held_inline else pool.submit
                    future = run(_Read, read_held, task)
                    held_reads.add(future)
                    pending.append(future)
                    continue
                times = [time.monotonic(), None]
                if fetch_ahead:
                    future = self._fetch_then_decode(pool.submit, task, times, read)
                else:
                    future = pool.submit(timed, task, times)
                timing[future] = times
                pending.append(future)
                if adapted:
                    started(future)

        def take():
            future = pending[0]
            asked = time.monotonic()
            # the reads behind the first may finish before it: each that does makes room on the wire for another (only
            # an adapted level holds more; a read of the cache's files is on no wire: it is waited for as it is)
            while future not in held_reads and not future.done() and self.in_flight.held > self.prefetch:
                arrivals.clear()
                if future.done():
                    break
                read_ahead()
                arrivals.wait()
            pending.popleft()
            held_reads.discard(future)
            data = future.result()  # the consumer waits for this read if it has not finished
            requested, done = timing.pop(future, (None, None))
            self.in_flight.consumed(time.monotonic() - asked, done - requested if done is not None else None)
            return data if isinstance(data, _Read) else _Read.of(data)  # a read started early: one piece

        self.in_flight.new_epoch()
        current = _Read.of()
        try:
            read_ahead()
            while ready or pending or current:
                if current:
                    data = current.next()
                    ahead[0] -= 1
                elif ready:
                    data = ready.popleft()
                else:
                    current = take()
                    data = current.next()
                    ahead[0] -= 1
                if not current:  # a whole read consumed (the last piece is about to be): read the next
                    read_ahead()
                if not ready and not pending and not current and self.after_last is not None:  # the last one
                    self.started_early = self.after_last(self, pool.submit)
                    handed_over = True
                yield data
        finally:
            current = None
            for f in pending:
                f.cancel()
            pool.shutdown(wait=False, cancel_futures=not handed_over)

    def _fetch_then_decode(
        self, submit: Callable, task: list, times: list, read: Callable
    ) -> concurrent.futures.Future:
        """A future of the task's pieces: their chunks requested now on zarr's event loop
        (:func:`~zarrtorch._read.fetch.fetch_soon`), decoded by a reading thread once they arrive. A read whose
        future was cancelled (the epoch ended) is not decoded."""
        out: concurrent.futures.Future = concurrent.futures.Future()
        names = list(self.arrays)
        keys = [
            (arr.store_path.store, self._keys[name](a // self.chunk_rows))
            for a, _ in task
            for name, arr in self.arrays.items()
        ]

        def decode(raw: list) -> None:
            if not out.set_running_or_notify_cancel():
                return
            try:
                by_piece = {
                    a: dict(zip(names, raw[k * len(names) : (k + 1) * len(names)], strict=True))
                    for k, (a, _) in enumerate(task)
                }
                data = _Read(lambda a, b: read(a, b, fetched=by_piece[a]), task)
                times[1] = time.monotonic()
                out.set_result(data)
            except BaseException as exc:  # noqa: BLE001 (handed to the consumer, who waits on ``out``)
                out.set_exception(exc)

        def hand_over(raw: list) -> None:  # the bytes, to a reading thread that decodes them
            try:
                submit(decode, raw)
            except RuntimeError:  # the reading threads are shut down: the epoch ended, nobody waits for it
                out.cancel()
            except BaseException as exc:  # noqa: BLE001 (it reaches the consumer, who must not wait for nothing)
                if out.set_running_or_notify_cancel():
                    out.set_exception(exc)

        def arrived(request: concurrent.futures.Future, held: list | None = None) -> None:  # in zarr's loop thread
            unsent.clear()  # nothing left to cancel: and ``out`` no longer holds the request and its bytes
            if out.cancelled():
                return
            try:
                raw = request.result()
            except BaseException as exc:  # noqa: BLE001 (not even sent, the loop stopped: the consumer hears it)
                if out.set_running_or_notify_cancel():
                    out.set_exception(exc)
                return
            if held is not None:  # the chunks the node's cache held, with those fetched put in their places
                for (store, key), answer in zip(wanted_of(held), raw, strict=True):
                    if isinstance(answer, bytes):
                        keep_cached(store, key, answer)
                raw = _filled(held, raw)
            hand_over(raw)

        def wanted_of(held: list) -> list:
            return [k for k, h in zip(keys, held, strict=True) if h is None]

        def fetch(wanted: list, held: list | None = None) -> None:
            # asked of the store the cache reads through: the cache was read already (kept once they arrive)
            stores = [(uncached(store), key) for store, key in wanted] if held is not None else wanted
            unsent.append(fetch_soon(stores, self.policy))
            unsent[0].add_done_callback(lambda request: arrived(request, held))

        def from_cache() -> None:  # in a reading thread: what the cache holds is read as a local store's chunks are
            if out.cancelled():
                return
            try:
                held = [cached_bytes(*k) if maybe else None for k, maybe in zip(keys, listed, strict=True)]
                wanted = wanted_of(held)
            except BaseException as exc:  # noqa: BLE001 (it reaches the consumer, who must not wait for nothing)
                if out.set_running_or_notify_cancel():
                    out.set_exception(exc)
                return
            if wanted:
                fetch(wanted, held)
            else:  # decoded in this thread: a hand-over to another costs a wait for the GIL per read
                decode(held)

        unsent: list = []
        # a read nobody waits for any more (the epoch ended or failed): its requests are cancelled too, not left
        # pending on the loop (at exit: "Task was destroyed but it is pending!"). Through ``unsent``, emptied once
        # they are answered: the two futures must not hold each other, a cycle that would keep every answer's bytes
        # until a full garbage collection, which torch makes rare (memory past the loader's bound)
        out.add_done_callback(lambda done: [r.cancel() for r in unsent] if done.cancelled() else None)
        listed = [self._cached and may_be_cached(store, key) for store, key in keys]
        if any(listed):  # the node's cache may hold some: looked for first, the rest fetched
            try:
                submit(from_cache)
            except RuntimeError:  # the reading threads are shut down: the epoch ended, nobody waits for it
                out.cancel()
        elif self._cached:  # none there: fetched at once, then kept
            fetch(keys, [None] * len(keys))
        else:
            fetch(keys)
        return out

    def read_rows(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Arbitrary rows, used to rebuild a shuffle buffer when resuming mid-epoch. Read chunk by chunk
        with the same checks as pieces (a missing chunk must not become fill values here either), one
        chunk in memory at a time, and not cached (these ranges are not the plan's pieces)."""
        rows = np.asarray(rows, dtype=np.int64)
        chunks = rows // self.chunk_rows
        out = {n: np.empty((len(rows), *a.shape[1:]), dtype=a.dtype) for n, a in self.arrays.items()}
        for chunk in np.unique(chunks):
            sel = np.nonzero(chunks == chunk)[0]
            lo = int(rows[sel].min())
            data = self._read_checked(lo, int(rows[sel].max()) + 1)
            for name, column in out.items():
                column[sel] = data[name][rows[sel] - lo]
        return out


def _row_bytes(arrays: dict[str, zarr.Array]) -> int:
    """Bytes of one row of every array, decoded."""
    return sum(np.dtype(a.dtype).itemsize * int(np.prod(a.shape[1:], dtype=np.int64)) for a in arrays.values())


def _filled(held: list, fetched: list) -> list:
    """``held`` (bytes, or ``None`` where the cache held none) with ``fetched`` put in the ``None`` places, in order."""
    answers = iter(fetched)
    return [next(answers) if h is None else h for h in held]


class _Later:
    """A read that runs in the thread that takes its result, when it takes it: a future's place in the reads
    pending, for small chunks of the node's cache, which a reading thread beside the gathering one reads slower than
    the gathering one itself (a hand-over per task, the GIL taken back at every system call). Cancelled, it never
    runs."""

    def __init__(self, fn: Callable, *args):
        self._call: tuple | None = (fn, args)

    def done(self) -> bool:
        return False

    def cancel(self) -> bool:
        self._call = None
        return True

    def result(self):
        if self._call is None:
            raise concurrent.futures.CancelledError()
        fn, args = self._call
        self._call = None
        return fn(*args)


class _Read:
    """The pieces one reading task read, handed out one at a time. A piece that failed ends the task: the
    pieces before it are handed out first, then its error is raised, as if they had been read one by one."""

    def __init__(self, read: Callable[[int, int], dict] | None = None, task: list | None = None):
        self.pieces: deque = deque()
        self.error: BaseException | None = None
        for start, stop in task or ():
            try:
                self.pieces.append(read(start, stop))
            except Exception as exc:  # noqa: BLE001 (raised to the consumer after the pieces read before it)
                self.error = exc
                break

    @classmethod
    def of(cls, *pieces: dict) -> _Read:
        read = cls()
        read.pieces.extend(pieces)
        return read

    def __bool__(self) -> bool:
        return bool(self.pieces) or self.error is not None

    def next(self) -> dict:
        if self.pieces:
            return self.pieces.popleft()
        error, self.error = self.error, None
        raise error
