"""Rehearse the workshop day on a JupyterHub, on one Linux machine.

Several kernels run at once, each in cgroups that limit it as a hub limits a user (a memory limit, a CPU
quota), all reading ONE shared copy of the data, each writing only to a scratch folder of its own
(``ZARRTORCH_SCRATCH_DIR``; ``TMPDIR`` too) and executing its own copy of the notebooks, as each attendee has
their own clone. Kernel k starts at lesson k mod (number of lessons) and goes round, as attendees drift apart.

    sudo python scripts/hub_rehearsal.py --kernels 6 --memory-gib 2 --cpus 1

Reports per kernel and lesson: the wall time, the cgroup's peak memory as the kernel counts it against the
limit (``memory.max_usage_in_bytes``, page cache included), the peak of what cannot be reclaimed (anonymous
and shared memory, sampled, with the cell and the processes at that moment), how often the limit was reached,
whether the OOM killer fired, the CPU time and throttling, and failures. Checks that every kernel sees the
CPUs of its quota (``zarrtorch.available_cpus()``) and that no file of the shared data changed; the shared
data is also bind-mounted read-only for the run where the machine allows it, so a write fails as it does on a
hub. Needs root and cgroup v1's memory and cpu controllers; refuses, saying what is missing and the fix,
otherwise. The cgroups (and the mount) are removed at the end, after an error or Ctrl-C too.

The measured results and the per-user budget they support: docs/hub.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA_LESSONS = ("01", "02", "03", "04", "05", "06", "07")  # the day's lessons that read the course's data
SIZES = ("tiny", "small", "workshop")
GIB = 2**30
MAX_KERNELS = 64
NEEDED = (("memory", "memory.limit_in_bytes"), ("cpu", "cpu.cfs_quota_us"))  # v1 controller, a file it creates
CHILD_FLAG = "--kernel-child"
USAGE = "sudo python scripts/hub_rehearsal.py --kernels 6 --memory-gib 2 --cpus 1"

# What a kernel sees from inside its cgroups, printed as one JSON line by the first cell a kernel runs.
PROBE_CODE = """\
import json, os
import torch, zarrtorch
from zarrtorch._util.cgroup import cgroup_memory_limit
print(json.dumps({"available_cpus": zarrtorch.available_cpus(), "cpu_count": os.cpu_count(),
                  "affinity": len(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
                  "memory_limit": cgroup_memory_limit()}))
"""


# ---------------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    kernels: int
    memory_bytes: int
    cpus: float
    lessons: tuple[str, ...]  # notebook file names, in the order of the day
    per_kernel: int  # how many of them each kernel runs, from its own starting lesson
    size: str
    data_root: Path  # the folder holding <size>/ (ZARRTORCH_DATA_DIR's meaning)
    cgroup_root: Path
    work_dir: Path | None  # where the run's folder is made (default: the system's temporary folder)
    read_only_mount: bool
    cell_timeout: int
    sample_s: float
    json_out: Path | None
    md_out: Path | None
    keep: bool


def parse_settings(argv: list[str] | None, notebooks: Path = ROOT / "notebooks", cpu_count: int | None = None):
    """The run's settings from the command line, each checked; a wrong one exits (status 2) naming it."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=f"e.g. {USAGE}")
    p.add_argument("--kernels", type=int, default=6, help="kernels running at once (default 6)")
    p.add_argument("--memory-gib", type=float, default=2.0, help="memory limit per kernel in GiB (default 2)")
    p.add_argument("--cpus", type=float, default=1.0, help="CPU quota per kernel, in CPUs (default 1)")
    p.add_argument("--lessons", nargs="+", default=list(DATA_LESSONS), help="notebook numbers (default 01 .. 07)")
    p.add_argument(
        "--per-kernel",
        type=int,
        help="lessons each kernel runs, from lesson k mod n on (default: all; fewer shortens the run while the "
        "kernels together still cover every lesson when kernels x per-kernel >= lessons)",
    )
    p.add_argument("--size", default=os.environ.get("ZARRTORCH_SIZE", "small"), help="tiny | small | workshop")
    p.add_argument("--data-dir", type=Path, help="the shared data folder (default $ZARRTORCH_DATA_DIR or data/)")
    p.add_argument("--cgroup-root", type=Path, default=Path("/sys/fs/cgroup"), help="where cgroup v1 is mounted")
    p.add_argument("--work-dir", type=Path, help="where the run's scratch folders go (default: the temp folder)")
    p.add_argument("--no-read-only-mount", action="store_true", help="do not bind-mount the data read-only")
    p.add_argument("--cell-timeout", type=int, default=1800, help="seconds allowed per cell (default 1800)")
    p.add_argument("--sample-s", type=float, default=0.5, help="seconds between memory samples (default 0.5)")
    p.add_argument("--json", type=Path, help="also write every measurement to this JSON file")
    p.add_argument("--md", type=Path, help="also write the report (Markdown) to this file")
    p.add_argument("--keep", action="store_true", help="keep the run's folder (executed notebooks, logs)")
    a = p.parse_args(argv)
    cpu_count = cpu_count or os.cpu_count() or 1
    if not 1 <= a.kernels <= MAX_KERNELS:
        p.error(f"--kernels {a.kernels}: give between 1 and {MAX_KERNELS} kernels")
    if not a.memory_gib > 0:
        p.error(f"--memory-gib {a.memory_gib}: a memory limit must be positive (a hub's common limit is 2)")
    if not 0.01 <= a.cpus <= cpu_count:
        p.error(
            f"--cpus {a.cpus}: give a quota between 0.01 and this machine's {cpu_count} CPUs (a larger quota "
            "limits nothing; a hub's common limit is 1)"
        )
    if a.size not in SIZES:
        p.error(f"--size {a.size!r}: choose one of {', '.join(SIZES)}")
    if a.cell_timeout <= 0 or a.sample_s <= 0:
        p.error("--cell-timeout and --sample-s must be positive")
    try:
        lessons = lesson_notebooks(a.lessons, notebooks)
    except ValueError as exc:
        p.error(str(exc))
    per_kernel = len(lessons) if a.per_kernel is None else a.per_kernel
    if not 1 <= per_kernel <= len(lessons):
        p.error(f"--per-kernel {a.per_kernel}: give between 1 and the {len(lessons)} lessons named")
    if a.kernels * per_kernel < len(lessons):
        p.error(
            f"--per-kernel {per_kernel}: {a.kernels} kernels x {per_kernel} lessons leave some of the "
            f"{len(lessons)} lessons unrun; give at least {math.ceil(len(lessons) / a.kernels)}"
        )
    data_root = a.data_dir or Path(os.environ.get("ZARRTORCH_DATA_DIR") or ROOT / "data")
    return Settings(
        kernels=a.kernels,
        memory_bytes=int(a.memory_gib * GIB),
        cpus=a.cpus,
        lessons=lessons,
        per_kernel=per_kernel,
        size=a.size,
        data_root=data_root.expanduser(),
        cgroup_root=a.cgroup_root,
        work_dir=a.work_dir,
        read_only_mount=not a.no_read_only_mount,
        cell_timeout=a.cell_timeout,
        sample_s=a.sample_s,
        json_out=a.json,
        md_out=a.md,
        keep=a.keep,
    )


def lesson_notebooks(numbers: list[str], notebooks: Path) -> tuple[str, ...]:
    """The notebook file name of each lesson number ("04" -> "04_streaming.ipynb"), each named once."""
    names = []
    for number in numbers:
        found = sorted(p.name for p in notebooks.glob(f"{number}_*.ipynb"))
        if len(found) != 1:
            known = sorted({p.name.split("_")[0] for p in notebooks.glob("*_*.ipynb")})
            raise ValueError(f"--lessons {number}: no single notebook numbered so; choose among {', '.join(known)}")
        if found[0] in names:
            raise ValueError(f"--lessons {number}: named twice")
        names.append(found[0])
    return tuple(names)


def lesson_order(lessons: tuple[str, ...], kernel: int, per_kernel: int | None = None) -> list[str]:
    """Kernel k's lessons: from lesson k mod n on, going round, as attendees drift apart; the first
    ``per_kernel`` of them (all by default)."""
    start = kernel % len(lessons)
    return list(lessons[start:] + lessons[:start])[: per_kernel or len(lessons)]


# ----------------------------------------------------------------------------------------------------- cgroups


def cgroup_problem(root: Path, euid: int) -> str | None:
    """Why cgroups for the kernels cannot be made under ``root`` (a sentence with the fix), or None if they can.
    Tries for real: creates and removes one empty cgroup in each controller it needs."""
    if euid != 0:
        return (
            "it needs root: creating a cgroup and moving a process into it is root's. Run it with sudo, in the "
            f"course's environment: sudo env PATH=$PATH {USAGE.removeprefix('sudo ')}"
        )
    if not root.is_dir():
        return f"there is no cgroup file system at {root} (Linux mounts it at /sys/fs/cgroup; --cgroup-root moves it)"
    present = {name: (root / name / file).exists() for name, file in NEEDED}
    if not any(present.values()) and (root / "cgroup.controllers").exists():
        return (
            f"{root} holds cgroup v2 only (the unified hierarchy), and this script drives cgroup v1's memory and "
            "cpu controllers. Run it where v1 is mounted (a machine booted with "
            "systemd.unified_cgroup_hierarchy=0, or a container with v1), or limit each kernel by hand on v2: "
            "systemd-run --scope -p MemoryMax=2G -p CPUQuota=100% jupyter execute notebooks/04_streaming.ipynb"
        )
    missing = [name for name, ok in present.items() if not ok]
    if missing:
        return (
            f"the cgroup v1 controller(s) {', '.join(missing)} are not mounted under {root}: mount them, e.g. "
            + "; ".join(f"mkdir -p {root / m} && mount -t cgroup -o {m} cgroup {root / m}" for m in missing)
        )
    for name, file in NEEDED:
        probe = parent_group(root, name) / f"zarrtorch-hub-probe-{os.getpid()}"
        try:
            os.mkdir(probe)
        except OSError as exc:
            return (
                f"it cannot create a cgroup under {probe.parent} ({exc.strerror}): the cgroup file system is "
                "read-only here, as in a container started without privileges. Run it on the host, or in a "
                "container started with --privileged (docker, podman) or with CAP_SYS_ADMIN and a writable "
                "/sys/fs/cgroup"
            )
        try:
            real = (probe / file).exists()
        finally:
            os.rmdir(probe)
        if not real:
            return (
                f"{root / name} is not a cgroup file system: a new directory there gets no {file}. Point "
                "--cgroup-root at where cgroup v1 is mounted (usually /sys/fs/cgroup)"
            )
    return None


def parent_group(root: Path, controller: str) -> Path:
    """Where this process's own cgroup of ``controller`` lies under ``root`` (the kernels' groups go under it,
    so whatever limits this process limits them too), or the hierarchy's top if it is not found there."""
    top = root / controller
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controller in controllers.split(","):
                own = top / path.lstrip("/")
                return own if own.is_dir() else top
    return top


def write(path: Path, value) -> None:
    path.write_text(f"{value}\n")


def read_int(path: Path | None, default: int = 0) -> int:
    try:
        return int(path.read_text().split()[0]) if path is not None else default
    except (OSError, ValueError, IndexError):
        return default


def read_keys(path: Path) -> dict[str, int]:
    """A cgroup file of "key value" lines (memory.stat, memory.oom_control, cpu.stat) as a dict."""
    out = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                out[key] = int(value)
    return out


@dataclass(frozen=True)
class KernelGroup:
    """One kernel's cgroups: memory (the limit), cpu (the quota) and, where mounted apart, cpuacct."""

    memory: Path
    cpu: Path
    cpuacct: Path | None  # where cpuacct.usage is: the cpu group itself when the two are mounted together

    def directories(self) -> list[Path]:
        return list(dict.fromkeys(d for d in (self.memory, self.cpu, self.cpuacct) if d is not None))

    def counters(self) -> dict[str, int]:
        """The running totals a lesson's share is the difference of."""
        oom = read_keys(self.memory / "memory.oom_control")
        cpu = read_keys(self.cpu / "cpu.stat")
        return {
            "failcnt": read_int(self.memory / "memory.failcnt"),
            "oom_kill": oom.get("oom_kill", 0),
            "throttled_ns": cpu.get("throttled_time", 0),
            "cpu_ns": read_int(self.cpuacct / "cpuacct.usage" if self.cpuacct else None),
        }


class Cgroups:
    """The run's cgroups: one group per kernel in each controller, under a group of the run's own; created on
    entry with their limits, and removed on exit (whatever still runs inside is killed first)."""

    def __init__(self, root: Path, name: str, kernels: int, memory_bytes: int, cpus: float, ledger: Ledger):
        self.root, self.name, self.kernels, self.memory_bytes, self.cpus = root, name, kernels, memory_bytes, cpus
        self.ledger = ledger
        self.created: list[Path] = []  # in creation order; removed in reverse
        self.groups: list[KernelGroup] = []

    def _make(self, path: Path) -> Path:
        self.ledger.note(groups=[*self.created, path])  # noted before made: a SIGKILL between leaves no orphan
        path.mkdir()
        self.created.append(path)
        return path

    def __enter__(self) -> Cgroups:
        try:
            tops = {c: self._make(parent_group(self.root, c) / self.name) for c in ("memory", "cpu")}
            together = (self.root / "cpu" / "cpuacct.usage").exists()
            apart = not together and (self.root / "cpuacct" / "cpuacct.usage").exists()
            if apart:
                tops["cpuacct"] = self._make(parent_group(self.root, "cpuacct") / self.name)
            for k in range(self.kernels):
                memory, cpu = self._make(tops["memory"] / f"kernel-{k}"), self._make(tops["cpu"] / f"kernel-{k}")
                acct = self._make(tops["cpuacct"] / f"kernel-{k}") if apart else (cpu if together else None)
                write(memory / "memory.limit_in_bytes", self.memory_bytes)
                if (memory / "memory.memsw.limit_in_bytes").exists():  # swap may not stretch the limit (hubs have none)
                    write(memory / "memory.memsw.limit_in_bytes", self.memory_bytes)
                period = read_int(cpu / "cpu.cfs_period_us", 100_000)
                write(cpu / "cpu.cfs_quota_us", max(1000, round(self.cpus * period)))
                self.groups.append(KernelGroup(memory, cpu, acct))
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def remove(self) -> None:
        """Kill what runs in the run's groups (only processes this run started live there), then remove them."""
        remove_groups(self.created)
        self.created.clear()
        self.ledger.note(groups=[])


def remove_groups(groups: list[Path]) -> None:
    """Kill every process in ``groups`` (they were made for one run, so only its processes live there), then
    remove the groups, innermost first (they are given in creation order)."""
    for group in reversed(groups):
        for _ in range(100):
            pids = [int(p) for p in read_text(group / "cgroup.procs").split()]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        try:
            group.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            print(f"[hub] could not remove cgroup {group} ({exc.strerror}): rmdir it by hand", file=sys.stderr)


LEDGER_DIR = Path("/run/zarrtorch-hub")  # a tmpfs, emptied at boot as cgroups and mounts are


class Ledger:
    """What a run has made that outlives it if it is killed outright (SIGKILL, a lost session): its cgroups and
    its mount, noted in a file named after the run with the run's pid, before each is made. The next run
    removes what a dead run left (``sweep_leftovers``); a run that ends normally removes its file."""

    def __init__(self, name: str, folder: Path = LEDGER_DIR):
        self.path = folder / f"{name}.json"
        self.record = {"pid": os.getpid(), "started": process_start(os.getpid()), "groups": [], "mount": None}

    def note(self, **changes) -> None:
        self.record.update({k: [str(p) for p in v] if isinstance(v, list) else v for k, v in changes.items()})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.record))
        tmp.replace(self.path)

    def close(self) -> None:
        """The run removed everything it made: forget it."""
        self.path.unlink(missing_ok=True)


def process_start(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (/proc/<pid>/stat field 22): with the pid, names one
    process across pid reuse; None once it is gone."""
    stat = read_text(Path(f"/proc/{pid}/stat"))
    return int(stat.rsplit(")", 1)[1].split()[19]) if stat else None


def sweep_leftovers(folder: Path = LEDGER_DIR) -> list[str]:
    """Remove the cgroups and the mount of every earlier run whose process is gone; what was removed."""
    removed = []
    for path in sorted(folder.glob("zarrtorch-hub-*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if record.get("started") is not None and process_start(record["pid"]) == record["started"]:
            continue  # that run is still going
        if record.get("mount"):
            unmount(Path(record["mount"]))
        remove_groups([Path(g) for g in record.get("groups", [])])
        removed += [p for p in [record.get("mount"), *record.get("groups", [])] if p]
        path.unlink(missing_ok=True)
    return removed


def read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


# ------------------------------------------------------------------------------------------------- shared data


def data_problem(folder: Path) -> str | None:
    """Why ``folder`` is not a complete generated dataset that lessons can only read, or None."""
    marker = course_module("synthetic").MARKER  # era5_like's marker has the same name (its module imports torch)
    needed = (marker, "archive.zarr", "train.zarr", f"era5_like/{marker}")
    missing = [name for name in needed if not (folder / name).exists()]
    if missing:
        return (
            f"the shared data at {folder} is not complete (no {', '.join(missing)}): generate it once, as the "
            f"instructor does, with `ZARRTORCH_DATA_DIR={folder.parent} python -m zarrtorch make-data --size "
            f"{folder.name}` (the rehearsal itself never writes the shared data)"
        )
    return None


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``folder``: its relative path -> (size, modification time in ns). The
    top-level ``scratch`` folder is left out: it is where a lesson writes on a single-user machine (the kernels
    here write to their own, ``ZARRTORCH_SCRATCH_DIR``), not the data the kernels share."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        if os.path.samefile(dirpath, folder) and "scratch" in dirnames:
            dirnames.remove("scratch")
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            out[os.path.relpath(path, folder)] = (st.st_size, st.st_mtime_ns)
    return out


def changes(before: dict, after: dict) -> list[str]:
    """What differs between two snapshots: added, removed or modified paths."""
    added = [f"added {p}" for p in sorted(after.keys() - before.keys())]
    removed = [f"removed {p}" for p in sorted(before.keys() - after.keys())]
    modified = [f"modified {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    return added + removed + modified


@contextlib.contextmanager
def shared_data(source: Path, root: Path, read_only: bool, ledger: Ledger):
    """A data root whose ``<size>`` folder is ``source``: bind-mounted read-only where allowed (a write then
    fails as on a hub), else a link to it. Yields (the data root, how it is shared); unmounts on exit."""
    target = root / source.name
    root.mkdir(parents=True)
    how = "a link to the shared folder (--no-read-only-mount): written files would be found by the comparison"
    if read_only:
        target.mkdir()
        ledger.note(mount=str(target))
        try:
            mounted = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True, text=True)
            sealed = mounted.returncode == 0 and (
                subprocess.run(["mount", "-o", "remount,ro,bind", str(target)], capture_output=True).returncode == 0
            )
            if sealed:
                yield root, "bind-mounted read-only (a write fails with EROFS)"
                return
        finally:  # whatever ends the run, an interrupt between the two mount commands included
            unmount(target)
            ledger.note(mount=None)
        target.rmdir()
        how = f"a link to the shared folder (a read-only bind mount failed: {mounted.stderr.strip() or 'remount'})"
    target.symlink_to(source, target_is_directory=True)
    yield root, how


def is_mount_point(path: Path) -> bool:
    """Whether ``path`` is a mount point, from /proc/self/mountinfo: ``os.path.ismount`` misses a bind mount of a
    folder of the same file system (same device, a different inode from its parent's)."""
    wanted = os.path.realpath(path)
    for line in read_text(Path("/proc/self/mountinfo")).splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4].encode().decode("unicode_escape") == wanted:
            return True
    return False


def unmount(target: Path) -> None:
    if not is_mount_point(target):
        return
    for _ in range(20):
        if subprocess.run(["umount", str(target)], capture_output=True).returncode == 0:
            return
        time.sleep(0.5)
    subprocess.run(["umount", "-l", str(target)], capture_output=True)  # busy still: detach it now, free later


# ------------------------------------------------------------------------------------------------ kernel child


def kernel_child(spec_path: str) -> int:
    """One attendee: join the kernel's cgroups (the kernels and their workers, started after, inherit them),
    ask a kernel what it sees, then run the lessons in order, one fresh kernel each, recording each."""
    spec = json.loads(Path(spec_path).read_text())
    for procs in spec["procs"]:
        write(Path(procs), os.getpid())
    os.environ.update(spec["env"])
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    run_notebook = course_module("lessons").run_notebook

    group = KernelGroup(**{k: Path(v) if v else None for k, v in spec["group"].items()})
    home = Path(spec["home"])
    with open(spec["events"], "a", buffering=1) as log:

        def emit(**record) -> None:
            log.write(json.dumps({"t": time.time(), **record}) + "\n")

        probe = new_notebook(cells=[new_code_cell(PROBE_CODE)])
        try:
            run_notebook(probe, home / "notebooks" / "probe.ipynb", timeout=spec["timeout"])
            printed = [o["text"] for o in probe.cells[0].outputs if o.get("name") == "stdout"]
            emit(event="probe", **json.loads(printed[-1].strip().splitlines()[-1]))
        except Exception as exc:
            emit(event="probe", error=f"{type(exc).__name__}: {exc}"[:500])
        for name in spec["lessons"]:
            path = home / "notebooks" / name
            nb = nbformat.read(path, as_version=4)
            before = group.counters()
            write(group.memory / "memory.max_usage_in_bytes", 0)  # the peak from here on
            emit(event="lesson-start", lesson=name, counters=before)
            start = time.time()
            try:
                run_notebook(nb, path, timeout=spec["timeout"])
                status = "ok"
            except Exception as exc:  # record it and go on, as an attendee restarts and moves on
                status = failure(exc)
            end = time.time()
            after = group.counters()
            nbformat.write(nb, home / "executed" / name)
            emit(
                event="lesson",
                lesson=name,
                start=start,
                end=end,
                status=status,
                peak_bytes=read_int(group.memory / "memory.max_usage_in_bytes"),
                deltas={k: after[k] - before[k] for k in after},
                cells=cell_times(nb),
            )
    return 0


def course_module(name: str):
    """A module of zarrtorch/course/ (one that imports no other part of the package) loaded without the
    package's ``__init__``, which imports torch: this script and the clients stand for a hub's Jupyter server,
    whose memory counts in the user's limit and which holds no torch."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"course_{name}", ROOT / "zarrtorch" / "course" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def failure(exc: BaseException) -> str:
    """One line for a failed lesson: the exception's type and its last line (a cell's error, a dead kernel)."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1][:300] if lines else ''}"


def cell_times(nb) -> list[tuple[int, float, float | None]]:
    """(cell index, start, end) of each code cell that ran, from the timing nbclient records; end None for a
    cell that never replied (its kernel died)."""
    out = []
    for index, cell in enumerate(nb.cells):
        timing = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in timing:
            end = timing.get("shell.execute_reply")
            out.append((index, stamp(timing["iopub.execute_input"]), stamp(end) if end else None))
    return out


def stamp(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


# ----------------------------------------------------------------------------------------------------- sampler


@dataclass(frozen=True)
class Sample:
    t: float
    usage: int  # memory.usage_in_bytes: what the limit is compared with, page cache included
    anon: int  # rss + shmem of memory.stat: what cannot be reclaimed without swap
    processes: tuple[tuple[str, int], ...]  # (role, anonymous + shared resident bytes) of each process


class Sampler(threading.Thread):
    """Samples every kernel's cgroup memory and its processes, and the machine's load, until stopped."""

    def __init__(self, groups: list[KernelGroup], drivers: list[int], every_s: float):
        super().__init__(daemon=True)
        self.groups, self.drivers, self.every_s = groups, drivers, every_s
        self.samples: list[list[Sample]] = [[] for _ in groups]
        self.load: list[float] = []
        self.halt = threading.Event()
        self._names: dict[int, str] = {}

    def run(self) -> None:
        last_load = 0.0
        while not self.halt.is_set():
            t = time.time()
            for k, group in enumerate(self.groups):
                self.samples[k].append(self.sample(group, self.drivers[k], t))
            if t - last_load >= 5:
                self.load.append(os.getloadavg()[0])
                last_load = t
            self.halt.wait(self.every_s)

    def sample(self, group: KernelGroup, driver: int, t: float) -> Sample:
        stat = read_keys(group.memory / "memory.stat")
        pids = [int(p) for p in read_text(group.memory / "cgroup.procs").split()]
        info = {pid: process_info(pid) for pid in pids}
        kernels = {pid for pid, (ppid, _) in info.items() if ppid == driver}
        processes = tuple(
            (self.role(pid, ppid, driver, kernels), rss) for pid, (ppid, rss) in info.items() if ppid is not None
        )
        anon = stat.get("rss", 0) + stat.get("shmem", 0)
        return Sample(t, read_int(group.memory / "memory.usage_in_bytes"), anon, processes)

    def role(self, pid: int, ppid: int, driver: int, kernels: set[int]) -> str:
        if pid == driver:
            return "client"  # nbclient and jupyter_client: what a hub's single-user server is
        if pid in kernels:
            return "kernel"
        if pid not in self._names:
            self._names[pid] = process_role(read_text(Path(f"/proc/{pid}/cmdline")).split("\0"))
        return self._names[pid]


def process_role(argv: list[str]) -> str:
    """What a process in a kernel's cgroup is, from its command line: a DataLoader worker (forked from the
    kernel, it keeps the kernel's command line; spawned, it runs multiprocessing's), a torchrun launcher, a
    training rank, or the module it runs."""
    line = " ".join(argv)
    if "ipykernel" in line:
        return "forked worker"
    if "multiprocessing" in line:
        return "spawned worker"
    if "torch.distributed.run" in line:
        return "torchrun"
    if "-m" in argv[:-1]:
        module = argv[argv.index("-m") + 1]
        return "training rank" if module == "zarrtorch" else module.rsplit(".", 1)[-1]
    return "process"


def process_info(pid: int) -> tuple[int | None, int]:
    """(parent pid, anonymous + shared resident bytes) of a process; (None, 0) once it is gone."""
    fields = {}
    for line in read_text(Path(f"/proc/{pid}/status")).splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.split()
    if "PPid" not in fields:
        return None, 0
    kib = sum(int(fields.get(k, ["0"])[0]) for k in ("RssAnon", "RssShmem"))
    return int(fields["PPid"][0]), 1024 * kib


# ----------------------------------------------------------------------------------------------------- results


@dataclass
class LessonResult:
    kernel: int
    lesson: str  # the notebook's number, "04"
    wall_s: float | None
    peak_bytes: int  # memory.max_usage_in_bytes during the lesson: page cache included
    peak_anon_bytes: int  # sampled: what cannot be reclaimed without swap
    peak_cell: int | None  # the notebook cell running at the anonymous peak
    peak_processes: list[tuple[str, int]]
    limit_hits: int  # memory.failcnt: charges that found the group at its limit (page cache was reclaimed)
    oom_kills: int
    cpu_s: float | None
    throttled_s: float
    status: str


@dataclass
class Probe:
    kernel: int
    available_cpus: int | None = None
    cpu_count: int | None = None
    affinity: int | None = None
    torch_threads: int | None = None
    memory_limit: int | None = None
    error: str | None = None


@dataclass
class Machine:
    cpus: int
    memory_bytes: int
    load_before: tuple[float, float, float]
    load_during: list[float]  # 1-minute load average every 5 s
    busy_cpu_s: float  # all CPU time spent on the machine during the run
    kernels_cpu_s: float | None  # of which by the kernels' cgroups (None: no cpuacct)
    wall_s: float


@dataclass
class Rehearsal:
    kernels: int
    memory_bytes: int
    cpus: float
    size: str
    lessons: list[str]
    data: str  # how the data was shared
    data_files: int
    data_changes: list[str]
    machine: Machine
    per_kernel: int = 0  # lessons each kernel runs (0: all of them)
    probes: list[Probe] = field(default_factory=list)
    results: list[LessonResult] = field(default_factory=list)

    def expected_cpus(self) -> int:
        return math.ceil(self.cpus)

    def passed(self) -> bool:
        return (
            not self.data_changes
            and all(r.status == "ok" and r.oom_kills == 0 for r in self.results)
            and len(self.results) == self.kernels * (self.per_kernel or len(self.lessons))
            and all(p.available_cpus == self.expected_cpus() for p in self.probes)
        )


def lesson_result(kernel: int, record: dict, samples: list[Sample]) -> LessonResult:
    """A lesson's record from its kernel, joined with the samples taken while it ran."""
    during = [s for s in samples if record["start"] <= s.t <= record["end"]]
    peak = max(during, key=lambda s: s.anon, default=None)
    cell = None
    if peak is not None:
        for index, start, end in record["cells"]:
            if start <= peak.t and (end is None or peak.t <= end):
                cell = index
    deltas = record["deltas"]
    return LessonResult(
        kernel=kernel,
        lesson=record["lesson"][:2],
        wall_s=record["end"] - record["start"],
        peak_bytes=record["peak_bytes"],
        peak_anon_bytes=peak.anon if peak else 0,
        peak_cell=cell,
        peak_processes=sorted(peak.processes, key=lambda p: -p[1]) if peak else [],
        limit_hits=deltas["failcnt"],
        oom_kills=deltas["oom_kill"],
        cpu_s=deltas["cpu_ns"] / 1e9 if deltas["cpu_ns"] else None,
        throttled_s=deltas["throttled_ns"] / 1e9,
        status=record["status"],
    )


def unfinished(
    kernel: int, lesson: str, samples: list[Sample], started: float | None, why: str, oom_kills: int = 0
) -> LessonResult:
    """A lesson without a record: its client died (or the run stopped) before it ended."""
    during = [s for s in samples if started is not None and s.t >= started]
    peak = max(during, key=lambda s: s.anon, default=None)
    return LessonResult(
        kernel,
        lesson[:2],
        None,
        max((s.usage for s in during), default=0),
        peak.anon if peak else 0,
        None,
        sorted(peak.processes, key=lambda p: -p[1]) if peak else [],
        0,
        oom_kills,
        None,
        0.0,
        why,
    )


# ------------------------------------------------------------------------------------------------------ report


def gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def describe_processes(processes: list[tuple[str, int]]) -> str:
    """'kernel 0.61, forked worker 0.41, forked worker 0.40, client 0.06' (GiB), largest first."""
    return ", ".join(f"{role} {gib(n)}" for role, n in processes if n >= 0.01 * GIB) or "-"


def format_report(r: Rehearsal) -> str:
    """The rehearsal as Markdown: the set-up and the machine's load, what each kernel sees, the shared data's
    check, the table per kernel and lesson, the kernels x lessons grid, and the verdict."""
    m = r.machine
    lines = [
        f"Hub rehearsal: {r.kernels} kernels at once, each limited to {r.memory_bytes / GIB:g} GiB and "
        f"{r.cpus:g} CPU; size `{r.size}`; lessons {' '.join(n[:2] for n in r.lessons)} (kernel k starts at "
        f"lesson k mod {len(r.lessons)}"
        + ("" if r.per_kernel in (0, len(r.lessons)) else f" and runs {r.per_kernel} of them")
        + ").",
        "",
        f"Machine: {m.cpus} CPUs, {m.memory_bytes / GIB:.1f} GiB; load average before the run "
        f"{m.load_before[0]:.1f} / {m.load_before[1]:.1f} / {m.load_before[2]:.1f} (1, 5, 15 min)"
        + (
            f", during it {sum(m.load_during) / len(m.load_during):.1f} on average (at most {max(m.load_during):.1f})"
            if m.load_during
            else ""
        )
        + f"; the run took {m.wall_s / 60:.1f} min, the machine's CPUs were busy {m.busy_cpu_s:,.0f} CPU-s"
        + (
            f", {m.kernels_cpu_s:,.0f} of them the kernels' and {max(0.0, m.busy_cpu_s - m.kernels_cpu_s):,.0f} "
            "the rest of the machine's (other users)"
            if m.kernels_cpu_s is not None
            else ""
        )
        + ".",
        "",
        probe_sentence(r),
        "",
        f"Shared data: {r.data}; {r.data_files:,} files and folders compared before and after (size, "
        "modification time): "
        + (
            "none changed." if not r.data_changes else f"{len(r.data_changes)} CHANGED: {'; '.join(r.data_changes[:5])}"
        ),
        "",
        "| kernel | lesson | wall s | peak charged GiB | peak anon GiB | cell at the peak | processes at the peak "
        "(anon GiB) | limit reached | OOM kills | CPU s | throttled s | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in sorted(r.results, key=lambda x: (x.kernel, x.lesson)):
        lines.append(
            f"| {x.kernel} | {x.lesson} | {'-' if x.wall_s is None else f'{x.wall_s:.0f}'} | {gib(x.peak_bytes)} | "
            f"{gib(x.peak_anon_bytes)} | {'-' if x.peak_cell is None else x.peak_cell} | "
            f"{describe_processes(x.peak_processes)} | {x.limit_hits} | {x.oom_kills} | "
            f"{'-' if x.cpu_s is None else f'{x.cpu_s:.0f}'} | {x.throttled_s:.0f} | {x.status} |"
        )
    lines += ["", grid(r), "", verdict(r)]
    return "\n".join(lines)


def probe_sentence(r: Rehearsal) -> str:
    """What the kernels see from inside their cgroups, in one sentence (per kernel only where they differ)."""
    seen = {(p.available_cpus, p.cpu_count, p.affinity, p.torch_threads, p.memory_limit, p.error) for p in r.probes}
    if not r.probes:
        return "No kernel answered the probe."
    if len(seen) > 1:
        return "Kernels see (differing): " + "; ".join(
            f"kernel {p.kernel}: {p.error or f'available_cpus() {p.available_cpus}, memory limit {p.memory_limit}'}"
            for p in r.probes
        )
    p = r.probes[0]
    if p.error:
        return f"The probe failed in every kernel: {p.error}"
    ok = "as its quota says" if p.available_cpus == r.expected_cpus() else f"NOT {r.expected_cpus()} as its quota says"
    limit = "none" if p.memory_limit is None else f"{p.memory_limit / GIB:g} GiB"
    return (
        f"Every kernel sees `zarrtorch.available_cpus()` = {p.available_cpus} ({ok}; `os.cpu_count()` "
        f"{p.cpu_count}, affinity mask {p.affinity} CPUs, `torch.get_num_threads()` {p.torch_threads}) and a "
        f"memory limit of {limit}."
    )


def grid(r: Rehearsal) -> str:
    """Kernels x lessons: wall seconds / peak anonymous GiB, and KILLED or FAILED where so."""
    numbers = [n[:2] for n in r.lessons]
    by = {(x.kernel, x.lesson): x for x in r.results}
    rows = ["| kernel | " + " | ".join(numbers) + " |", "|---|" + "---|" * len(numbers)]
    for k in range(r.kernels):
        cells = []
        for n in numbers:
            x = by.get((k, n))
            if x is None:
                cells.append("not run")
                continue
            mark = " KILLED" if x.oom_kills else "" if x.status == "ok" else " FAILED"
            cells.append(f"{'-' if x.wall_s is None else f'{x.wall_s:.0f} s'} / {gib(x.peak_anon_bytes)}{mark}")
        rows.append(f"| {k} | " + " | ".join(cells) + " |")
    return "Wall time / peak anonymous memory (GiB) per kernel and lesson:\n\n" + "\n".join(rows)


def verdict(r: Rehearsal) -> str:
    killed = [x for x in r.results if x.oom_kills]
    failed = [x for x in r.results if x.status != "ok"]
    top = max(r.results, key=lambda x: x.peak_anon_bytes, default=None)
    walls = [x.wall_s for x in r.results if x.wall_s is not None]
    parts = [
        "No kernel was OOM-killed."
        if not killed
        else "OOM KILLED: " + ", ".join(f"kernel {x.kernel} lesson {x.lesson}" for x in killed) + ".",
        "Every lesson passed."
        if not failed
        else "FAILED: " + "; ".join(f"kernel {x.kernel} lesson {x.lesson}: {x.status}" for x in failed) + ".",
    ]
    if top is not None:
        parts.append(
            f"The largest anonymous peak: {gib(top.peak_anon_bytes)} GiB ({top.peak_anon_bytes / r.memory_bytes:.0%} "
            f"of the limit), lesson {top.lesson} in kernel {top.kernel}"
            + (f", cell {top.peak_cell}" if top.peak_cell is not None else "")
            + "."
        )
    if walls:
        parts.append(f"Lessons took {min(walls):.0f} to {max(walls):.0f} s of wall time under this load.")
    return " ".join(parts)


# ---------------------------------------------------------------------------------------------------- the run


def cpu_busy_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat: all but idle and iowait)."""
    values = [int(v) for v in read_text(Path("/proc/stat")).splitlines()[0].split()[1:]]
    busy = sum(values[:8]) - values[3] - values[4]  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def memory_total() -> int:
    for line in read_text(Path("/proc/meminfo")).splitlines():
        if line.startswith("MemTotal:"):
            return 1024 * int(line.split()[1])
    return 0


def rehearse(s: Settings) -> Rehearsal:
    source = (s.data_root / s.size).resolve()
    work = Path(tempfile.mkdtemp(prefix="zarrtorch-hub-", dir=s.work_dir))
    print(f"[hub] run folder {work}; shared data {source}", flush=True)
    before = snapshot(source)
    load_before, busy_before, t0 = os.getloadavg(), cpu_busy_s(), time.time()
    children: list[subprocess.Popen] = []
    sampler = None
    ok = False
    ledger = Ledger(work.name)
    try:
        with (
            shared_data(source, work / "shared-data", s.read_only_mount, ledger) as (data_root, how),
            Cgroups(s.cgroup_root, work.name, s.kernels, s.memory_bytes, s.cpus, ledger) as cgroups,
        ):
            try:
                homes = [prepare_home(work / f"kernel-{k}") for k in range(s.kernels)]
                for k, (home, group) in enumerate(zip(homes, cgroups.groups, strict=True)):
                    children.append(start_kernel(k, home, group, data_root, s))
                sampler = Sampler(cgroups.groups, [c.pid for c in children], s.sample_s)
                sampler.start()
                wait_for(children, homes)
            finally:  # a client not yet in its cgroups would escape their removal: kill each one by its pid
                for child in children:
                    if child.poll() is None:
                        child.kill()
                if sampler is not None:
                    sampler.halt.set()
                    sampler.join()
            final = [g.counters() for g in cgroups.groups]  # read before the groups go, for unfinished lessons
        ledger.close()
        kernels_cpu = [c["cpu_ns"] for c in final]
        after = snapshot(source)
        machine = Machine(
            cpus=os.cpu_count() or 1,
            memory_bytes=memory_total(),
            load_before=load_before,
            load_during=sampler.load,
            busy_cpu_s=cpu_busy_s() - busy_before,
            kernels_cpu_s=sum(kernels_cpu) / 1e9 if any(kernels_cpu) else None,
            wall_s=time.time() - t0,
        )
        result = Rehearsal(
            s.kernels,
            s.memory_bytes,
            s.cpus,
            s.size,
            list(s.lessons),
            how,
            len(after),
            changes(before, after),
            machine,
            s.per_kernel,
        )
        for k, home in enumerate(homes):
            collect(result, k, home, sampler.samples[k], lesson_order(s.lessons, k, s.per_kernel), final[k])
        ok = result.passed()
        return result
    finally:
        if not ledger.record["groups"] and not ledger.record["mount"]:
            ledger.close()  # everything the run made is gone
        for child in children:  # the cgroups' removal killed them; reap them
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=10)
        if s.keep or not ok:
            print(f"[hub] kept {work} (executed notebooks and each kernel's log)", file=sys.stderr)
        elif not any(is_mount_point(d) for d in (work / "shared-data").glob("*")):  # never delete through a mount
            shutil.rmtree(work, ignore_errors=True)


def prepare_home(home: Path) -> Path:
    """An attendee's folder: their own copy of the notebooks, a scratch folder, a temp folder."""
    shutil.copytree(ROOT / "notebooks", home / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    for sub in ("scratch", "tmp", "executed"):
        (home / sub).mkdir()
    return home


def start_kernel(k: int, home: Path, group: KernelGroup, data_root: Path, s: Settings) -> subprocess.Popen:
    env = {
        "ZARRTORCH_DATA_DIR": str(data_root),
        "ZARRTORCH_SCRATCH_DIR": str(home / "scratch"),
        "ZARRTORCH_SIZE": s.size,
        "TMPDIR": str(home / "tmp"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    spec = {
        "procs": [str(d / "cgroup.procs") for d in group.directories()],
        "group": {name: str(path) if path else None for name, path in asdict(group).items()},
        "env": env,
        "home": str(home),
        "events": str(home / "events.jsonl"),
        "lessons": lesson_order(s.lessons, k, s.per_kernel),
        "timeout": s.cell_timeout,
    }
    (home / "spec.json").write_text(json.dumps(spec, indent=1))
    with open(home / "client.log", "w") as log:  # the child holds its own copy of the file
        # a session of its own: Ctrl-C reaches this script only, which then kills the cgroups' processes
        return subprocess.Popen(
            [sys.executable, __file__, CHILD_FLAG, str(home / "spec.json")],
            cwd=home,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_for(children: list[subprocess.Popen], homes: list[Path]) -> None:
    """Wait for every kernel's client, saying every minute how far each got."""
    last = time.time()
    while any(c.poll() is None for c in children):
        time.sleep(1)
        if time.time() - last >= 60:
            last = time.time()
            done = [
                sum('"event": "lesson"' in line for line in read_text(h / "events.jsonl").splitlines()) for h in homes
            ]
            print(f"[hub] lessons done per kernel: {done}; load {os.getloadavg()[0]:.1f}", flush=True)


def collect(result: Rehearsal, k: int, home: Path, samples: list[Sample], order: list[str], final: dict) -> None:
    """Kernel k's probe and lesson records into ``result``; a lesson without a record counts as failed, with
    the OOM kills its cgroup counted from its start to the end of the run (the client itself may be the one
    the OOM killer chose)."""
    events = [json.loads(line) for line in read_text(home / "events.jsonl").splitlines() if line.strip()]
    starts = {e["lesson"]: e for e in events if e["event"] == "lesson-start"}
    done = set()
    for e in events:
        if e["event"] == "probe":
            keys = ("available_cpus", "cpu_count", "affinity", "torch_threads", "memory_limit", "error")
            result.probes.append(Probe(k, **{key: e.get(key) for key in keys}))
        elif e["event"] == "lesson":
            result.results.append(lesson_result(k, e, samples))
            done.add(e["lesson"])
    tail = " | ".join(read_text(home / "client.log").strip().splitlines()[-3:])[-300:]
    for name in order:
        if name not in done:
            start = starts.get(name)
            why = "its client died mid-lesson" if start else "not started"
            kills = final.get("oom_kill", 0) - start.get("counters", {}).get("oom_kill", 0) if start else 0
            result.results.append(
                unfinished(k, name, samples, start and start["t"], f"{why}: {tail or 'no log'}", kills)
            )


def stop(signum: int, _frame) -> None:
    """The first Ctrl-C, SIGTERM or SIGHUP unwinds the run, which kills its processes and removes its cgroups
    and its mount on the way out; later ones are ignored, so that they cannot cut that removal short."""
    for other in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(other, signal.SIG_IGN)
    print(
        f"\n[hub] {signal.Signals(signum).name}: stopping the kernels, removing the cgroups and the mount",
        file=sys.stderr,
    )
    raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, str(ROOT))  # this checkout's package, as the kernels get it (PYTHONPATH)
    if argv[:1] == [CHILD_FLAG]:
        return kernel_child(argv[1])
    s = parse_settings(argv)
    problem = cgroup_problem(s.cgroup_root, os.geteuid()) or data_problem((s.data_root / s.size).resolve())
    if problem:
        print(f"hub_rehearsal: cannot rehearse: {problem}.", file=sys.stderr)
        return 2
    for name in sweep_leftovers():
        print(f"[hub] removed {name}, left by an earlier run that was killed", file=sys.stderr)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)
    result = rehearse(s)
    report = format_report(result)
    print("\n" + report)
    if s.json_out:
        s.json_out.write_text(json.dumps(asdict(result), indent=1) + "\n")
    if s.md_out:
        s.md_out.write_text(report + "\n")
    return 0 if result.passed() else 1


if __name__ == "__main__":
    raise SystemExit(main())
