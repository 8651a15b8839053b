"""Both features of issue 44 under torchrun's own launcher (``python -m torch.distributed.run --standalone``, 2
ranks on one node, gloo): a MixedLoader whose sources are a local store and a remote one read through the node's
chunk cache with placement. Every rank draws the same source at each step, each source's rows are drawn exactly
once per epoch over the ranks with their own values, the node's two ranks share the cache (the second epoch asks the
server for no chunk), and a rank that raises ends the launch instead of leaving the other waiting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_ddp import TIMEOUT
from torchrun_mix_cache_worker import MARK, RAISED

from zarrtorch import prepare_zarr
from zarrtorch.course.servers import HttpStoreServer

WORKER = Path(__file__).with_name("torchrun_mix_cache_worker.py")
SIZES = {"local": 48, "remote": 32}  # rows; 8-row chunks, batches of 8 on 2 ranks: 3 and 2 steps per epoch


def write(path: Path, rows: int) -> None:
    prepare_zarr({"y": 3 * np.arange(rows, dtype=np.int64)}, path, chunk_rows=8, progress=False)


@pytest.mark.slow
def test_torchrun_ranks_mix_a_local_and_a_cached_remote_store_and_a_raising_rank_ends_the_launch(tmp_path):
    write(tmp_path / "local.zarr", SIZES["local"])
    write(tmp_path / "served" / "remote.zarr", SIZES["remote"])
    with HttpStoreServer(tmp_path / "served") as server:
        heard: list[str] = []
        count = server.count
        server.count = lambda key: (heard.append(key), count(key))  # every request, in order
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", str(WORKER)]
        cmd += [str(tmp_path / "local.zarr"), f"{server.url}/remote.zarr", str(tmp_path / "cache"), str(tmp_path)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    log = done.stdout + done.stderr
    assert done.returncode != 0 and RAISED in log, log[-4000:]  # rank 1's error ends the launch, in bounded time
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for epoch in range(2):
        assert ranks[0][epoch]["sources"] == ranks[1][epoch]["sources"]  # the same source at every step
        for name, rows in SIZES.items():
            drawn = ranks[0][epoch]["rows"][name] + ranks[1][epoch]["rows"][name]
            assert sorted(drawn) == list(range(rows)), f"epoch {epoch}, {name}: not each row once"
            for rank in ranks:
                assert rank[epoch]["y"][name] == [3 * i for i in rank[epoch]["rows"][name]]
    second = heard[heard.index(f"remote.zarr/{MARK}") + 1 :]
    assert not [key for key in second if "/c/" in key], second  # the node's cache held both ranks' chunks
