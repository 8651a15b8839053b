"""The CPU and memory limits of this process's control group: a container's, a Kubernetes pod's (a
JupyterHub kernel's), a systemd slice's.

Why: such a CPU limit is a quota of CPU time, not a set of CPUs. A kernel limited to 2 CPUs on a 64-core node
still has 64 CPUs in its affinity mask; threads sized for 64 are throttled to 2 CPUs' worth of time, and the
reads they keep in flight hold memory a 2-CPU share never needed. And a container's memory limit is where
the kernel kills it, whatever the node has.

Where they are read: ``/proc/self/cgroup`` names this process's cgroup in each hierarchy, ``/proc/self/mountinfo``
where each hierarchy is mounted (without it, under ``/sys/fs/cgroup``). In cgroup v2 the limits are
``cpu.max`` ("QUOTA PERIOD" or "max PERIOD") and ``memory.max`` (bytes or "max"); in v1 the cpu controller's
``cpu.cfs_quota_us`` (-1: none) over ``cpu.cfs_period_us`` and the memory controller's
``memory.limit_in_bytes``. A parent's limit applies to its children, so the files are read from this process's
cgroup up to the top of the mounted hierarchy and the tightest counts. Whatever is missing or unreadable
(not Linux, garbage, a path that climbs out of its mount) is no limit, never an error.

The answer is read once per process and per root (a few small files): a forked child inherits it, and it stays
right there because a fork stays in its parent's cgroup. A limit changed while the process runs (Kubernetes'
in-place resize) is seen by the next process.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import PurePosixPath

CGROUP_ROOT = "/"  # the directory holding proc/ and sys/: tests point it at a fixture tree
UNLIMITED_BYTES = 2**60  # v1 writes "no limit" as a page-rounded 2**63 - 1: a memory limit this large is none


def cgroup_cpu_limit(root: str | os.PathLike | None = None) -> int | None:
    """Whole CPUs this process's cgroup quota allows, a started CPU counting as one (1.5 CPUs: 2), at least 1;
    ``None`` without a quota. ``root``: where ``/`` is (default :data:`CGROUP_ROOT`)."""
    return _limits(_root(root))[0]


def cgroup_memory_limit(root: str | os.PathLike | None = None) -> int | None:
    """Bytes this process's cgroup may hold before the kernel kills it; ``None`` without a limit."""
    return _limits(_root(root))[1]


def _root(root) -> str:
    return os.fspath(CGROUP_ROOT if root is None else root)


@functools.cache
def _limits(root: str) -> tuple[int | None, int | None]:
    """(CPUs, bytes) of the cgroup this process is in, as seen under ``root``; read once per process."""
    cpus = _tightest([_cpu_quota(d) for d in _directories(root, "cpu")])
    memory = _tightest([_memory_max(d) for d in _directories(root, "memory")])
    return (None if cpus is None else max(1, cpus)), memory


def _tightest(values: list) -> int | None:
    found = [v for v in values if v is not None]
    return min(found) if found else None


@dataclass(frozen=True)
class _Mount:
    version: int  # 1 or 2
    controllers: frozenset  # v1: what this hierarchy controls (cpu, cpuacct, memory, ...)
    root: str  # the cgroup shown at the mount point: "/", or in a container its own cgroup
    point: str  # where it is mounted, under the root of the file tree


def _directories(root: str, controller: str) -> list[str]:
    """The directories whose files limit ``controller`` for this process, its own cgroup first, then each
    parent up to the mount point."""
    out = []
    mounts = _mounts(root)
    for version, controllers, path in _memberships(root):
        for mount in mounts:
            if mount.version != version or (version == 1 and controller not in (controllers & mount.controllers)):
                continue
            inside = _inside(path, mount.root)
            for depth in range(len(inside), -1, -1):
                out.append(os.path.join(root, mount.point.lstrip("/"), *inside[:depth]))
    return out


def _inside(path: str, mount_root: str) -> tuple[str, ...]:
    """The parts of cgroup ``path`` below the mount's root: () where the path is not under it (a container's
    mount shows its own cgroup, whose path outside is not repeated inside) or climbs out of it (``..``)."""
    parts, base = PurePosixPath(path).parts[1:], PurePosixPath(mount_root).parts[1:]
    if ".." in parts or tuple(parts[: len(base)]) != tuple(base):
        return ()
    return tuple(parts[len(base) :])


def _memberships(root: str) -> list[tuple[int, frozenset, str]]:
    """(cgroup version, controllers, path) of each line of ``/proc/self/cgroup`` ("ID:CONTROLLERS:PATH"; v2's
    is "0::PATH")."""
    out = []
    for line in _read(os.path.join(root, "proc/self/cgroup")).splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3 or not fields[2].startswith("/"):
            continue
        hierarchy, controllers, path = fields
        if hierarchy == "0" and not controllers:
            out.append((2, frozenset(), path))
        elif controllers:
            out.append((1, frozenset(controllers.split(",")), path))
    return out


def _mounts(root: str) -> list[_Mount]:
    """The cgroup hierarchies ``/proc/self/mountinfo`` lists; without any, the usual places: v2 at
    ``/sys/fs/cgroup``, each v1 controller at ``/sys/fs/cgroup/<controllers>``."""
    out = []
    for line in _read(os.path.join(root, "proc/self/mountinfo")).splitlines():
        before, sep, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or not fields[4].startswith("/"):
            continue
        mount_root, point = _unescape(fields[3]), _unescape(fields[4])
        if tail[0] == "cgroup2":
            out.append(_Mount(2, frozenset(), mount_root, point))
        elif tail[0] == "cgroup":
            out.append(_Mount(1, frozenset(tail[2].split(",")), mount_root, point))
    if out:
        return out
    fallback = [_Mount(2, frozenset(), "/", "/sys/fs/cgroup")]
    for version, controllers, _ in _memberships(root):
        if version == 1:  # mounted at its controllers' joined name, or each at its own (a link, usually)
            for name in {",".join(sorted(controllers)), *controllers}:
                fallback.append(_Mount(1, controllers, "/", f"/sys/fs/cgroup/{name}"))
    return fallback


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline or backslash in a path as an octal escape (``\\040``)."""
    for escape, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escape, char)
    return field


def _cpu_quota(directory: str) -> int | None:
    """Whole CPUs (rounded up) the quota files of one cgroup directory allow; None: none, or not readable."""
    fields = _read(os.path.join(directory, "cpu.max")).split()
    if len(fields) == 2:  # v2
        quota, period = _positive(fields[0]), _positive(fields[1])
    else:  # v1
        quota = _positive(_read(os.path.join(directory, "cpu.cfs_quota_us")).strip())
        period = _positive(_read(os.path.join(directory, "cpu.cfs_period_us")).strip())
    if quota is None or period is None:
        return None
    return -(-quota // period)


def _memory_max(directory: str) -> int | None:
    """The memory limit of one cgroup directory in bytes; None: none ("max", a huge number) or not readable."""
    text = _read(os.path.join(directory, "memory.max")) or _read(os.path.join(directory, "memory.limit_in_bytes"))
    limit = _positive(text.strip())
    return limit if limit is not None and limit < UNLIMITED_BYTES else None


def _positive(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) > 0 else None


def _read(path: str) -> str:
    """A small file's text, or "" if it cannot be read (missing, not text, not a file)."""
    try:
        with open(path, encoding="ascii") as f:
            return f.read(65536)
    except (OSError, ValueError):  # ValueError: UnicodeDecodeError
        return ""
