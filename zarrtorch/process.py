"""What the current process is: the CPUs it may use and its place in a DDP job."""

from __future__ import annotations

import contextlib
import gc
import os


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. Slurm's ``--cpus-per-task``), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_share(parts: int) -> int:
    """This process's CPUs split evenly between ``parts`` consumers (DataLoader workers, or the processes
    of one node), at least one each: the default number of decode threads or torch threads."""
    return max(1, available_cpus() // max(1, int(parts)))


def distributed_topology() -> tuple[int, int]:
    """(rank, world size) of this process from ``torch.distributed``, or (0, 1) outside DDP."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@contextlib.contextmanager
def frozen_objects(when: bool = True):
    """Keep the garbage collector off this process's objects while worker processes are forked. A collection
    in a forked worker writes into the header of every object it inherited, so each memory page holding one
    becomes a private copy (about 8 MiB per worker with torch imported); frozen, they stay shared. Does
    nothing if the program has frozen objects itself (``gc.freeze``): that is its own choice to keep."""
    if not when or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()  # in this process only: the forked workers keep theirs frozen
