"""Moved to :mod:`zarrtorch._compat.torch`; kept only until loader.py imports from there.

TODO(lead): delete this module when loader.py imports zarrtorch._compat.torch (issue 42, the _compat item).
"""

from zarrtorch._compat.torch import (  # noqa: F401 (re-exported for loader.py until it is switched)
    EpochSampler,
    WorkersSilent,
    awaited_worker,
    bound_waits,
    set_sampler,
    stop_workers,
    worker_processes,
)
