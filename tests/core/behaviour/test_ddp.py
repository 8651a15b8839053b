"""Real multi-process DDP (gloo, CPU): a process per rank with torchrun's environment (forked from a server that
imported torch once: ``preloaded.py``), with and without spawned DataLoader workers. Every rank must yield the
same number of batches (an ``all_reduce`` after each batch would fail otherwise), no row may appear twice in an
epoch, rows of all arrays stay paired, and epochs differ."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest
from preloaded import Rank, end_still_running  # noqa: I001  (tests/core/behaviour is on sys.path under pytest)

from zarrtorch import ZarrIterableDataset, prepare_zarr

ROWS, CHUNK = 403, 25  # 17 chunks, the last one 3 rows long
WORKER = Path(__file__).with_name("ddp_worker.py")
TIMEOUT = 300  # seconds for a whole launch; a hang fails the test


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("ddp") / "data.zarr"
    x = (6 * np.arange(ROWS, dtype=np.float32)[:, None] + np.arange(6, dtype=np.float32)).reshape(ROWS, 2, 3)
    prepare_zarr({"x": x, "y": 10 * np.arange(ROWS, dtype=np.int64) + 7}, path, chunk_rows=CHUNK, progress=False)
    return path


def launch(store, out, world, *, batch_size, num_workers, drop_last, epochs=2, extra=()):
    port = free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "OMP_NUM_THREADS": "1",
        }
        argv = [
            "--store",
            str(store),
            "--out",
            str(out),
            "--batch-size",
            str(batch_size),
            "--num-workers",
            str(num_workers),
            "--drop-last",
            str(int(drop_last)),
            "--epochs",
            str(epochs),
            *extra,
        ]
        procs.append(Rank(argv, env, script=WORKER, log_dir=out))
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=TIMEOUT)[0])
    except TimeoutError:
        pytest.fail(f"DDP launch (world {world}, {num_workers} workers) did not finish in {TIMEOUT} s")
    finally:
        end_still_running(procs)
    for rank, (p, log) in enumerate(zip(procs, logs, strict=True)):
        assert p.returncode == 0, f"rank {rank} exited with {p.returncode}:\n{log[-4000:]}"
    return [dict(np.load(out / f"rank{r}.npz")) for r in range(world)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "world,num_workers,drop_last,context",
    [(2, 0, True, None), (3, 0, False, None), (2, 2, False, "spawn"), (3, 2, True, "fork")],
)
def test_ddp_ranks(store, tmp_path, world, num_workers, drop_last, context):
    """Spawned workers (a fresh interpreter each, as torchrun users with CUDA have them) and forked ones."""
    batch = 16
    extra = ["--context", context] if context else []
    results = launch(
        store, tmp_path, world, batch_size=batch, num_workers=num_workers, drop_last=drop_last, extra=extra
    )
    for rank, res in enumerate(results):
        assert tuple(res["topology"]) == (rank, world)  # the loader read the process group
    for epoch in range(2):
        counts = [len(res[f"sizes_{epoch}"]) for res in results]
        assert len(set(counts)) == 1 and counts[0] == int(results[0]["len"])  # same count, = len(loader)
        seen = []
        for res in results:
            idx = res[f"index_{epoch}"]
            np.testing.assert_array_equal(res[f"x_{epoch}"], 6 * idx)  # arrays stay paired
            np.testing.assert_array_equal(res[f"y_{epoch}"], 10 * idx + 7)
            sizes = res[f"sizes_{epoch}"]
            assert (sizes[:-1] == batch).all() and (not drop_last or sizes[-1] == batch)
            seen.append(idx)
        seen = np.concatenate(seen)
        if drop_last:
            assert len(np.unique(seen)) == len(seen)  # no row twice in the epoch
            assert ROWS - len(seen) < world * batch
        else:
            assert set(seen.tolist()) == set(range(ROWS))  # every row, plus fewer than world repeats
            assert len(seen) - ROWS < world
    for res in results:  # a new chunk order: every rank reads other rows in epoch 1
        assert set(res["index_0"].tolist()) != set(res["index_1"].tolist())


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_ddp_ranks_over_http_read_every_row_once(store, tmp_path, num_workers):
    """Ranks started as torchrun starts them, reading the store by URL from a server adding 20 ms per request:
    the adapted requests in flight (finished reads waiting behind slower ones counted apart) keep every row once
    per epoch across ranks, with equal batch counts. (Forked workers: spawned ones reading by URL are
    test_remote.py's, and cost 4 interpreters' imports here.)"""
    from zarrtorch.course.servers import HttpStoreServer

    with HttpStoreServer(store.parent, delay_ms=20) as server:
        url = f"{server.url}/{store.name}"
        forked = ["--context", "fork"] if num_workers else []
        results = launch(url, tmp_path, 2, batch_size=16, num_workers=num_workers, drop_last=False, extra=forked)
    for epoch in range(2):
        assert len(results[0][f"sizes_{epoch}"]) == len(results[1][f"sizes_{epoch}"])
        seen = np.concatenate([res[f"index_{epoch}"] for res in results])
        assert set(seen.tolist()) == set(range(ROWS)) and len(seen) - ROWS < 2
        for res in results:
            np.testing.assert_array_equal(res[f"x_{epoch}"], 6 * res[f"index_{epoch}"])


@pytest.mark.slow
@pytest.mark.parametrize("before,after", [((2, 2), (3, 1)), ((3, 1), (2, 2))])
def test_ddp_elastic_resume(store, tmp_path, before, after):
    """The job "hits its time limit" after 4 batches on one world size and resumes on another, with workers:
    the rest of the epoch has equal batches on every new rank (an all_reduce after each batch), no row consumed
    before is read again, every row of the epoch is read, and epoch 1 is an ordinary epoch. (Forked workers: the
    plan and the state do not depend on how workers start, and spawned ones, tested above, cost 14 interpreters'
    imports here.)"""
    batch, first, second = 16, tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (w0, k0), (w1, k1) = before, after
    forked = ["--context", "fork"]
    old = launch(
        store, first, w0, batch_size=batch, num_workers=k0, drop_last=False, extra=["--stop-after", "4", *forked]
    )
    assert all(len(res["sizes_0"]) == 4 for res in old)
    state = first / "state.json"
    resume = ["--resume", str(state), *forked]
    new = launch(store, second, w1, batch_size=batch, num_workers=k1, drop_last=False, extra=resume)
    consumed = np.concatenate([res["index_0"] for res in old])
    rest = [res["index_0"] for res in new]
    counts = {len(res["sizes_0"]) for res in new}
    assert len(counts) == 1 and counts.pop() == int(new[0]["len"]) - 4  # len(loader) counts the 4 batches before
    rest = np.concatenate(rest)
    assert not np.isin(rest, consumed).any()
    assert set(rest.tolist()) | set(consumed.tolist()) == set(range(ROWS))
    assert len(rest) + len(consumed) - ROWS < w0 + w1  # padding of each topology
    ds = ZarrIterableDataset(store, seed=7, buffer_chunks=2)  # as in ddp_worker.py
    for rank, res in enumerate(new):  # epoch 1 is an ordinary epoch of the new topology
        plan = ds.batch_row_ids(epoch=1, rank=rank, world_size=w1, num_workers=k1, batch_size=batch, drop_last=False)
        np.testing.assert_array_equal(res["index_1"], np.concatenate(plan))


@pytest.mark.slow
def test_ddp_rank_order_gives_each_rank_the_batches_of_no_worker(store, tmp_path):
    """``batch_order="rank"`` with 2 workers per rank on 2 ranks: each rank's batches, in order, are those the plan
    gives that rank with no worker, with their data; equal batch counts. (Forked workers: spawned ones, tested
    above for the default order, cost seconds of imports here.)"""
    batch = 16
    results = launch(
        store,
        tmp_path,
        2,
        batch_size=batch,
        num_workers=2,
        drop_last=False,
        epochs=1,
        extra=["--batch-order", "rank", "--context", "fork"],
    )
    ds = ZarrIterableDataset(store, seed=7, buffer_chunks=2)  # as in ddp_worker.py
    for rank, res in enumerate(results):
        for epoch in range(1):
            plan = ds.batch_row_ids(epoch=epoch, rank=rank, world_size=2, num_workers=0, batch_size=batch)
            np.testing.assert_array_equal(res[f"sizes_{epoch}"], [len(b) for b in plan])
            np.testing.assert_array_equal(res[f"index_{epoch}"], np.concatenate(plan))
            np.testing.assert_array_equal(res[f"y_{epoch}"], 10 * res[f"index_{epoch}"] + 7)


CHECK_SCRIPT = """
import os, sys
from datetime import timedelta
import torch.distributed as dist
from zarrtorch import ZarrDataLoader, ZarrIterableDataset
from zarrtorch._util.process import group_timeout_s
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=int(sys.argv[3])))
print("group timeout", group_timeout_s())
given = 0 if sys.argv[2] == "local-rank" else dist.get_rank()  # LOCAL_RANK on a second node: 0 there
path = sys.argv[4] if rank == 1 and len(sys.argv) > 4 else sys.argv[1]  # rank 1's own store, when given
ds = ZarrIterableDataset(path, seed=rank if sys.argv[2] == "seeds" else 0)
loader = ZarrDataLoader(ds, batch_size=8, rank=given, world_size=dist.get_world_size())
try:
    next(iter(loader))
    print("NOT REFUSED")
except (RuntimeError, ValueError) as exc:
    print("refused:", exc)
dist.destroy_process_group()
"""


def run_check_script(store, case: str, timeout_s: int, other=None) -> list[str]:
    port = free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank)}
        env.update(WORLD_SIZE="2", OMP_NUM_THREADS="1")
        argv = [store, case, timeout_s, *([other] if other else [])]
        procs.append(Rank(argv, env, code=CHECK_SCRIPT, log_dir=Path(store).parent))
    try:
        return [p.communicate(timeout=TIMEOUT)[0] for p in procs]
    finally:
        end_still_running(procs)


@pytest.mark.slow
def test_ranks_given_explicitly_are_still_checked_and_wait_the_groups_timeout(store):
    """rank=/world_size= equal to the process group's (as DistributedSampler users pass them) turned the ranks'
    agreement check off: ranks with other seeds read overlapping rows, 120 twice and 120 never of 600 (found by a
    break-test helper). And the check waits the group's own timeout, not a fixed 300 s."""
    for log in run_check_script(store, "seeds", 77):
        assert "group timeout 77.0" in log, log[-3000:]
        assert "refused: the ranks computed different plans" in log, log[-3000:]


@pytest.mark.slow
def test_another_ranks_share_at_the_groups_size_is_refused_at_once(store):
    """rank=0 on every process of a group of 2 (LOCAL_RANK passed on a second node): rank 1 streamed rank 0's rows
    without a check (found by a second break-test). Refused at once, naming the rank and the fix."""
    logs = run_check_script(store, "local-rank", 8)  # rank 0 then waits for rank 1 that group timeout
    assert "refused: rank=0 was given, but this process is rank 1 of the process group's 2" in logs[1], logs[1][-3000:]
    assert "NOT REFUSED" not in logs[0], logs[0][-3000:]


@pytest.mark.slow
def test_ranks_on_other_data_of_the_same_shape_are_refused(store, tmp_path):
    """Rank 1 on a store of the same shape holding other values trained on both stores, silently: the plan check
    compared settings only (found by a break-test helper). A hash of each array's first chunk is compared too;
    an identical copy at another path agrees."""
    import shutil

    copy = tmp_path / "copy.zarr"
    shutil.copytree(store, copy)
    logs = run_check_script(store, "same", 20, other=copy)
    assert all("NOT REFUSED" in log for log in logs), logs
    other = tmp_path / "other.zarr"
    x = np.ones((ROWS, 2, 3), dtype=np.float32)
    prepare_zarr({"x": x, "y": 10 * np.arange(ROWS, dtype=np.int64) + 7}, other, chunk_rows=CHUNK, progress=False)
    for log in run_check_script(store, "same", 20, other=other):
        assert "refused: the ranks computed different plans" in log and ", data " in log, log[-3000:]
