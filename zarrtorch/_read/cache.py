"""A node-local cache of a remote store's chunks: epochs after the first read them from local disk.

Without it every epoch from a URL fetches every chunk again. With ``ReadOptions(cache_dir=...)`` each chunk's
stored (still encoded) bytes are kept in ``cache_dir``, shared by every rank and worker of the node, and read
from there the next time. Chunks are kept several to a file, in packs (:mod:`zarrtorch._read.packs`): a new file
costs an inode, which on an ext4 disk took more CPU than writing the chunk's bytes. The rules that keep it from
ever serving a wrong byte:

- **Atomic writes.** A pack is written to a temporary file beside its place, then renamed to a name of its own
  (random): a reader sees a whole pack or none, and two processes writing the same chunks write two packs, each
  right; either is read.
- **Verified reads.** A pack's index (keys, offsets, lengths) carries a CRC, and so does each chunk's record, which
  also names its key and length (CRC-32C, computed by the processor, or zlib's CRC-32: the magic names which); a
  pack whose index is damaged or that is cut short is deleted when listed, a record that is short, lengthened,
  altered or of another key is refused when read, its pack deleted and the chunk fetched again, never served. (A
  CRC catches every cut, every burst of up to 32 flipped bits and all but 2**-32 of other damage: the cache guards
  against accidents, not an attacker who can write its folder, at a small part of a cryptographic digest's cost.)
- **Damaged chunks are not kept.** A chunk that does not decode is dropped (its pack deleted), fetched once more
  from the store, and dropped again if that fails too; one whose crc32c (the last codec of ``prepare_zarr``'s Blosc
  and uncompressed stores) does not hold is never written.
- **A store id per array.** Packs live under a directory named by a digest of the cache's format, the store's
  address, the array's path, its metadata, its group's attributes and the first bytes of its first chunk: a store
  rewritten by ``prepare_zarr`` (a new ``write_id`` in the group's attributes at every write), or with other
  metadata (a new shape, chunking, codec, attributes), or another first chunk, has another id, and its old files
  are never read; neither are the files of an earlier format of the cache (one file per chunk), whose folders have
  other names. A chunk rewritten in place by other means with nothing of those changed cannot be told without a
  request per chunk: clear the cache then (:func:`clear_cache`, or ``python -m zarrtorch cache clear DIR``).
- **A size limit.** With ``cache_limit_bytes``, the least recently used packs (by modification time, renewed at a
  hit when older than :data:`RENEW_AFTER_S`: a system call per pack a minute at most, not per read) are deleted
  before a new one is written, so the directory stays under the limit; a chunk larger than the limit is not kept.

Metadata documents are never cached (they are read once, when a dataset opens its store), nor byte ranges of a
chunk not cached whole (a shard read inner chunk by inner chunk is fetched as before).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import hashlib
import itertools
import json
import multiprocessing.util
import os
import secrets
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zarr
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.storage import WrapperStore

from zarrtorch._compat.zarr import array_on_store
from zarrtorch._read.checksum import crc32c_holds, ends_with_crc32c
from zarrtorch._read.packs import (
    HEADER_BYTES,
    KEY_MOST_BYTES,
    SUFFIX,
    index_length,
    pack_parts,
    parse_index,
    record_body,
    record_overhead,
)

WRITE_ID = "write_id"  # in a group's "zarrtorch" attributes (prepare_zarr): new at every write of the store
MARKER = "ZARRTORCH_CACHE"  # a file in the cache's root: clear_cache removes nothing from a folder without it
FORMAT = "packs-1"  # in every store id: a cache folder of another format (one file per chunk) is never read
RENEW_AFTER_S = 60.0  # a hit renews a pack's modification time (its place in the LRU order) when older than this
_WRITES = itertools.count()  # temporary files' numbers in this process
_LOCK = ".lock"  # the file writers under a limit lock, in the cache's root
_INDEX_FIRST_READ = 4096  # bytes of a pack read to learn its keys: its header and index, unless they are longer
_THREADS_WRITING = threading.Lock()


def _new_lock_after_fork() -> None:
    # a lock held by a thread of the parent at the fork would be held forever in the child, which has no such thread
    global _THREADS_WRITING
    _THREADS_WRITING = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)
_METADATA_KEYS = ("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata")


# (cache root, store id) -> key -> (pack name, record offset, record length): the packs this process wrote since its
# last listing of the store, for every ChunkCache of that root in the process (two datasets of one store share them)
_RECENT: dict[tuple[str, str], dict[str, tuple[str, int, int]]] = {}


@dataclass(frozen=True)
class _Listing:
    """What one store's folder held at its last listing: each chunk's key hash (sorted), and per chunk a row of its
    key hash, pack number, record offset and record length; the packs' names and modification times by number.
    Replaced whole at each listing, never changed (but a pack's time when a hit renews it): reading threads use it
    while the next one is made. 40 bytes a chunk."""

    hashes: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    rows: np.ndarray = field(default_factory=lambda: np.empty((0, 4), np.int64))  # hash, pack, offset, length
    names: list = field(default_factory=list)  # pack number -> its file name (None: gone at a later listing)
    numbers: dict = field(default_factory=dict)  # file name -> pack number, of the packs listed
    mtimes: list = field(default_factory=list)  # pack number -> modification time, as listed or renewed here

    def find(self, key: str) -> tuple[str, int, int, int] | None:
        """``(pack name, record offset, record length, pack number)`` of ``key``, if listed (a hash shared by two
        keys finds one of them: its record names its key, and the other key's is refused when read). A warm read
        pays this per chunk: one search and one row read out as Python ints, not a numpy scalar per field."""
        h = hash(key)
        at = self.hashes.searchsorted(h)
        if at == len(self.hashes):
            return None
        found, number, offset, length = self.rows[at].tolist()
        return None if found != h else (self.names[number], offset, length, number)


class ChunkCache:
    """Packs of stored chunks under ``root`` (created if missing), ``limit_bytes`` in all at most (``None``: no
    limit). Which chunks a store's packs hold is learnt from their indexes, once per pack and process, at a listing
    (:meth:`keys_held`, once an epoch; or at the first read of a store). Picklable: a worker process opens the same
    folder and lists it itself."""

    def __init__(self, root: str | os.PathLike, limit_bytes: int | None = None):
        self.root = Path(root)
        self.limit_bytes = limit_bytes
        self._folders: set[Path] = set()  # store folders this process made or found
        self._root_text = str(self.root) + os.sep  # a pack's name is joined as text when read: no Path per read
        self._listings: dict[str, _Listing] = {}  # store id -> its last listing

    def __getstate__(self) -> dict:
        return {"root": self.root, "limit_bytes": self.limit_bytes}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["root"], state["limit_bytes"])

    def __repr__(self) -> str:
        return f"ChunkCache({str(self.root)!r}, limit_bytes={self.limit_bytes})"

    def prepare(self) -> None:
        """Create the folder and its marker, and check that files can be written and renamed there: a cache
        that cannot be written is refused when the options are made, not ignored chunk by chunk."""
        self.root.mkdir(parents=True, exist_ok=True)
        marker = self.root / MARKER
        if not marker.exists():
            _write_atomically(marker, b"zarrtorch chunk cache: python -m zarrtorch cache clear DIR empties it\n")

    def pack_path(self, store_id: str, name: str) -> Path:
        """The file of pack ``name`` of the store ``store_id``."""
        return self.root / store_id / name

    def where(self, store_id: str, key: str) -> tuple[str, int, int, int | None] | None:
        """``(pack name, record offset, record length, pack number or None)`` of ``key`` as this process knows it
        (its last listing of the store, made now if there was none, and the packs it wrote since), else ``None``."""
        listing = self._listings.get(store_id)
        if listing is None:
            listing = self._list(store_id)
        found = listing.find(key)
        if found is not None:
            return found
        recent = _RECENT.get((self._root_text, store_id))
        placed = recent.get(key) if recent else None
        return None if placed is None else (*placed, None)

    def read(self, store_id: str, key: str) -> memoryview | None:
        """The chunk's bytes if a whole, intact record of a pack holds them; a pack whose record is damaged is
        deleted (``None``: fetch it)."""
        found = self.where(store_id, key)
        if found is None:
            return None
        name, offset, length, number = found
        path = f"{self._root_text}{store_id}{os.sep}{name}"
        try:
            record = _read_range(path, offset, length)
        except (FileNotFoundError, NotADirectoryError):  # evicted, cleared or dropped since it was listed
            return None
        body = record_body(record, key)
        if body is None:
            _remove(Path(path))  # one damaged record: the whole pack goes, its other chunks are fetched again
            return None
        if number is not None:
            self._renew(store_id, number, path)
        return body

    def _renew(self, store_id: str, number: int, path: str) -> None:
        """A hit: the pack's modification time renewed (the last to be evicted) once it is older than
        :data:`RENEW_AFTER_S`."""
        listing = self._listings.get(store_id)
        if listing is None or number >= len(listing.mtimes):
            return
        now = time.time()
        if listing.mtimes[number] >= now - RENEW_AFTER_S:
            return
        try:
            os.utime(path)
            listing.mtimes[number] = now
        except OSError:  # evicted meanwhile by another process: the bytes read are still right
            pass

    def write(self, store_id: str, key: str, data: bytes) -> None:
        """Keep one chunk, in a pack of its own (:meth:`write_pack`)."""
        self.write_pack(store_id, [(key, data)])

    def write_pack(self, store_id: str, entries: list[tuple[str, bytes]]) -> None:
        """Keep ``entries`` (key, bytes) as one pack (room made first under the limit); a pack larger than the limit
        is not kept. Best effort once the folder was checked: a full disk or a pack evicted by another process
        mid-write only means its chunks are fetched again next time."""
        entries = [(k, d) for k, d in entries if len(k.encode()) <= KEY_MOST_BYTES]
        if not entries:
            return
        parts, placed = pack_parts(entries)  # the checks computed before the lock: the bodies as they are, no copy
        size = sum(len(p) for p in parts)
        if self.limit_bytes is not None and size > self.limit_bytes:
            return
        name = f"{secrets.token_hex(8)}{SUFFIX}"
        path = self.pack_path(store_id, name)
        try:
            self._write_in_folder(path, parts, size)
        except FileNotFoundError:  # the store's folder removed meanwhile (a clear): made again, the pack kept
            self._folders.discard(path.parent)
            try:
                self._write_in_folder(path, parts, size)
            except OSError:
                return
        except OSError:
            return
        recent = _RECENT.setdefault((self._root_text, store_id), {})
        for key, offset, length in placed:
            recent[key] = (name, offset, length)

    def _write_in_folder(self, path: Path, parts: list, size: int) -> None:
        if path.parent not in self._folders:  # made once per process: a system call less per pack
            path.parent.mkdir(exist_ok=True)
            self._folders.add(path.parent)
        if self.limit_bytes is None:
            _write_atomically(path, *parts)
            return
        with self._writing_alone():  # room counted and filled by one writer of the node at a time
            self.make_room(size)
            _write_atomically(path, *parts)

    @contextlib.contextmanager
    def _writing_alone(self):
        """Hold the cache's lock file: with a limit, two writers that each found room for one pack would
        together overfill it. Threads of a process wait on a lock of its own first, then on the file."""
        with _THREADS_WRITING:
            with open(self.root / _LOCK, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)

    def _list(self, store_id: str) -> _Listing:
        """List the store's folder (one directory listing) and read the index of each pack not listed before in this
        process (packs are never changed once published: a name is read once); a pack whose index is damaged, or
        that is cut short, is deleted. The new listing replaces the last whole."""
        last = self._listings.get(store_id) or _Listing()
        # the packs this process wrote, before the folder is read: each is listed now, or was gone or damaged
        recent = dict(_RECENT.get((self._root_text, store_id), {}))
        try:
            with os.scandir(self.root / store_id) as entries:
                present = {e.name for e in entries if e.name.endswith(SUFFIX) and not e.name.startswith(".")}
        except (FileNotFoundError, NotADirectoryError):
            present = set()
        names, mtimes = list(last.names), list(last.mtimes)
        numbers = {name: n for name, n in last.numbers.items() if name in present}
        gone = [n for name, n in last.numbers.items() if name not in present]
        for n in gone:
            names[n] = None
        kept = ~np.isin(last.rows[:, 1], np.asarray(gone, np.int64)) if gone else slice(None)
        rows = [last.rows[kept]]
        for name in sorted(present - last.numbers.keys()):
            path = self.root / store_id / name
            try:
                listed = _read_index(path)
            except (FileNotFoundError, NotADirectoryError):  # evicted or dropped since the folder was read
                continue
            if listed is None:
                _remove(path)  # its index is damaged or the pack cut short: none of its chunks is served
                continue
            placed, mtime = listed
            number = len(names)
            names.append(name)
            mtimes.append(mtime)
            numbers[name] = number
            rows.append(np.array([(hash(k), number, o, n) for k, o, n in placed], np.int64).reshape(-1, 4))
        table = np.concatenate(rows)
        table = table[np.argsort(table[:, 0], kind="stable")]
        listing = _Listing(np.ascontiguousarray(table[:, 0]), table, names, numbers, mtimes)
        self._listings[store_id] = listing
        written = _RECENT.get((self._root_text, store_id))
        if written:  # found in the listing from now on (or gone); a pack written since the folder was read stays
            for key, placed in recent.items():
                if written.get(key) == placed:
                    written.pop(key, None)
        return listing

    def keys_held(self, store_id: str, also: list[str] = ()) -> np.ndarray:
        """The keys the store's packs hold now (listed again: :meth:`_list`), those of the packs this process wrote
        since, and the keys ``also``, as sorted hashes: 8 bytes a key, not a set of keys (~90 bytes each), on a
        store of millions of chunks."""
        listing = self._list(store_id)
        extra = [*_RECENT.get((self._root_text, store_id), {}), *also]
        hashes = np.concatenate([listing.hashes, np.fromiter(map(hash, extra), np.int64, len(extra))])
        hashes.sort()
        return hashes

    def drop(self, store_id: str, key: str) -> None:
        """Forget the chunk (its bytes did not decode: they are fetched again from the store): its pack is deleted,
        the other chunks of the pack are fetched again when next read."""
        found = self.where(store_id, key)
        if found is not None:
            _remove(self.pack_path(store_id, found[0]))
        recent = _RECENT.get((self._root_text, store_id))
        if recent:
            recent.pop(key, None)

    def files(self) -> list[tuple[float, int, Path]]:
        """Every file of the cache as ``(modification time, size, path)``: its packs, temporary files, and files of an
        earlier format."""
        found = []
        for folder in _store_folders(self.root):
            for entry in os.scandir(folder):
                try:
                    info = entry.stat()
                except FileNotFoundError:
                    continue
                found.append((info.st_mtime, info.st_size, Path(entry.path)))
        return found

    def make_room(self, size: int) -> None:
        """Delete the least recently used files (packs) until ``size`` more bytes fit under the limit."""
        files = self.files()
        total = sum(s for _, s, _ in files)
        for _, file_size, path in sorted(files, key=lambda f: f[0]):
            if total + size <= self.limit_bytes:
                break
            _remove(path)
            total -= file_size


def _listed(hashes: np.ndarray, key: str) -> bool:
    """Whether ``key`` is among the sorted ``hashes`` (:meth:`ChunkCache.keys_held`; two keys of one hash only
    cost a look at the pack, whose record names its key)."""
    if not len(hashes):  # a cold epoch's listing: no numpy call per chunk (2% of a cold epoch's samples)
        return False
    h = hash(key)
    at = int(np.searchsorted(hashes, h))
    return at < len(hashes) and int(hashes[at]) == h


def _read_range(path: str, offset: int, length: int) -> bytes:
    """``length`` bytes of the file from ``offset`` (fewer where it is shorter), in three system calls and no file
    object: each call is a wait to take the GIL back while the reader decodes in other threads."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


def _read_index(path: Path) -> tuple[list[tuple[str, int, int]], float] | None:
    """A pack's entries ``(key, record offset, record length)`` and its modification time; ``None`` when its index
    is damaged or it is cut short."""
    fd = os.open(path, os.O_RDONLY)
    try:
        info = os.fstat(fd)
        head = os.pread(fd, _INDEX_FIRST_READ, 0)
        need = index_length(head)
        if need is not None and need > len(head):
            head = os.pread(fd, need, 0)
    finally:
        os.close(fd)
    placed = parse_index(head, info.st_size)
    return None if placed is None else (placed, info.st_mtime)


def _write_atomically(path: Path, *parts: bytes) -> None:
    """``parts`` written one after another to a temporary file beside ``path``, then renamed onto it: never seen
    half written. Few system calls (each hands the GIL over and waits to take it back, while the reader decodes in
    other threads), and no fsync: a crash leaves a temporary file or a whole renamed one, and a file the disk lost
    part of fails its check on read."""
    temporary = f"{path.parent}{os.sep}.tmp-{os.getpid()}-{threading.get_ident()}-{next(_WRITES)}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            views = [memoryview(p).cast("B") for p in parts]
            while views:
                written = os.writev(fd, views)
                views = _after(views, written)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        _remove(Path(temporary))
        raise


def _after(views: list[memoryview], written: int) -> list[memoryview]:
    """What is left of ``views`` once their first ``written`` bytes are written (``os.writev`` may write less)."""
    left = []
    for view in views:
        if written >= len(view):
            written -= len(view)
            continue
        left.append(view[written:])
        written = 0
    return left


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _store_folders(root: Path) -> list[Path]:
    """The per-store folders of a cache (named by a store id: hexadecimal)."""
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    return [Path(e.path) for e in entries if e.is_dir() and _is_store_id(e.name)]


def _is_store_id(name: str) -> bool:
    return len(name) == 32 and all(c in "0123456789abcdef" for c in name)


def clear_cache(cache_dir: str | os.PathLike) -> int:
    """Empty the chunk cache at ``cache_dir`` (``ReadOptions(cache_dir=...)``); returns the bytes freed. Only a
    folder the loader made a cache of is touched (its ``ZARRTORCH_CACHE`` file), and in it only the cache's
    files: a mistyped path deletes nothing."""
    root = Path(cache_dir)
    if not root.is_dir():
        return 0
    if not (root / MARKER).exists():
        raise ValueError(
            f"{root} is not a zarrtorch chunk cache (no {MARKER} file in it): nothing was deleted. Pass the "
            "folder given as ReadOptions(cache_dir=...)"
        )
    freed = sum(size for _, size, _ in ChunkCache(root).files())
    for folder in _store_folders(root):
        shutil.rmtree(folder, ignore_errors=True)
    return freed


# -- a store that reads through the cache -------------------------------------------------------------------
READING_THREADS = 8  # threads per process reading the cache's files
WRITING_THREADS = 1  # and writing them: more only fought the event loop and the decoding threads for the GIL
PACK_CHUNKS = 16  # chunks of one store a pack holds at most: one inode for 16 (a new file's open cost 183-193 us)
PACK_MOST_BYTES = 4 << 20  # and bytes (under a limit, an eighth of it at most: eviction frees a small part)

_executors: dict[str, concurrent.futures.ThreadPoolExecutor] = {}  # this process's, made at their first use
# chunks handed over and not written yet: (root, store id, key) -> [future of their pack's write, or None while
# their pack is still being filled; bytes], and their bytes in all
_pending: dict[tuple[str, str, str], list] = {}
_pending_bytes = [0]
PENDING_MOST_BYTES = 256 << 20  # beyond, a fetched chunk is not kept: a slow disk does not fill the memory
_PENDING_LOCK = threading.Lock()


@dataclass
class _OpenPack:
    """The chunks of one store handed over and not written yet, filling the next pack."""

    cache: ChunkCache
    keys: list = field(default_factory=list)
    nbytes: int = 0


_open: dict[tuple[str, str], _OpenPack] = {}  # (root, store id) -> the pack being filled


def cache_threads(role: str = "read") -> concurrent.futures.ThreadPoolExecutor:
    """The threads that read (``role="read"``) or write (``"write"``) the cache's files: not zarr's event loop,
    which every request in flight shares, nor its default executor (a few threads, which the network client uses
    too)."""
    if role not in _executors:
        threads = READING_THREADS if role == "read" else WRITING_THREADS
        _executors[role] = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix=f"zarrtorch-cache-{role}")
        if role == "write":
            multiprocessing.util.Finalize(None, wait_for_writes, exitpriority=10)  # a worker process ends: written
    return _executors[role]


def _pack_most_bytes(cache: ChunkCache) -> int:
    return PACK_MOST_BYTES if cache.limit_bytes is None else max(1, min(PACK_MOST_BYTES, cache.limit_bytes // 8))


def write_soon(cache: ChunkCache, store_id: str, key: str, data: bytes) -> None:
    """Keep ``data`` in the cache, in a pack written by a thread of its own: a fetched chunk is handed to the reader at
    once, not after its pack is written. The pack is written once it holds :data:`PACK_CHUNKS` chunks (or
    :data:`PACK_MOST_BYTES`), at the end of an epoch (:func:`flush_writes`) or of the process; until then
    :func:`pending` serves the chunk (the writes of a fast first epoch lag behind its fetches, and a second epoch
    fetched them again). Past :data:`PENDING_MOST_BYTES` waiting, it is not kept."""
    root = str(cache.root)
    where = (root, store_id, key)
    cache_threads("write")  # made now: a process that ends writes what it holds (its finalizer)
    with _PENDING_LOCK:
        if _pending_bytes[0] + len(data) > PENDING_MOST_BYTES:
            return
        _forget_pending(where)
        pack = _open.get((root, store_id))
        if pack is None:
            pack = _open[(root, store_id)] = _OpenPack(cache)
        full = []
        most = _pack_most_bytes(cache)
        if pack.keys and pack.nbytes + len(data) > most:  # a pack stays under the bytes unless one chunk is more
            full.append(_submitted(root, store_id, pack))
        _pending[where] = [None, data]
        _pending_bytes[0] += len(data)
        pack.keys.append(key)
        pack.nbytes += len(data)
        if len(pack.keys) >= PACK_CHUNKS or pack.nbytes >= most:
            full.append(_submitted(root, store_id, pack))
    _when_written(full)


def _submitted(root: str, store_id: str, pack: _OpenPack) -> tuple:
    """Hand ``pack``'s chunks to the writing thread (under ``_PENDING_LOCK``) and start a new pack; returns the write's
    future and its places, for :func:`_when_written` once the lock is released. The interpreter shutting down: written
    in this thread."""
    wheres = [(root, store_id, key) for key in pack.keys]
    entries = [(key, _pending[w][1]) for key, w in zip(pack.keys, wheres, strict=True)]
    pack.keys, pack.nbytes = [], 0
    try:
        future = cache_threads("write").submit(pack.cache.write_pack, store_id, entries)
    except RuntimeError:  # the executor is shut down (the end of the interpreter): written here, before it ends
        future = concurrent.futures.Future()
        try:
            pack.cache.write_pack(store_id, entries)
        finally:
            future.set_result(None)
    for w in wheres:
        _pending[w][0] = future
    return future, wheres


def _when_written(submitted: list) -> None:
    """Once each write is done, its chunks are no longer pending (outside ``_PENDING_LOCK``: a write done already
    calls back at once)."""
    for future, wheres in submitted:
        future.add_done_callback(lambda done, wheres=wheres: _written(wheres, done))


def _forget_pending(where: tuple[str, str, str]) -> None:
    """Forget a chunk handed over (under ``_PENDING_LOCK``); still in a pack being filled, it leaves the pack."""
    earlier = _pending.pop(where, None)
    if earlier is None:
        return
    _pending_bytes[0] -= len(earlier[1])
    if earlier[0] is None:
        pack = _open.get(where[:2])
        if pack is not None and where[2] in pack.keys:
            pack.keys.remove(where[2])
            pack.nbytes -= len(earlier[1])


def _written(wheres: list, future: concurrent.futures.Future) -> None:
    with _PENDING_LOCK:
        for where in wheres:
            if _pending.get(where, (None,))[0] is future:  # not a later write of the same chunk
                _forget_pending(where)


def flush_writes() -> None:
    """Hand the packs being filled to the writing thread, however few chunks they hold: at the end of an epoch (the
    next one, or another worker, finds them in the cache's files) and before this process waits for its writes."""
    with _PENDING_LOCK:
        submitted = [_submitted(*at, pack) for at, pack in _open.items() if pack.keys]
    _when_written(submitted)


def pending(cache: ChunkCache, store_id: str, key: str) -> memoryview | None:
    """The bytes of a chunk handed to the cache and not written yet, else ``None``."""
    with _PENDING_LOCK:
        waiting = _pending.get((str(cache.root), store_id, key))
    return None if waiting is None else memoryview(waiting[1])


def pending_keys(cache: ChunkCache, store_id: str) -> list[str]:
    """The keys of the chunks of ``store_id`` handed to the cache by this process and not written yet."""
    root = str(cache.root)
    with _PENDING_LOCK:
        return [key for r, s, key in _pending if r == root and s == store_id]


def wait_for_writes(cache: ChunkCache | None = None, store_id: str = "", key: str = "") -> None:
    """Wait until this process's chunks handed to the cache are written, the packs being filled written first (at the
    end of a process: a DataLoader worker ends with ``os._exit``, which waits for no thread; before counting what a
    cache holds). With ``cache``: that one chunk's write, before the chunk is dropped (its write landing after would
    bring it back); still in a pack being filled, it is taken out of it, never written."""
    if cache is None:
        flush_writes()
        with _PENDING_LOCK:
            waiting = [w[0] for w in _pending.values() if w[0] is not None]
        concurrent.futures.wait(waiting)
        return
    with _PENDING_LOCK:
        where = (str(cache.root), store_id, key)
        waiting = _pending.get(where)
        if waiting is not None and waiting[0] is None:
            _forget_pending(where)
            return
    if waiting is not None:
        concurrent.futures.wait([waiting[0]])


def _after_fork() -> None:
    # the parent's threads do not exist in a forked child, nor its writes; its locks may be held by them
    global _PENDING_LOCK
    _PENDING_LOCK = threading.Lock()
    _executors.clear()
    _pending.clear()
    _open.clear()
    _pending_bytes[0] = 0


os.register_at_fork(after_in_child=_after_fork)


class CachingStore(WrapperStore):
    """A read-through wrapper of a remote store: a whole object's bytes come from the cache when it holds them,
    else from the store, then kept (:func:`write_soon`). Files are read and written in threads of their own
    (:func:`cache_threads`). ``checksummed``: each object ends with a crc32c, checked before it is kept."""

    def __init__(self, store, *, cache: ChunkCache, store_id: str, checksummed: bool = False):
        super().__init__(store)
        self.cache, self.store_id, self.checksummed = cache, store_id, checksummed
        self._listed: np.ndarray | None = None  # the keys the cache held at the last listing (None: not listed)

    def __getstate__(self) -> dict:
        # a listing is this process's: its hashes of names are salted per process (a spawned worker's differ)
        return {**super().__getstate__(), "_listed": None}

    def _with_store(self, store):
        return type(self)(store, cache=self.cache, store_id=self.store_id, checksummed=self.checksummed)

    def __str__(self) -> str:  # messages name the store as before
        return str(self._store)

    def __repr__(self) -> str:
        return f"CachingStore({self._store!r}, {self.cache!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CachingStore) and self.store_id == other.store_id and self._store.__eq__(other._store)

    async def get(self, key: str, prototype, byte_range: ByteRequest | None = None):
        if key.endswith(_METADATA_KEYS):
            return await self._store.get(key, prototype, byte_range)
        held = await asyncio.get_running_loop().run_in_executor(cache_threads(), self.held, key)
        if held is not None:
            return prototype.buffer.from_bytes(_cut(held, byte_range))
        got = await self._store.get(key, prototype, byte_range)
        if got is not None and byte_range is None:
            self.keep(key, got.to_bytes())
        return got

    def held(self, key: str) -> memoryview | None:
        """The chunk's bytes from the cache's packs, or from a write not finished yet; ``None``: fetch it. Missed by
        both, the packs are looked in once more: a chunk stops waiting only once its pack is known to this process,
        so a write that lands between the first two looks is found by the third."""
        found = self.cache.read(self.store_id, key)
        if found is None:
            found = pending(self.cache, self.store_id, key)
        return found if found is not None else self.cache.read(self.store_id, key)

    def forget(self, key: str) -> None:
        wait_for_writes(self.cache, self.store_id, key)
        self.cache.drop(self.store_id, key)

    def list_held(self) -> None:
        """List the chunks the cache's packs hold for this store, once an epoch: a chunk not among them (nor waiting
        to be written) is requested from the store at once, not looked for first in a reading thread, where the look
        waits behind the decodes queued there. A pack another process writes after the listing is only fetched once
        more; one deleted after it is looked for, missed and fetched. The chunks this process is still writing count
        as listed, taken before the folder is read: a write that lands in between is in one or the other."""
        waiting = pending_keys(self.cache, self.store_id)
        self._listed = self.cache.keys_held(self.store_id, also=waiting)

    def may_hold(self, key: str) -> bool:
        """Whether the cache may hold ``key`` (listed, or waiting to be written): if not, fetch it at once."""
        listed = self._listed
        if listed is None or _listed(listed, key):
            return True
        return pending(self.cache, self.store_id, key) is not None

    def keep(self, key: str, data: bytes) -> None:
        """Keep ``data`` as ``key``'s record in a pack (:func:`write_soon`), unless its crc32c does not hold: damaged
        bytes are the reader's error to name, never a record that later epochs would start from."""
        if self.checksummed and not crc32c_holds(data):
            return
        write_soon(self.cache, self.store_id, key, data)

    def origin(self):
        """The store read through: where a chunk the cache does not hold is fetched from."""
        return self._store


def _cut(data: memoryview, byte_range: ByteRequest | None) -> memoryview:
    """``data``'s bytes that ``byte_range`` asks for, as a store answers it."""
    if byte_range is None:
        return data
    if isinstance(byte_range, RangeByteRequest):
        return data[byte_range.start : byte_range.end]
    if isinstance(byte_range, OffsetByteRequest):
        return data[byte_range.offset :]
    if isinstance(byte_range, SuffixByteRequest):
        return data[max(0, len(data) - byte_range.suffix) :]
    raise TypeError(f"unknown byte range {byte_range!r}")


def reads_through_cache(arr: zarr.Array) -> bool:
    """Whether ``arr`` reads its chunks through a node's chunk cache."""
    return isinstance(arr.store_path.store, CachingStore)


def cached_bytes(store, key: str) -> memoryview | None:
    """The bytes of ``key`` that the cache ``store`` reads through holds (verified), else ``None``: read here, in
    the caller's thread, not on zarr's event loop."""
    return store.held(key)


def keep_cached(store, key: str, data: bytes) -> None:
    """Keep ``data`` as ``key`` in the cache ``store`` reads through (:func:`write_soon`)."""
    store.keep(key, data)


def may_be_cached(store, key: str) -> bool:
    """Whether the cache ``store`` reads through may hold ``key`` (:meth:`CachingStore.may_hold`)."""
    return store.may_hold(key)


def list_cached(arr: zarr.Array) -> None:
    """List what ``arr``'s cache holds of it now, if it reads through one (:meth:`CachingStore.list_held`)."""
    store = arr.store_path.store
    if isinstance(store, CachingStore):
        store.list_held()


def uncached(store):
    """The store a cache ``store`` reads through: what a chunk the cache does not hold is fetched from."""
    return store.origin()


def forget_cached(arr: zarr.Array, key: str) -> None:
    """Drop ``key`` of ``arr`` from its cache, if it reads through one (its bytes did not decode)."""
    store = arr.store_path.store
    if isinstance(store, CachingStore):
        store.forget(key)


def store_address(store) -> str:
    """Where ``store`` is: its text (``<FsspecStore(S3FileSystem, bucket/path.zarr)>``) and, for an S3-compatible
    service named by an endpoint, that endpoint, which the text leaves out: one bucket and path on two services
    are two stores."""
    options = getattr(getattr(store, "fs", None), "storage_options", None) or {}
    endpoint = options.get("endpoint_url") or (options.get("client_kwargs") or {}).get("endpoint_url")
    return f"{store} at {endpoint}" if endpoint else str(store)


def store_id(arr: zarr.Array, first_bytes: bytes | None, group_attrs: dict) -> str:
    """The folder of ``arr``'s chunks in a cache: a digest of the cache's :data:`FORMAT`, its store's address, its
    path, its metadata, its group's attributes and ``first_bytes`` (of its first chunk): another store, this one
    rewritten, or a cache of another format, gets another folder."""
    described = (arr.metadata.to_dict(), dict(group_attrs))
    described_text = json.dumps(described, sort_keys=True, default=repr)
    text = repr((FORMAT, store_address(arr.store_path.store), arr.path, described_text))
    return hashlib.blake2b(text.encode() + (first_bytes or b"missing"), digest_size=16).hexdigest()


def through_cache(arr: zarr.Array, cache: ChunkCache, first_bytes: bytes | None, group_attrs: dict) -> zarr.Array:
    """``arr`` reading its chunks through ``cache`` (``first_bytes``: of its first chunk, and ``group_attrs``: of
    the group it was opened from, for its store id)."""
    wrapped = CachingStore(
        arr.store_path.store,
        cache=cache,
        store_id=store_id(arr, first_bytes, group_attrs),
        checksummed=ends_with_crc32c(arr),
    )
    return array_on_store(arr, wrapped)


def check_limit_holds_a_chunk(cache: ChunkCache, name: str, first_bytes: bytes | None) -> None:
    """Refuse a ``cache_limit_bytes`` smaller than array ``name``'s first chunk (``first_bytes``: as much of it as
    the range read at opening got, so at least its size) in a pack of its own: the cache would keep none of its
    chunks (a pack larger than the limit is not kept), and every epoch would fetch each one again, silently."""
    if cache.limit_bytes is None or first_bytes is None:
        return
    least = HEADER_BYTES + record_overhead(f"{name}/0") + len(first_bytes)  # its key is that long at least
    if cache.limit_bytes < least:
        raise ValueError(
            f"cache_limit_bytes={cache.limit_bytes} cannot hold one chunk of array {name!r}: its first one takes at "
            f"least {least:,} bytes in the cache, so no chunk would be kept and every epoch would fetch each one "
            "again. The limit is in bytes (200 * 2**30 is 200 GiB): give room for many chunks, or leave it out"
        )
