"""Start an epoch cold without root: drop a store's files from the OS page cache, and say how much of them is
still resident (issue 43, item 6).

``drop_from_cache(store)`` asks the kernel to forget every file under the store
(``posix_fadvise(POSIX_FADV_DONTNEED)``, after an ``fsync`` so that freshly written pages are clean and can
go); ``load_into_cache(store)`` reads them all once (a warm start); ``resident_fraction(store)`` counts the
files' pages that are in memory (``mmap`` + ``mincore``), so that a table can show that its cold epoch really
started from the disk. Nothing here needs root, and nothing touches other processes' files
(``/proc/sys/vm/drop_caches`` would drop every cache on the machine).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import time
from pathlib import Path

import numpy as np

PAGE = mmap.PAGESIZE


def store_files(path: str | os.PathLike) -> list[Path]:
    """Every regular file of a store (a directory) or the file itself."""
    path = Path(path)
    return [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file())


def drop_from_cache(path: str | os.PathLike) -> int:
    """Evict every file under ``path`` from the page cache; returns the bytes asked to go. Dirty pages cannot be
    dropped, hence the ``fsync`` first."""
    if not hasattr(os, "posix_fadvise"):
        raise OSError("this platform has no posix_fadvise (Linux has): --cold cannot drop the store from the cache")
    total = 0
    for f in store_files(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def load_into_cache(path: str | os.PathLike) -> int:
    """Read every file under ``path`` once, so that the next pass finds it in the page cache; returns the bytes."""
    total = 0
    for f in store_files(path):
        with open(f, "rb", buffering=0) as fh:
            while block := fh.read(16 * 2**20):
                total += len(block)
    return total


def _mincore():
    """libc's ``mincore``, or None where the platform has none (then residency cannot be measured)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fn = getattr(libc, "mincore", None)
    if fn is not None:
        fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))
        fn.restype = ctypes.c_int
    return fn


MINCORE = _mincore()


def resident_pages(path: Path) -> tuple[int, int]:
    """(pages in the page cache, pages) of one file. Mapping it reads nothing: ``mincore`` only looks."""
    size = path.stat().st_size
    if size == 0:
        return 0, 0
    pages = -(-size // PAGE)
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
        view = np.frombuffer(m, np.uint8)  # ctypes cannot take the address of a read-only map; numpy can
        failed = MINCORE(view.ctypes.data, size, vec) != 0
        del view  # before the map closes: it refuses to while a buffer of it is alive
    if failed:
        raise OSError(ctypes.get_errno(), f"mincore failed on {path}")
    return int((np.frombuffer(vec, np.uint8) & 1).sum()), pages


def resident_fraction(path: str | os.PathLike) -> float:
    """Share of the pages of every file under ``path`` that are in the page cache (0: the next read goes to
    the disk; 1: it is a copy from memory). Raises ``OSError`` where the platform has no ``mincore``."""
    if MINCORE is None:
        raise OSError("this platform's libc has no mincore: the page cache's contents cannot be measured")
    held = total = 0
    for f in store_files(path):
        h, t = resident_pages(f)
        held, total = held + h, total + t
    return held / total if total else 0.0


def prepare_pass(path: str | os.PathLike, cold: bool) -> float:
    """Make the store's files cold (dropped from the page cache) or warm (read once) for the next timed pass;
    returns the share of their pages resident just after, for the table to report (NaN where the platform
    cannot tell: no ``mincore``)."""
    if not cold:
        load_into_cache(path)
        return resident_fraction(path) if MINCORE is not None else float("nan")
    drop_from_cache(path)
    if MINCORE is None:
        return float("nan")
    # a page still mapped or read by a process of the pass before (a worker exiting, another loader's persistent
    # workers reading their next epoch's first pieces early) is not dropped, or comes back: try again, for up to
    # 5 s (a loaded 2-core machine took more than the 1 s this waited before)
    for _ in range(25):
        share = resident_fraction(path)
        if share < 0.05:
            break
        time.sleep(0.2)
        drop_from_cache(path)
    share = resident_fraction(path)
    if share >= 0.05:  # named, for the run's JSON: chunks, or the metadata documents a loader reads each epoch
        STILL_RESIDENT.append(sorted(str(f.relative_to(path)) for f in store_files(path) if resident_pages(f)[0]))
    return share


STILL_RESIDENT: list[list[str]] = []  # per cold pass that found pages it could not drop: the files holding them
