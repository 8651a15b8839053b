"""What the current process is: the CPUs it may use and its place in a DDP job."""

from __future__ import annotations

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
