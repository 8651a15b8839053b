"""Memory of this process and of the processes it started, read from ``/proc`` (Linux): the one sampler
behind :func:`zarrtorch.course.measure.measure_loader` and ``benchmarks/``.

- RSS (resident set size, ``/proc/<pid>/statm``, about 10 us a read): what ``top`` shows. A forked worker
  shares the pages it inherited from the main process (the imported libraries), so RSS counts them again
  in every worker.
- USS (unique set size: the ``Private_*`` lines of ``/proc/<pid>/smaps_rollup``, 0.3-1 ms a read): the
  memory only that process holds, what it really adds; this is where decoded chunks and buffers live.
- What a loader holds, without the pages of library files (code and read-only data of torch, numpy, zarr:
  the OS page cache, shared by every process that maps them, and mapped by a process as its code runs):
  the anonymous and shared-memory part of the resident set (``RssAnon + RssShmem`` of
  ``/proc/<pid>/status``, :func:`anon_rss`) for the main process, and the pages only a worker has written
  (``Private_Dirty``, :func:`private_bytes`) for a forked worker. ``benchmarks/README.md`` shows why.

Not psutil: its ``memory_full_info()`` parses the whole ``/proc/<pid>/smaps``, about 5 ms of CPU a call,
a sizeable share of a core when sampled every few ms during the measurement it disturbs.
"""

from __future__ import annotations

import os
import threading
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss(pid: int) -> int | None:
    """Resident set size in bytes, or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return None


def private_bytes(pid: int) -> tuple[int, int] | None:
    """``(clean, dirty)`` private bytes of a process (``/proc/<pid>/smaps_rollup``), or None if it is gone.
    Clean private pages are nearly all pages of files (libraries) that no other process maps at the moment:
    the OS page cache keeps them when the process exits. Dirty ones (and huge TLB pages) are the memory the
    process wrote and alone holds: its heap, buffers, the pages it copied on write after a fork."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    fields = {b"Private_Clean:": 0, b"Private_Dirty:": 1, b"Private_Hugetlb:": 1}
    out = [0, 0]
    for line in lines:
        key = line.split(maxsplit=1)[0] if line else b""
        if key in fields:
            out[fields[key]] += int(line.split()[1]) * 1024
    return out[0], out[1]


def uss(pid: int) -> int | None:
    """Private (unique) memory in bytes: what the process would give back if it exited."""
    got = private_bytes(pid)
    return None if got is None else sum(got)


def anon_rss(pid: int) -> int | None:
    """Resident anonymous and shared memory in bytes (``RssAnon + RssShmem`` of ``/proc/<pid>/status``): the
    resident set without the pages of mapped files (library code), or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    return sum(int(line.split()[1]) * 1024 for line in lines if line.startswith((b"RssAnon:", b"RssShmem:")))


def descendants(pid: int) -> list[int]:
    """Children, grandchildren... of a process (from ``/proc/<pid>/task/*/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children", "rb") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


class MemorySampler:
    """Peak RSS of this process, peak RSS and USS of each of its descendant processes (the "workers") and
    of their sum at one moment, sampled by a thread while used as a context manager.

    RSS is read every ``every_s``, the list of workers every ``children_every_s`` and USS every
    ``uss_every_s`` (and once for every new worker, so that a short-lived one has a value). Processes that
    existed when the sampler was created (a forkserver, an earlier loader's workers) are not workers.
    :meth:`reset` starts new peaks, e.g. for the next epoch.

    What a loader holds, without library pages (:func:`anon_rss`, :func:`private_bytes`): ``anon_main_start``
    and ``peak_anon_main`` (this process's anonymous + shared resident memory at the start and at its peak,
    read with its RSS) and each worker's ``dirty_peak`` (read with its USS); :attr:`held` combines them.
    """

    def __init__(self, every_s: float = 0.01, uss_every_s: float = 0.1, children_every_s: float = 0.05):
        self.pid = os.getpid()
        self.every_s, self.uss_every_s, self.children_every_s = every_s, uss_every_s, children_every_s
        self.rss_main_start = rss(self.pid) or 0
        self.anon_main_start = anon_rss(self.pid) or 0
        self.seen: set[int] = set()  # every worker ever sampled
        self._ignore = set(descendants(self.pid))
        self._kids: list[int] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zarrtorch-memory", daemon=True)
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.peak_rss_main = self.peak_anon_main = 0
            self.peak_rss_workers = self.peak_uss_workers = 0  # largest sum over the workers alive at once
            self.workers: dict[int, dict] = {}  # pid -> {"rss_peak", "uss_peak", "dirty_peak"} since the reset

    @property
    def held(self) -> int:
        """Bytes a loader held at most since the reset, library pages left out: the growth of this process's
        anonymous + shared resident memory, plus each worker's peak of private dirty memory."""
        grown = max(0, self.peak_anon_main - self.anon_main_start)
        return grown + sum(w["dirty_peak"] or 0 for w in self.workers.values())

    @property
    def peak_rss_per_worker(self) -> int:
        return max((w["rss_peak"] for w in self.workers.values()), default=0)

    @property
    def peak_uss_per_worker(self) -> int:
        return max((w["uss_peak"] or 0 for w in self.workers.values()), default=0)

    def sample(self, children: bool = True, with_uss: bool = True) -> None:
        """One sample now (``children``: look for new workers first; ``with_uss``: read every worker's USS)."""
        if children:
            self._kids = [p for p in descendants(self.pid) if p not in self._ignore]
        with self._lock:
            self.peak_rss_main = max(self.peak_rss_main, rss(self.pid) or 0)
            self.peak_anon_main = max(self.peak_anon_main, anon_rss(self.pid) or 0)
            rss_sum = uss_sum = 0
            for pid in self._kids:
                r = rss(pid)
                if r is None:  # exited meanwhile
                    continue
                w = self.workers.setdefault(pid, {"rss_peak": 0, "uss_peak": None, "dirty_peak": None})
                self.seen.add(pid)
                w["rss_peak"] = max(w["rss_peak"], r)
                rss_sum += r
                if with_uss or w["uss_peak"] is None:
                    clean, dirty = private_bytes(pid) or (0, 0)
                    w["uss_peak"] = max(w["uss_peak"] or 0, clean + dirty)
                    w["dirty_peak"] = max(w["dirty_peak"] or 0, dirty)
                    uss_sum += clean + dirty
            self.peak_rss_workers = max(self.peak_rss_workers, rss_sum)
            if with_uss:
                self.peak_uss_workers = max(self.peak_uss_workers, uss_sum)

    def _run(self) -> None:
        next_kids = next_uss = 0.0
        while not self._stop.wait(self.every_s):
            now = time.monotonic()
            children, with_uss = now >= next_kids, self.uss_every_s > 0 and now >= next_uss
            next_kids = now + self.children_every_s if children else next_kids
            next_uss = now + self.uss_every_s if with_uss else next_uss
            self.sample(children, with_uss)

    def __enter__(self) -> MemorySampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# --------------------------------------------------------------------------------------------------
# Where the memory lives: /proc/<pid>/smaps by kind of mapping
# --------------------------------------------------------------------------------------------------
ARENA_ALIGN = 64 << 20  # glibc's thread arenas are heaps of at most 64 MiB, aligned on their size
SMAPS_FIELDS = ("Rss", "Private_Clean", "Private_Dirty", "Shared_Clean", "Shared_Dirty", "AnonHugePages")


def mapping_kind(name: str) -> str:
    """What an ``smaps`` mapping holds, from its name (:func:`smaps_by_kind` also tells thread arenas apart):

    - ``"file"``: a file mapped by the loader of a library (code, read-only data) or by ``mmap`` of a file:
      pages of the OS page cache, shared with every process mapping them;
    - ``"shmem"``: shared memory (``/dev/shm``, ``memfd:``, ``mmap.mmap(-1, n)``: ``/dev/zero (deleted)``):
      torch's shared tensors (the batch ring), a reading thread's chunk-file buffer;
    - ``"heap"``: the main arena of the C allocator (``[heap]``, grown by ``brk``);
    - ``"anon"``: any other anonymous mapping: blocks the C allocator maps one by one (above its mmap
      threshold: numpy's arrays of decoded chunks, buffers, batches), thread stacks, Python's own arenas;
    - ``"other"``: ``[stack]``, ``[vdso]``, ...
    """
    if name.startswith(("/dev/shm/", "/memfd:", "/dev/zero", "/SYSV")) or name == "[anon_shmem]":
        return "shmem"
    if name.startswith("/"):
        return "file"
    if name == "[heap]":
        return "heap"
    return "anon" if name == "" else "other"


def _smaps_entries(text: str) -> list[dict]:
    """One dict per mapping: ``lo``, ``hi``, ``perms``, ``name`` and the byte counts of :data:`SMAPS_FIELDS`."""
    out: list[dict] = []
    for line in text.splitlines():
        head, _, rest = line.partition(" ")
        if "-" in head and not head.endswith(":"):  # "start-end perms offset dev inode [name]"
            lo, hi = (int(x, 16) for x in head.split("-"))
            parts = rest.split(None, 4)
            out.append({"lo": lo, "hi": hi, "perms": parts[0], "name": parts[4].strip() if len(parts) == 5 else ""})
            out[-1] |= dict.fromkeys(SMAPS_FIELDS, 0)
        elif out and head[:-1] in SMAPS_FIELDS:
            out[-1][head[:-1]] += int(rest.split()[0]) * 1024
    return out


def smaps_by_kind(pid: int) -> dict[str, dict[str, int]] | None:
    """``/proc/<pid>/smaps`` summed by :func:`mapping_kind`, plus ``"arena"``: the C allocator's thread arenas
    (an anonymous read-write mapping at a 64 MiB boundary followed by the rest of its 64 MiB reserved without
    access). For each kind, bytes of ``Rss``, ``Private_Clean``, ``Private_Dirty``, ``Shared_Clean``,
    ``Shared_Dirty``, ``AnonHugePages`` (``None`` if the process is gone). Costs a few ms of CPU (the whole
    smaps file): for a diagnosis, not for sampling every few ms."""
    try:
        with open(f"/proc/{pid}/smaps", "rb") as f:
            entries = _smaps_entries(f.read().decode(errors="replace"))
    except OSError:
        return None
    out = {k: dict.fromkeys(SMAPS_FIELDS, 0) for k in ("file", "shmem", "heap", "arena", "anon", "other")}
    for i, m in enumerate(entries):
        kind = mapping_kind(m["name"])
        nxt = entries[i + 1] if i + 1 < len(entries) else None
        if kind == "anon" and m["lo"] % ARENA_ALIGN == 0 and nxt is not None and nxt["lo"] == m["hi"]:
            if nxt["perms"].startswith("---") and nxt["name"] == "" and nxt["hi"] - m["lo"] == ARENA_ALIGN:
                kind = "arena"
        for k in SMAPS_FIELDS:
            out[kind][k] += m[k]
    return out


def held_by_kind(smaps: dict[str, dict[str, int]]) -> dict[str, int]:
    """Resident bytes of each kind of mapping, file-backed pages as shared or private ("file shared" /
    "file private"): the lines of the benchmark's breakdown."""
    out = {}
    for kind, f in smaps.items():
        if kind == "file":
            out["file shared"] = f["Shared_Clean"] + f["Shared_Dirty"]
            out["file private"] = f["Private_Clean"] + f["Private_Dirty"]
        else:
            out[kind] = f["Rss"]
    return out
