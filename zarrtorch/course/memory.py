"""Memory of this process and of the processes it started, read from ``/proc`` (Linux): the one sampler
behind :func:`zarrtorch.course.measure.measure_loader` and ``benchmarks/``.

- RSS (resident set size, ``/proc/<pid>/statm``, about 10 us a read): what ``top`` shows. A forked worker
  shares the pages it inherited from the main process (the imported libraries), so RSS counts them again
  in every worker.
- USS (unique set size: the ``Private_*`` lines of ``/proc/<pid>/smaps_rollup``, 0.3-1 ms a read): the
  memory only that process holds, what it really adds; this is where decoded chunks and buffers live.

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


def uss(pid: int) -> int | None:
    """Private (unique) memory in bytes: what the process would give back if it exited."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    private = (b"Private_Clean:", b"Private_Dirty:", b"Private_Hugetlb:")
    return sum(int(line.split()[1]) * 1024 for line in lines if line.startswith(private))


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
    """

    def __init__(self, every_s: float = 0.01, uss_every_s: float = 0.1, children_every_s: float = 0.05):
        self.pid = os.getpid()
        self.every_s, self.uss_every_s, self.children_every_s = every_s, uss_every_s, children_every_s
        self.rss_main_start = rss(self.pid) or 0
        self.seen: set[int] = set()  # every worker ever sampled
        self._ignore = set(descendants(self.pid))
        self._kids: list[int] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zarrtorch-memory", daemon=True)
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.peak_rss_main = 0
            self.peak_rss_workers = self.peak_uss_workers = 0  # largest sum over the workers alive at once
            self.workers: dict[int, dict] = {}  # pid -> {"rss_peak", "uss_peak"} since the reset

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
            rss_sum = uss_sum = 0
            for pid in self._kids:
                r = rss(pid)
                if r is None:  # exited meanwhile
                    continue
                w = self.workers.setdefault(pid, {"rss_peak": 0, "uss_peak": None})
                self.seen.add(pid)
                w["rss_peak"] = max(w["rss_peak"], r)
                rss_sum += r
                if with_uss or w["uss_peak"] is None:
                    u = uss(pid) or 0
                    w["uss_peak"] = max(w["uss_peak"] or 0, u)
                    uss_sum += u
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
