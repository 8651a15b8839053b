"""A process stopped while it writes a chunk into the node's cache (``ReadOptions(cache_dir=...)``): SIGKILL may
leave a temporary file, never a file served as a chunk; a later epoch streams the right values, and ``cache clear``
removes what is left. The process is stopped at a known point (its first chunk file half written), not after a
sleep."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch._read.cache import MARKER, wait_for_writes
from zarrtorch.cli import main as zarrtorch_command
from zarrtorch.course.servers import HttpStoreServer

WORKER = Path(__file__).with_name("cache_write_killed_worker.py")
ROWS = 40  # 5 chunks of 8 rows
LOCK = ".lock"


def cache_entries(cache_dir: Path) -> list[Path]:
    """Every file under the cache folder but its marker and lock file."""
    return sorted(p for p in cache_dir.rglob("*") if p.is_file() and p.name not in (MARKER, LOCK))


def stopped_mid_write(url: str, cache_dir: Path, sig: int) -> tuple[int, str]:
    """Run the worker until its first chunk file is half written, send it ``sig``, and wait for its end."""
    child = subprocess.Popen(
        [sys.executable, str(WORKER), url, str(cache_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        lines = []
        for line in child.stdout:
            lines.append(line)
            if line.strip() == "MID-WRITE":
                break
        child.send_signal(sig)
        rest = child.communicate(timeout=60)[0]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return child.returncode, "".join(lines) + rest


def right_epoch(url: str, cache_dir: Path) -> None:
    """One epoch through the cache: every row once, each with its own ``y``."""
    ds = ZarrIterableDataset(url, seed=5, return_index=True, read=ReadOptions(cache_dir=cache_dir))
    seen = []
    for batch in ZarrDataLoader(ds, batch_size=8, rank=0, world_size=1):
        np.testing.assert_array_equal(batch["y"].numpy(), 3 * batch["index"].numpy())
        seen += batch["index"].tolist()
    assert sorted(seen) == list(range(ROWS))
    wait_for_writes()


@pytest.fixture
def served(tmp_path):
    prepare_zarr({"y": 3 * np.arange(ROWS, dtype=np.int64)}, tmp_path / "s" / "s.zarr", chunk_rows=8, progress=False)
    with HttpStoreServer(tmp_path / "s") as server:
        yield f"{server.url}/s.zarr"


@pytest.mark.slow
def test_a_process_killed_mid_cache_write_leaves_no_file_served_and_cache_clear_removes_its_leftover(served, tmp_path):
    cache_dir = tmp_path / "cache"
    code, log = stopped_mid_write(served, cache_dir, signal.SIGKILL)
    assert code == -signal.SIGKILL, log
    left = cache_entries(cache_dir)
    assert left and all(p.name.startswith(".tmp") for p in left), left  # the half-written file, never a chunk's
    right_epoch(served, cache_dir)  # from the server, then the cache: not from the leftover
    right_epoch(served, cache_dir)
    assert zarrtorch_command(["cache", "clear", str(cache_dir)]) == 0
    assert cache_entries(cache_dir) == []
