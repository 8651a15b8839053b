"""What the current process is: the CPUs it may use and its place in a DDP job."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
import warnings
import weakref
from datetime import timedelta

from zarrtorch._compat.torch_distributed import default_group_timeout
from zarrtorch._util.cgroup import cgroup_cpu_limit


def available_cpus(cgroup_root: str | os.PathLike | None = None) -> int:
    """CPUs this process may use, not the machine's: those of its affinity mask (e.g. Slurm's
    ``--cpus-per-task``), at most its cgroup's CPU quota rounded up (a container's, a Kubernetes pod's
    limit: :func:`zarrtorch._util.cgroup.cgroup_cpu_limit`), at least 1. The one count every thread pool the
    package sizes from CPUs starts from. ``cgroup_root``: where ``/`` is for the cgroup files (tests)."""
    try:
        mask = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        mask = os.cpu_count() or 1
    quota = cgroup_cpu_limit(cgroup_root)
    return max(1, mask if quota is None else min(mask, quota))


def cpu_share(parts: int) -> int:
    """This process's CPUs split evenly between ``parts`` consumers (DataLoader workers, or the processes
    of one node), at least one each: the default number of decode threads or torch threads."""
    return max(1, available_cpus() // max(1, int(parts)))


class TopologyUnknown(RuntimeError):
    """This process is part of a DDP job whose process group does not exist yet and whose environment
    does not say its rank."""


def distributed_topology() -> tuple[int, int]:
    """(rank, world size) of this process: ``torch.distributed``'s once its process group exists, before
    that the ``RANK`` and ``WORLD_SIZE`` that torchrun (and Slurm scripts that export them) set, else (0, 1).

    Why the environment: a loader asked for its length or its first epoch before ``init_process_group``
    would otherwise take every process for rank 0 of 1, and every rank would read every row. A process
    that says ``WORLD_SIZE > 1`` without its ``RANK`` is refused (:class:`TopologyUnknown`), never guessed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return environment_topology()


def environment_topology(env: dict | None = None) -> tuple[int, int]:
    """(rank, world size) from ``RANK`` / ``WORLD_SIZE`` (see :func:`distributed_topology`)."""
    env = os.environ if env is None else env
    world_text, rank_text = env.get("WORLD_SIZE"), env.get("RANK")
    try:
        world = int(world_text) if world_text not in (None, "") else None
        rank = int(rank_text) if rank_text not in (None, "") else None
    except ValueError:
        raise TopologyUnknown(
            f"RANK={rank_text!r} and WORLD_SIZE={world_text!r} in the environment are not integers: fix them, "
            "or pass rank= and world_size= to ZarrDataLoader"
        ) from None
    if world is None and rank is None:
        _say_slurm_tasks_are_not_ranks(env)
        return 0, 1
    if world is None or world < 1:
        raise TopologyUnknown(
            f"RANK={rank_text} is set but WORLD_SIZE={world_text!r}: set both (torchrun does), initialise "
            "torch.distributed first, or pass rank= and world_size= to ZarrDataLoader"
        )
    if rank is None:
        if world == 1:
            return 0, 1
        raise TopologyUnknown(
            f"WORLD_SIZE={world} is set but RANK is not, and torch.distributed is not initialised yet: this "
            "process cannot know which share of the data is its own. Initialise the process group first "
            "(Lightning does before it asks for batches), export RANK, or pass rank= and world_size= to "
            "ZarrDataLoader"
        )
    if not 0 <= rank < world:
        raise TopologyUnknown(f"RANK={rank} is outside [0, WORLD_SIZE={world}): fix the job's environment")
    return rank, world


def _say_slurm_tasks_are_not_ranks(env) -> None:
    """Warn, once, where Slurm started several tasks but nothing says they are DDP ranks: Slurm's own
    variables are not taken for ranks (independent tasks of a sweep would each read a share and miss the rest),
    so before ``init_process_group`` each task reads every row as rank 0 of 1."""
    tasks = str(env.get("SLURM_NTASKS", "")).strip()
    if not tasks.isdigit() or int(tasks) < 2 or _WARNED.get("slurm"):
        return
    _WARNED["slurm"] = True
    warnings.warn(
        f"SLURM_NTASKS={tasks} but no process group and no RANK/WORLD_SIZE: this task is taken for rank 0 of 1 and "
        "reads every row. If the tasks are DDP ranks, call torch.distributed.init_process_group before the loader "
        "counts or iterates, or export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS (Lightning sets up the group "
        "before it asks for batches)",
        stacklevel=4,
    )


_WARNED: dict[str, bool] = {}


@contextlib.contextmanager
def frozen_objects(when: bool = True):
    """Keep the garbage collector off this process's objects while worker processes are forked. A collection
    in a forked worker writes into the header of every object it inherited, so each memory page holding one
    becomes a private copy (``benchmarks/README.md`` measures how much); frozen, they stay shared. Does
    nothing if the program has frozen objects itself (``gc.freeze``): that is its own choice to keep."""
    if not when or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()  # in this process only: the forked workers keep theirs frozen


@contextlib.contextmanager
def ctrl_c_held(when: bool = True):
    """Hold a Ctrl-C (SIGINT) that arrives while worker processes are forked, and hand it to the program's handler
    once they are: Python runs the handler at the first bytecode after ``fork()``, which is inside the fork's hooks
    in the parent (logging's lock release among them), where the ``KeyboardInterrupt`` is printed as "Exception
    ignored" and dropped. Only in the main thread (the only one a handler runs in), and only over a handler written
    in Python (``SIG_DFL`` ends the process in C, ``SIG_IGN`` wants nothing)."""
    if not when or threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):
        yield
        return
    arrived: list = []
    signal.signal(signal.SIGINT, lambda signum, frame: arrived.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        if arrived:
            handler(signal.SIGINT, arrived[0])  # Python's default raises KeyboardInterrupt here


RANK_CHECK_TIMEOUT_S = 1800.0  # torch's default for a process group, where the group's own cannot be read


def group_timeout_s() -> float:
    """The default process group's timeout (``init_process_group(timeout=...)``), which the ranks' check waits
    too: a rank may spend longer than any fixed wait between epochs (an evaluation) as long as the group's own
    timeout allows it. torch's 30 minutes where the group's cannot be read
    (:func:`zarrtorch._compat.torch_distributed.default_group_timeout`)."""
    timeout = default_group_timeout()
    return RANK_CHECK_TIMEOUT_S if timeout is None else float(timeout.total_seconds())


_CHECK_GROUPS: dict[str, tuple] = {}  # "group": weak references to (the default process group, its check group)


def _check_group(timeout_s: float):
    """A gloo group over every rank, made once per process group: the check's collective runs on the CPU
    whatever the training's backend, and waits ``timeout_s`` at most (the default group waits 30 minutes).

    Held by weak reference only: torch owns process groups and frees them in ``destroy_process_group``; a group
    kept alive past that is destroyed during interpreter shutdown, where a gloo group can abort the process."""
    import torch.distributed as dist

    world = dist.group.WORLD
    cached = _CHECK_GROUPS.get("group")
    group = cached[1]() if cached is not None and cached[0]() is world else None
    if group is None:
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        _CHECK_GROUPS["group"] = (weakref.ref(world), weakref.ref(group))
    return group


def check_ranks_agree(value: str, what: str, timeout_s: float | None = None) -> None:
    """Raise unless every rank of the process group passes the same ``value`` (one small all-gather).

    Why: every rank computes its share of an epoch by itself; ranks that disagree on an input (another seed,
    another zarrtorch or NumPy) would read overlapping rows, silently. The error names the ranks that differ."""
    import torch.distributed as dist

    values: list = [None] * dist.get_world_size()
    timeout_s = group_timeout_s() if timeout_s is None else float(timeout_s)
    try:
        dist.all_gather_object(values, value, group=_check_group(timeout_s))
    except RuntimeError as exc:
        raise RuntimeError(
            f"the ranks did not all start {what} within {timeout_s:g} s, the process group's timeout "
            f"({type(exc).__name__}: {exc}): a rank is late (an evaluation or a checkpoint on one rank only: give "
            "init_process_group a longer timeout) or dead, or the ranks iterate their loaders in different orders "
            "(a loader iterated on one rank only, say to look at a batch, needs check_ranks=False)"
        ) from exc
    if len(set(values)) > 1:
        by_value: dict = {}
        for rank, v in enumerate(values):
            by_value.setdefault(v, []).append(rank)
        lines = "; ".join(f"rank(s) {ranks}: {v}" for v, ranks in by_value.items())
        raise RuntimeError(
            f"the ranks computed different plans for {what}, so they would read overlapping rows: {lines}. "
            "Run every rank with the same arguments, data, zarrtorch and NumPy versions"
        )


_STATES = {"T": "stopped (SIGSTOP or a debugger)", "t": "stopped by a debugger", "D": "in an uninterruptible read"}


def process_state(pid: int) -> str:
    """What ``/proc`` says of process ``pid`` when it explains a silence (stopped, stuck in a read), else ``""``."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
    return _STATES.get(state, "")
