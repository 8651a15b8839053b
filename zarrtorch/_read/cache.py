"""A node-local cache of a remote store's chunks: epochs after the first read them from local disk.

Without it every epoch from a URL fetches every chunk again. With ``ReadOptions(cache_dir=...)`` each chunk's
stored (still encoded) bytes are kept in ``cache_dir``, shared by every rank and worker of the node, and read
from there the next time. The rules that keep it from ever serving a wrong byte:

- **Atomic writes.** A chunk is written to a temporary file beside its place, then renamed there: a reader sees
  a whole file or none, and of two processes writing the same chunk the last rename wins, with the same bytes.
- **Verified reads.** Each file starts with a header stating the length and the CRC of the bytes after it
  (CRC-32C, computed by the processor, or zlib's CRC-32: the header names which); a file that is short,
  lengthened or altered is deleted and the chunk fetched again, never served. (A CRC catches every cut, every
  burst of up to 32 flipped bits and all but 2**-32 of other damage: the cache guards against accidents, not an
  attacker who can write its folder, at a small part of a cryptographic digest's cost per read.)
- **Damaged chunks are not kept.** A chunk that does not decode is dropped, fetched once more from the store, and
  dropped again if that fails too; one whose crc32c (the last codec of ``prepare_zarr``'s Blosc and uncompressed
  stores) does not hold is never written.
- **A store id per array.** Files live under a directory named by a digest of the store's address, the
  array's path, its metadata, its group's attributes and the first bytes of its first chunk: a store rewritten
  by ``prepare_zarr`` (a new ``write_id`` in the group's attributes at every write), or with other metadata (a
  new shape, chunking, codec, attributes), or another first chunk, has another id, and its old files are never
  read. A chunk rewritten in place by other means with nothing of those changed cannot be told without a
  request per chunk: clear the cache then (:func:`clear_cache`, or ``python -m zarrtorch cache clear DIR``).
- **A size limit.** With ``cache_limit_bytes``, the least recently used files (by modification time, renewed
  at a hit when older than :data:`RENEW_AFTER_S`: a system call per file a minute at most, not per read) are
  deleted before a new one is written, so the directory stays under the limit; a chunk larger than the limit
  is not kept.

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
import re
import shutil
import threading
import time
import zlib
from pathlib import Path
from urllib.parse import quote

import numpy as np
import zarr
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.storage import WrapperStore

from zarrtorch._compat.zarr import array_on_store
from zarrtorch._read.checksum import crc32c, crc32c_holds, crc32c_in_hardware, ends_with_crc32c

WRITE_ID = "write_id"  # in a group's "zarrtorch" attributes (prepare_zarr): new at every write of the store
MARKER = "ZARRTORCH_CACHE"  # a file in the cache's root: clear_cache removes nothing from a folder without it
_MAGIC_CRC32 = b"ZTCACHE2"  # a file's header names its check: CRC-32 (zlib's)
_MAGIC_CRC32C = b"ZTCACHE3"  # or CRC-32C (Castagnoli), one instruction of the processor's: a sixth of zlib's time
_DIGEST = 4  # bytes of the check in a file's header
_HEADER = len(_MAGIC_CRC32) + 8 + _DIGEST
RENEW_AFTER_S = 60.0  # a hit renews a file's modification time (its place in the LRU order) when older than this
_WRITES = itertools.count()  # temporary files' numbers in this process
_LOCK = ".lock"  # the file writers under a limit lock, in the cache's root
_THREADS_WRITING = threading.Lock()


def _new_lock_after_fork() -> None:
    # a lock held by a thread of the parent at the fork would be held forever in the child, which has no such thread
    global _THREADS_WRITING
    _THREADS_WRITING = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)
_METADATA_KEYS = ("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.~/-]*\Z")  # the characters ``quote`` leaves as they are, and slashes


def file_name(key: str) -> str:
    """``key`` as one file name: quoted whole, its slashes too. A key of letters, digits, ``_.~-`` and slashes (a
    chunk key) by replacing its slashes: ``quote`` maps each byte through a dict (8 us a key under cProfile, twice per
    warm chunk: the listing's look-up, the file's name)."""
    return key.replace("/", "%2F") if _PLAIN_KEY.match(key) else quote(key, safe="")


def _crc32(data) -> bytes:
    """zlib's CRC-32 of ``data``: a fifth of a cryptographic digest's cost (14 us per 58 KiB chunk here)."""
    return zlib.crc32(data).to_bytes(_DIGEST, "little")


def _crc32c(data) -> bytes:
    """CRC-32C of ``data`` (google_crc32c's compiled module: 2.3 us per 58 KiB chunk here)."""
    return crc32c(data).to_bytes(_DIGEST, "little")


_CHECKS = {_MAGIC_CRC32: _crc32, _MAGIC_CRC32C: _crc32c}  # a file is verified by the check its header names
# written with CRC-32C where the processor computes it (``google_crc32c``'s compiled module; its pure-Python one
# would take milliseconds a chunk): files of either kind are read, by any process, whatever it writes
_MAGIC = _MAGIC_CRC32C if crc32c_in_hardware() else _MAGIC_CRC32


def _digest(data) -> bytes:
    """The check this process writes in a file's header (:data:`_MAGIC` names it)."""
    return _CHECKS[_MAGIC](data)


class ChunkCache:
    """Files of stored chunks under ``root`` (created if missing), ``limit_bytes`` in all at most (``None``: no
    limit). Picklable: a worker process opens the same folder."""

    def __init__(self, root: str | os.PathLike, limit_bytes: int | None = None):
        self.root = Path(root)
        self.limit_bytes = limit_bytes
        self._folders: set[Path] = set()  # store folders this process made or found
        self._root_text = str(self.root) + os.sep  # a file's name is joined as text when read: no Path per read

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

    def path(self, store_id: str, key: str) -> Path:
        """The file of ``key`` of the store ``store_id``: the key quoted whole (its slashes too), one folder per
        store."""
        return self.root / store_id / file_name(key)

    def read(self, store_id: str, key: str) -> memoryview | None:
        """The chunk's bytes if a whole, intact file holds them; a damaged file is deleted (``None``: fetch it)."""
        path = f"{self._root_text}{store_id}{os.sep}{file_name(key)}"
        try:
            data, modified = _read_file(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        body = _verified(data)
        if body is None:
            _remove(Path(path))
            return None
        if modified < time.time() - RENEW_AFTER_S:
            try:
                os.utime(path)  # used now: the last to be evicted
            except OSError:  # evicted meanwhile by another process: the bytes read are still right
                pass
        return body

    def write(self, store_id: str, key: str, data: bytes) -> None:
        """Keep ``data`` as the chunk's file (room made first under the limit); one too large for the limit is
        not kept. Best effort once the folder was checked: a full disk or a file evicted by another process
        mid-write only means the chunk is fetched again next time."""
        size = _HEADER + len(data)
        if self.limit_bytes is not None and size > self.limit_bytes:
            return
        path = self.path(store_id, key)
        parts = (_MAGIC + len(data).to_bytes(8, "little") + _digest(data), data)  # written as they are: no copy
        try:
            if path.parent not in self._folders:  # made once per process: a system call less per chunk
                path.parent.mkdir(exist_ok=True)
                self._folders.add(path.parent)
            if self.limit_bytes is None:
                _write_atomically(path, *parts)
                return
            with self._writing_alone():  # room counted and filled by one writer of the node at a time
                self.make_room(size)
                _write_atomically(path, *parts)
        except OSError:  # the folder removed meanwhile (a clear): made again at the next write
            self._folders.discard(path.parent)

    @contextlib.contextmanager
    def _writing_alone(self):
        """Hold the cache's lock file: with a limit, two writers that each found room for one chunk would
        together overfill it. Threads of a process wait on a lock of its own first, then on the file."""
        with _THREADS_WRITING:
            with open(self.root / _LOCK, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)

    def names(self, store_id: str, also: list[str] = ()) -> np.ndarray:
        """The files in the store's folder now (one directory listing) and the names ``also``, as the sorted
        hashes of their names (:func:`_name_hash`): 8 bytes a file, not a set of names (~90 bytes each), on a
        store of millions of chunks."""
        try:
            with os.scandir(self.root / store_id) as entries:
                hashes = np.fromiter((_name_hash(e.name) for e in entries), dtype=np.int64)
        except (FileNotFoundError, NotADirectoryError):
            hashes = np.empty(0, dtype=np.int64)
        hashes = np.concatenate([hashes, np.fromiter(map(_name_hash, also), dtype=np.int64, count=len(also))])
        hashes.sort()
        return hashes

    def drop(self, store_id: str, key: str) -> None:
        """Forget the chunk (its bytes did not decode: they are fetched again from the store)."""
        _remove(self.path(store_id, key))

    def files(self) -> list[tuple[float, int, Path]]:
        """Every file of the cache as ``(modification time, size, path)`` (temporary ones too)."""
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
        """Delete the least recently used files until ``size`` more bytes fit under the limit."""
        files = self.files()
        total = sum(s for _, s, _ in files)
        for _, file_size, path in sorted(files, key=lambda f: f[0]):
            if total + size <= self.limit_bytes:
                break
            _remove(path)
            total -= file_size


def _name_hash(name: str) -> int:
    """A file name's hash, for a listing kept in this process only (two names of one hash only cost a look at
    the disk)."""
    return hash(name)


def _listed(hashes: np.ndarray, name: str) -> bool:
    """Whether ``name`` is among the sorted ``hashes`` (:meth:`ChunkCache.names`)."""
    h = _name_hash(name)
    at = int(np.searchsorted(hashes, h))
    return at < len(hashes) and int(hashes[at]) == h


def _verified(data: bytes) -> memoryview | None:
    """The bytes after the header (a view: not copied) when the header states their length and digest, else
    ``None``."""
    check = _CHECKS.get(data[: len(_MAGIC)])  # files of another format (ZTCACHE1: a BLAKE2b digest): refused
    if len(data) < _HEADER or check is None:
        return None
    length = int.from_bytes(data[len(_MAGIC) : len(_MAGIC) + 8], "little")
    body = memoryview(data)[_HEADER:]
    if length != len(body) or check(body) != data[len(_MAGIC) + 8 : _HEADER]:
        return None
    return body


def _read_file(path: str | Path) -> tuple[bytes, float]:
    """The file's bytes and modification time, in four system calls and no file object: each call is a wait to
    take the GIL back while the reader decodes in other threads."""
    fd = os.open(path, os.O_RDONLY)
    try:
        info = os.fstat(fd)
        data = os.read(fd, info.st_size)
    finally:
        os.close(fd)
    return data, info.st_mtime


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

_executors: dict[str, concurrent.futures.ThreadPoolExecutor] = {}  # this process's, made at their first use
# writes handed over and not finished: (root, store id, key) -> (future, bytes), and their bytes in all
_pending: dict[tuple[str, str, str], tuple[concurrent.futures.Future, bytes]] = {}
_pending_bytes = [0]
PENDING_MOST_BYTES = 256 << 20  # beyond, a fetched chunk is not kept: a slow disk does not fill the memory
_PENDING_LOCK = threading.Lock()


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


def write_soon(cache: ChunkCache, store_id: str, key: str, data: bytes) -> None:
    """Keep ``data`` in the cache in a thread of its own: a fetched chunk is handed to the reader at once, not
    after its file is written. Until it is written, :func:`pending` serves it (the writes of a fast first epoch
    lag behind its fetches, and a second epoch fetched them again); past :data:`PENDING_MOST_BYTES` waiting, it
    is not kept."""
    where = (str(cache.root), store_id, key)
    with _PENDING_LOCK:
        if _pending_bytes[0] + len(data) > PENDING_MOST_BYTES:
            return
        try:
            future = cache_threads("write").submit(cache.write, store_id, key, data)
        except RuntimeError:  # the interpreter is shutting down: the chunk is not kept, and fetched again next time
            return
        _forget_pending(where)
        _pending[where] = (future, data)
        _pending_bytes[0] += len(data)
    future.add_done_callback(lambda done: _written(where, done))


def _forget_pending(where: tuple[str, str, str]) -> None:
    earlier = _pending.pop(where, None)
    if earlier is not None:
        _pending_bytes[0] -= len(earlier[1])


def _written(where: tuple[str, str, str], future: concurrent.futures.Future) -> None:
    with _PENDING_LOCK:
        if _pending.get(where, (None,))[0] is future:  # not a later write of the same chunk
            _forget_pending(where)


def pending(cache: ChunkCache, store_id: str, key: str) -> memoryview | None:
    """The bytes of a chunk handed to the cache and not written yet, else ``None``."""
    with _PENDING_LOCK:
        waiting = _pending.get((str(cache.root), store_id, key))
    return None if waiting is None else memoryview(waiting[1])


def pending_names(cache: ChunkCache, store_id: str) -> list[str]:
    """The file names of the chunks of ``store_id`` handed to the cache by this process and not written yet."""
    root = str(cache.root)
    with _PENDING_LOCK:
        return [file_name(key) for r, s, key in _pending if r == root and s == store_id]


def wait_for_writes(cache: ChunkCache | None = None, store_id: str = "", key: str = "") -> None:
    """Wait until this process's chunks handed to the cache are written (with ``cache``: that one chunk's): at the
    end of a process (a DataLoader worker ends with ``os._exit``, which waits for no thread), before counting what
    a cache holds, and before a chunk is dropped (its write landing after would bring it back)."""
    with _PENDING_LOCK:
        waiting = list(_pending.values()) if cache is None else [_pending.get((str(cache.root), store_id, key))]
    concurrent.futures.wait([w[0] for w in waiting if w is not None])


def _after_fork() -> None:
    # the parent's threads do not exist in a forked child, nor its writes; its locks may be held by them
    global _PENDING_LOCK
    _PENDING_LOCK = threading.Lock()
    _executors.clear()
    _pending.clear()
    _pending_bytes[0] = 0


os.register_at_fork(after_in_child=_after_fork)


class CachingStore(WrapperStore):
    """A read-through wrapper of a remote store: a whole object's bytes come from the cache when it holds them,
    else from the store, then kept (:func:`write_soon`). Files are read and written in threads of their own
    (:func:`cache_threads`). ``checksummed``: each object ends with a crc32c, checked before it is kept."""

    def __init__(self, store, *, cache: ChunkCache, store_id: str, checksummed: bool = False):
        super().__init__(store)
        self.cache, self.store_id, self.checksummed = cache, store_id, checksummed
        self._listed: np.ndarray | None = None  # the files the cache held at the last listing (None: not listed)

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
        """The chunk's bytes from the cache's file, or from a write not finished yet; ``None``: fetch it."""
        found = self.cache.read(self.store_id, key)
        return found if found is not None else pending(self.cache, self.store_id, key)

    def forget(self, key: str) -> None:
        wait_for_writes(self.cache, self.store_id, key)
        self.cache.drop(self.store_id, key)

    def list_held(self) -> None:
        """List the files the cache holds for this store, once an epoch: a chunk not among them (nor waiting to be
        written) is requested from the store at once, not looked for first in a reading thread, where the look
        waits behind the decodes queued there. A file written after the listing is only fetched once more; one
        deleted after it is looked for, missed and fetched. The chunks this process is still writing count as
        listed, taken before the folder is read: a write that lands in between is in one or the other."""
        waiting = pending_names(self.cache, self.store_id)
        self._listed = self.cache.names(self.store_id, also=waiting)

    def may_hold(self, key: str) -> bool:
        """Whether the cache may hold ``key`` (listed, or waiting to be written): if not, fetch it at once."""
        listed = self._listed
        if listed is None or _listed(listed, file_name(key)):
            return True
        return pending(self.cache, self.store_id, key) is not None

    def keep(self, key: str, data: bytes) -> None:
        """Keep ``data`` as ``key``'s file (:func:`write_soon`), unless its crc32c does not hold: damaged bytes are
        the reader's error to name, never a file that later epochs would start from."""
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
    """The folder of ``arr``'s chunks in a cache: a digest of its store's address, its path, its metadata, its
    group's attributes and ``first_bytes`` (of its first chunk): another store, or this one rewritten, gets
    another folder."""
    described = (arr.metadata.to_dict(), dict(group_attrs))
    text = repr((store_address(arr.store_path.store), arr.path, json.dumps(described, sort_keys=True, default=repr)))
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
    the range read at opening got, so at least its size) with its header: the cache would keep none of its chunks
    (a chunk larger than the limit is not kept), and every epoch would fetch each one again, silently."""
    if cache.limit_bytes is None or first_bytes is None:
        return
    least = _HEADER + len(first_bytes)
    if cache.limit_bytes < least:
        raise ValueError(
            f"cache_limit_bytes={cache.limit_bytes} cannot hold one chunk of array {name!r}: its first one takes at "
            f"least {least:,} bytes in the cache, so no chunk would be kept and every epoch would fetch each one "
            "again. The limit is in bytes (200 * 2**30 is 200 GiB): give room for many chunks, or leave it out"
        )
