"""The private part of torch.distributed zarrtorch relies on (zarrtorch/_compat/torch_distributed.py): the default
process group's timeout, read from its backend's options."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from zarrtorch._compat.torch_distributed import default_group_timeout
from zarrtorch._util.process import group_timeout_s


def test_the_default_groups_timeout_is_read_back(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1, timeout=timedelta(seconds=77)
    )
    try:
        assert default_group_timeout() == timedelta(seconds=77), (
            "torch no longer keeps the group's timeout in _get_default_group()._get_backend(device).options._timeout: "
            "update zarrtorch._compat.torch_distributed.default_group_timeout"
        )
        assert group_timeout_s() == 77.0
    finally:
        dist.destroy_process_group()
