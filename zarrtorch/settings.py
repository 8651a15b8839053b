"""Check the dataset's numeric settings up front, with messages that say what is allowed: a bad value
found later, inside a worker, would surface as a less readable error in every process at once."""

from __future__ import annotations

import numpy as np
from torch.utils.data import default_convert


def check_settings(*, seed, buffer_chunks, **at_least_one) -> None:
    """``seed`` an int, ``buffer_chunks`` an integer >= 0, every other keyword ``None`` or >= 1."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int shared by every process, got {seed!r}")
    if isinstance(buffer_chunks, bool) or int(buffer_chunks) != buffer_chunks or buffer_chunks < 0:
        raise ValueError(
            f"buffer_chunks must be an integer >= 0 (0: chunk order only, no row buffer), got {buffer_chunks!r}"
        )
    for name, value in at_least_one.items():
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def check_loader_settings(dataset, batch_size, num_workers, rank, world_size, work_ahead, transport, kwargs) -> None:
    """Refuse ZarrDataLoader arguments that cannot work, saying what to do instead (``kwargs`` loses the
    sampler arguments, which the dataset's own settings replace)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    for name in ("sampler", "batch_sampler", "shuffle"):
        if kwargs.get(name) not in (None, False):
            raise ValueError(
                f"{name}= is not used by ZarrDataLoader: order and shuffling are set on the "
                "ZarrIterableDataset (shuffle=, seed=, buffer_chunks=)"
            )
        kwargs.pop(name, None)
    if kwargs.get("collate_fn") not in (None, default_convert):
        raise ValueError(
            "collate_fn= is not used by ZarrDataLoader: it yields whole batches, assembled in the workers from "
            "the shuffle buffer, as dicts of tensors. To change a batch, pass transform= (a picklable function "
            "batch dict -> batch dict) to ZarrIterableDataset; it runs on every batch, in the workers"
        )
    if kwargs.get("in_order", True) is False:
        raise ValueError("in_order=False would make the batch order depend on timing; resuming needs it True")
    if (rank is None) != (world_size is None):
        raise ValueError("give both rank and world_size, or neither (then torch.distributed decides)")
    if world_size is not None and not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if dataset.cache and num_workers > 0 and not kwargs.get("persistent_workers", False):
        raise ValueError("cache=True keeps rows in the worker processes: also pass persistent_workers=True")
    if transport not in (None, "ring", "queue"):
        raise ValueError(f"transport must be 'ring' or 'queue' (zarrtorch.ring) or None, got {transport!r}")
    if transport == "ring" and (dataset.transform is not None or dataset.stack):
        what = "transform" if dataset.transform is not None else "stack"
        raise ValueError(
            f"transport='ring' carries batches in slots shaped like the stored arrays, and a {what} changes them "
            "after they are gathered: leave transport to the loader (None: the queue for such a dataset) or pass "
            "transport='queue'"
        )
    if isinstance(work_ahead, bool) or int(work_ahead) != work_ahead or work_ahead < 0:
        raise ValueError(f"work_ahead must be an integer >= 0 (batches assembled ahead), got {work_ahead!r}")
