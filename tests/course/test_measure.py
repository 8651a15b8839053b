"""zarrtorch.course.measure: counts, bounds and worker memory of a loader run."""

import math

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from zarrtorch.course.measure import ChunkReads, apart, batch_len, measure_loader, mib


def test_batch_len():
    assert batch_len(torch.zeros(7, 3)) == 7
    assert batch_len({"a": np.zeros((5, 2)), "b": np.zeros(5)}) == 5
    assert batch_len((torch.zeros(4), torch.zeros(4))) == 4
    assert batch_len([1, 2, 3]) == 3
    assert mib(3 * 2**20) == 3.0


def test_counts_and_bound():
    batches = [np.zeros((10, 2))] * 6 + [np.zeros((3, 2))]
    full = measure_loader(batches)
    assert (full["batches"], full["samples"]) == (7, 63)
    assert full["samples_per_s"] > 0 and full["first_batch_s"] >= 0
    assert full["first_batch_s"] <= full["seconds"]
    assert full["workers_seen"] == 0 and full["peak_rss_workers"] == 0
    assert full["peak_rss_main"] > 0

    calls = []

    def factory():
        calls.append(1)
        return iter(batches)

    bounded = measure_loader(factory, max_batches=2)
    assert calls == [1]
    assert (bounded["batches"], bounded["samples"]) == (2, 20)

    one = measure_loader(batches, max_batches=1)
    assert one["batches"] == 1 and math.isnan(one["steady_samples_per_s"])
    with pytest.raises(ValueError):
        measure_loader(batches, max_batches=0)


def test_sees_dataloader_workers():
    ds = TensorDataset(torch.arange(400, dtype=torch.float32).reshape(100, 4))
    stats = measure_loader(lambda: DataLoader(ds, batch_size=10, num_workers=2), max_batches=5)
    assert stats["batches"] == 5 and stats["samples"] == 50
    assert stats["workers_seen"] >= 2
    assert stats["peak_rss_workers"] >= stats["peak_rss_per_worker"] > 0
    assert 0 < stats["peak_uss_per_worker"] <= stats["peak_rss_per_worker"]


def test_ignores_processes_started_before():
    import multiprocessing
    import time

    older = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
    older.start()
    try:
        stats = measure_loader([np.zeros((10, 2))] * 3)
    finally:
        older.terminate()
        older.join()
    assert stats["workers_seen"] == 0 and stats["peak_rss_workers"] == 0


def test_proc_readers():
    """The /proc readers behind the sampler (shared with benchmarks/): this process, a child, a gone one."""
    import multiprocessing
    import os
    import time

    from zarrtorch.course.memory import descendants, rss, uss

    me = os.getpid()
    assert 0 < uss(me) <= rss(me)
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
    child.start()
    try:
        assert child.pid in descendants(me)
    finally:
        child.terminate()
        child.join()
    assert rss(child.pid) is None and uss(child.pid) is None and child.pid not in descendants(me)


def test_only_ranges_that_do_not_overlap_are_apart():
    runs = {"fast": [1.0, 1.4, 1.2], "slow": [2.0, 2.5], "between": [1.3, 2.1]}
    assert apart(runs) == [("fast", "slow")]  # "between" overlaps both
    assert apart({"a": [1.0, 2.0], "b": [2.0, 3.0]}) == []  # touching ranges are not apart


def test_reports_what_a_loader_holds_without_library_pages():
    """The figure loader_memory predicts (benchmarks/README.md, "held MiB"): the main process's anonymous growth
    plus each worker's private dirty peak; a worker that allocates 32 MiB shows them."""
    import os
    import time

    class Holding(torch.utils.data.IterableDataset):
        def __iter__(self):
            block = np.ones(32 * 2**20, dtype=np.uint8)  # written: private dirty pages of this worker
            for i in range(3):
                time.sleep(0.25)  # long enough for the sampler to read this worker's smaps_rollup
                yield torch.tensor([int(block[i]), os.getpid()])

    stats = measure_loader(lambda: DataLoader(Holding(), batch_size=None, num_workers=1))
    assert stats["workers_seen"] == 1
    assert stats["peak_held_per_worker"] >= 32 * 2**20
    assert stats["held"] >= stats["peak_held_per_worker"]
    alone = measure_loader([np.zeros((10, 2))] * 3)
    assert alone["peak_held_per_worker"] == 0 and alone["held"] >= 0


def test_paced_run_goes_on_through_epochs_and_counts_the_wait():
    """The workers rule's proxy (lesson 04, docs/tuning.md): a loop of `batches` steps crosses epochs as a training
    loop does (set_epoch, a new iter()), and reports the share of its time spent in next()."""
    import time

    from zarrtorch.course.measure import paced_run, python_step, sleeping_step

    class Epochs:
        """Three batches of 2 rows per epoch, each taking 20 ms to produce; remembers the epochs it was set to."""

        def __init__(self):
            self.epochs = []

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

        def __iter__(self):
            for _ in range(3):
                time.sleep(0.02)
                yield np.zeros((2, 1))

    loader = Epochs()
    run = paced_run(loader, sleeping_step, 0.001, batches=7)  # the first batch is start-up, then 7 timed
    assert run["batches"] == 7 and run["rows_per_s"] > 0
    assert loader.epochs == [0, 1, 2]  # 8 batches of 3 per epoch: epochs 0, 1 and 2
    assert 0.5 < run["wait_share"] <= 1.0  # 20 ms in next() against 1 ms of step

    start = time.perf_counter()
    python_step(0.05)
    assert time.perf_counter() - start >= 0.05


def test_the_workers_command_prints_a_line_per_step_and_number_of_workers(tmp_path, capsys):
    from zarrtorch import prepare_zarr
    from zarrtorch.course.measure import main

    x = np.random.default_rng(0).normal(size=(200, 4, 8)).astype(np.float32)
    prepare_zarr({"x": x}, tmp_path / "s.zarr", chunk_rows=20, progress=False)
    argv = [str(tmp_path / "s.zarr"), "--batch-size", "16", "--workers", "0", "1", "--steps", "sleep", "python"]
    assert main([*argv, "--batches", "15", "--repeats", "1"]) == 0  # 15 batches: more than an epoch's 12
    out = capsys.readouterr().out.splitlines()
    assert "the loader alone, 0 workers" in out[0]
    assert [line.split(":")[0].split() for line in out[1:]] == [
        ["sleep", "step,", "0", "workers"],
        ["sleep", "step,", "1", "workers"],
        ["python", "step,", "0", "workers"],
        ["python", "step,", "1", "workers"],
    ]


def _store_of_two_arrays(path):
    """40 rows in chunks of 8: ``x`` (40 x 3) and ``y`` (40,), written with zarr's defaults (Zarr v3 keys)."""
    import zarr

    group = zarr.open_group(str(path), mode="w")
    group.create_array("x", shape=(40, 3), chunks=(8, 3), dtype="float32")[:] = np.arange(120).reshape(40, 3)
    group.create_array("y", shape=(40,), chunks=(8,), dtype="int64")[:] = np.arange(40)
    return path


def test_chunk_reads_counts_chunks_read_not_metadata(tmp_path):
    reads = ChunkReads(_store_of_two_arrays(tmp_path / "two.zarr"))
    x, y = reads.group["x"], reads.group["y"]
    assert reads.take() == 0  # opening the group and its arrays reads metadata only
    assert x[5].tolist() == [15, 16, 17]
    assert reads.take() == 1  # one row: its whole chunk
    x[8:16]
    y[8:16]
    assert reads.take() == 2  # a whole chunk of each array: one read each
    x[4:12]
    assert reads.take() == 2  # rows across two chunks
    assert reads.take() == 0  # take() counts afresh


def test_chunk_reads_opens_the_store_read_only(tmp_path):
    reads = ChunkReads(_store_of_two_arrays(tmp_path / "two.zarr"))
    with pytest.raises(Exception, match="read.only|read-only"):
        reads.group["y"][0] = -1


def _live_descendants() -> list[int]:
    """This process's descendants that have not exited (zombies, exited but not yet reaped, left out)."""
    import os

    from zarrtorch.course.memory import descendants

    def running(pid):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
        except OSError:
            return False

    return [pid for pid in descendants(os.getpid()) if running(pid)]


def _small_store(tmp_path):
    from zarrtorch import prepare_zarr

    x = np.random.default_rng(0).normal(size=(400, 4, 8)).astype(np.float32)
    return prepare_zarr({"x": x}, tmp_path / "s.zarr", chunk_rows=20, progress=False)


def test_a_loader_stopped_early_has_no_workers_left_when_measure_loader_returns(tmp_path):
    """Lesson 04 on a hub: a ZarrDataLoader measured for part of an epoch kept its 2 workers alive after
    measure_loader returned, beside the next loader's (up to 6 forked workers at once in one kernel)."""
    import zarrtorch as zt

    store = _small_store(tmp_path)
    before = set(_live_descendants())  # a server or forkserver an earlier test of this process left running
    stats = measure_loader(
        lambda: zt.ZarrDataLoader(zt.ZarrIterableDataset(store), batch_size=4, num_workers=2), max_batches=3
    )
    assert stats["batches"] == 3 and stats["workers_seen"] == 2
    assert set(_live_descendants()) <= before


def test_paced_run_of_a_loader_it_builds_ends_its_persistent_workers(tmp_path):
    """The workers proxy runs persistent workers (an epoch's end must not restart them): given a factory, paced_run
    ends them before it returns, so that they do not stay alive beside the next cell's loaders."""
    import zarrtorch as zt
    from zarrtorch.course.measure import paced_run, sleeping_step

    store = _small_store(tmp_path)

    def loader():
        return zt.ZarrDataLoader(zt.ZarrIterableDataset(store), batch_size=4, num_workers=2, persistent_workers=True)

    before = set(_live_descendants())  # a server or forkserver an earlier test of this process left running
    run = paced_run(loader, sleeping_step, 0.0, batches=150)  # 150 batches: more than an epoch's 100
    assert run["batches"] == 150
    assert set(_live_descendants()) <= before
