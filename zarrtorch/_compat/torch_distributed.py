"""The private part of ``torch.distributed`` zarrtorch relies on: the default process group's timeout.

``tests/core/_compat/test_torch_distributed.py`` checks it against the installed torch.
"""

from __future__ import annotations

from datetime import timedelta


def default_group_timeout() -> timedelta | None:
    """The timeout the default process group was made with (``init_process_group(timeout=...)``), or ``None``
    where it cannot be read (a backend without options, or one that keeps no timeout there).

    Why: the ranks' agreement check waits as long as the process group does (a rank may spend that long between
    epochs, in an evaluation, and its job is valid); torch keeps the timeout only in the group's backend options,
    private to torch (``_get_default_group()._get_backend(device).options._timeout``). The CPU (gloo) backend is
    asked first, then the CUDA (NCCL) one."""
    import torch
    import torch.distributed as dist

    group = dist.distributed_c10d._get_default_group()
    for device in ("cpu", "cuda"):
        try:  # RuntimeError: the group has no backend for that device; AttributeError: one without these options
            timeout = group._get_backend(torch.device(device)).options._timeout
        except (RuntimeError, AttributeError):
            continue
        if isinstance(timeout, timedelta):
            return timeout
    return None
