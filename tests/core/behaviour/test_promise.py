"""The loader's promise under calls made in another order and under torchrun's environment: every row once,
equal batches, nothing invented, nothing stuck. One test per way it once broke (each seen to fail before
its fix); damaged chunks are in test_damaged_chunks.py, the random call sequences in test_model.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import warnings
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from preloaded import Rank, end_still_running  # noqa: I001  (tests/core/behaviour is on sys.path under pytest)

from zarrtorch import ChunkReadError, ReadOptions, ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch._read.fetch import RetryPolicy
from zarrtorch._util.process import TopologyUnknown
from zarrtorch._workers import ring
from zarrtorch.course.servers import HttpStoreServer

ROWS, CHUNK, BATCH = 400, 10, 8


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("promise") / "s.zarr"
    prepare_zarr({"x": np.arange(ROWS * 4, dtype=np.float32).reshape(ROWS, 4)}, path, chunk_rows=CHUNK, progress=False)
    return path


@pytest.fixture()
def no_torchrun_env(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def rows_of(loader) -> np.ndarray:
    batches = [b["index"].numpy() for b in loader]
    return np.concatenate(batches) if batches else np.zeros(0, np.int64)


def with_deadline(fn, seconds: float):
    """``fn()``'s result, or a test failure if it takes longer than ``seconds`` (it runs in a thread)."""
    out: list = []

    def run():
        try:
            out.append(("ok", fn()))
        except BaseException as exc:  # handed to the test
            out.append(("error", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still running after {seconds} s: stuck")
    kind, value = out[0]
    if kind == "error":
        raise value
    return value


# 1 -------------------------------------------------------------------------------------------------------
def test_a_state_from_another_topology_then_a_new_epoch_reads_every_row(store, no_torchrun_env):
    """A state saved on 4 ranks, loaded where no process group exists, then ``set_epoch(1)``: the new epoch
    is whole (it once yielded 40 of 400 rows while ``len()`` said 50 batches)."""
    ds = ZarrIterableDataset(store, return_index=True)
    saving = ZarrDataLoader(ds, batch_size=BATCH, drop_last=True, rank=0, world_size=4)
    it = iter(saving)
    for _ in range(5):
        next(it)
    state = saving.state_dict()
    loader = ZarrDataLoader(ZarrIterableDataset(store, return_index=True), batch_size=BATCH, drop_last=True)
    loader.load_state_dict(state)
    loader.set_epoch(1)
    assert len(loader) == ROWS // BATCH
    rows = rows_of(loader)
    assert len(rows) == ROWS and len(np.unique(rows)) == ROWS


def test_a_state_kept_until_the_rank_is_known_is_dropped_by_another_epoch(store, no_torchrun_env):
    """Where the rank cannot be known yet (``WORLD_SIZE`` without ``RANK``), the state waits; ``set_epoch``
    of another epoch drops it, and the epoch is whole on the rank known by then."""
    ds = ZarrIterableDataset(store, return_index=True)
    saving = ZarrDataLoader(ds, batch_size=BATCH, drop_last=True, rank=1, world_size=2)
    it = iter(saving)
    next(it)
    state = saving.state_dict()
    no_torchrun_env.setenv("WORLD_SIZE", "2")
    loader = ZarrDataLoader(ZarrIterableDataset(store, return_index=True), batch_size=BATCH, drop_last=True)
    loader.load_state_dict(state)
    with pytest.raises(TopologyUnknown, match="RANK is not"):
        len(loader)
    loader.set_epoch(3)
    no_torchrun_env.setenv("RANK", "1")
    expected = np.concatenate(ds.batch_row_ids(epoch=3, rank=1, world_size=2, batch_size=BATCH, drop_last=True))
    np.testing.assert_array_equal(rows_of(loader), expected)


# 2 -------------------------------------------------------------------------------------------------------
def test_torchrun_environment_before_the_process_group(store, no_torchrun_env):
    """``RANK``/``WORLD_SIZE`` set as torchrun sets them, no process group yet: each rank reads its own share
    (every rank once read all 400 rows)."""
    seen, lengths = [], []
    for rank in range(4):
        no_torchrun_env.setenv("RANK", str(rank))
        no_torchrun_env.setenv("WORLD_SIZE", "4")
        loader = ZarrDataLoader(ZarrIterableDataset(store, return_index=True), batch_size=BATCH)
        assert loader.topology() == (rank, 4)
        lengths.append(len(loader))
        seen.append(rows_of(loader))
    everything = np.concatenate(seen)
    assert len(set(lengths)) == 1 and lengths[0] == ROWS // 4 // BATCH + 1
    assert len(everything) == ROWS and set(everything.tolist()) == set(range(ROWS))


def test_slurm_tasks_without_a_rank_are_warned_about_once(store, no_torchrun_env):
    """Slurm's SLURM_NTASKS=2 with no RANK and no process group: each task reads every row as rank 0 of 1 (Slurm's
    own variables are not taken for ranks: a sweep's independent tasks would miss rows). It was silent (found by a
    break-test helper); it is a warning with the fix, once per process."""
    from zarrtorch._util import process

    no_torchrun_env.setenv("SLURM_NTASKS", "2")
    no_torchrun_env.setenv("SLURM_PROCID", "1")
    no_torchrun_env.setattr(process, "_WARNED", {})
    loader = ZarrDataLoader(ZarrIterableDataset(store), batch_size=BATCH)
    with pytest.warns(UserWarning, match=r"SLURM_NTASKS=2 .*rank 0 of 1.*export RANK=\$SLURM_PROCID"):
        assert loader.topology() == (0, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        len(loader)  # said once


@pytest.mark.parametrize(
    "env,needle",
    [
        ({"WORLD_SIZE": "4"}, "RANK is not"),
        ({"RANK": "1"}, "set both"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "outside"),
        ({"RANK": "x", "WORLD_SIZE": "4"}, "not integers"),
    ],
)
def test_an_environment_that_does_not_say_the_rank_is_refused(store, no_torchrun_env, env, needle):
    for key, value in env.items():
        no_torchrun_env.setenv(key, value)
    loader = ZarrDataLoader(ZarrIterableDataset(store), batch_size=BATCH)
    for attempt in (len, iter):
        with pytest.raises(TopologyUnknown, match=needle) as err:
            attempt(loader)
        assert "rank= and world_size=" in str(err.value) or "environment" in str(err.value)


# 4 -------------------------------------------------------------------------------------------------------
def test_collate_fn_is_refused_at_construction_pointing_to_transform(store):
    """A ``collate_fn`` once received the ring's internal reference instead of the batch, in the worker."""

    def to_float(batch):
        return {k: v.float() for k, v in batch.items()}

    with pytest.raises(ValueError, match=r"collate_fn= is not used .*transform="):
        ZarrDataLoader(ZarrIterableDataset(store), batch_size=BATCH, num_workers=2, collate_fn=to_float)
    ds = ZarrIterableDataset(store, transform=to_float)
    batch = next(iter(ZarrDataLoader(ds, batch_size=BATCH, num_workers=2)))
    assert batch["x"].dtype == torch.float32 and batch["x"].shape == (BATCH, 4)


# 5 -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_workers,work_ahead", [(0, 0), (0, 2), (2, 0), (2, 2)])
def test_a_superseded_iterator_says_so_instead_of_hanging(store, num_workers, work_ahead):
    loader = ZarrDataLoader(
        ZarrIterableDataset(store), batch_size=BATCH, num_workers=num_workers, work_ahead=work_ahead
    )
    first = iter(loader)
    next(first)
    second = iter(loader)
    next(second)
    with pytest.raises(RuntimeError, match="superseded"):
        with_deadline(lambda: sum(1 for _ in first), 30)
    assert with_deadline(lambda: 1 + sum(1 for _ in second), 60) == len(loader)


# 6 -------------------------------------------------------------------------------------------------------
def test_every_console_script_resolves():
    scripts = [ep for ep in entry_points(group="console_scripts") if ep.value.startswith("zarrtorch")]
    assert scripts, "zarrtorch installs no console script"
    for ep in scripts:
        assert callable(ep.load()), ep


def test_audit_and_roofline_run_without_the_course_extras(store, tmp_path):
    """The core's command line needs numpy, zarr and torch only: xarray, dask, Lightning, matplotlib are
    made unimportable, and ``audit`` still runs; a course command says which extra it needs."""
    code = f"""
import sys
for name in ("xarray", "dask", "lightning", "matplotlib", "h5py", "tqdm"):
    sys.modules[name] = None
from zarrtorch.cli import main
assert main(["audit", {str(store)!r}, "--world-size", "3", "--batch-size", "8"]) == 0
assert main(["roofline", {str(store)!r}, "--cpus", "1", "--chunks", "2", "--batches", "4"]) == 0
try:
    main(["make-data", "--size", "tiny"])
except SystemExit as exc:
    print("REFUSED", exc)
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "OK: every rank gets the same batches" in run.stdout
    assert "REFUSED" in run.stdout and "zarrtorch[course]" in run.stdout


# 7 -------------------------------------------------------------------------------------------------------
SHARD_CHUNKS = 4  # inner chunks per shard in the sharded store


@pytest.fixture(scope="module")
def through_zarr(tmp_path_factory):
    """Stores of other layouts than prepare_zarr's: Blosc, Zarr v3 shards (of zstd chunks) and Zarr v2 (Blosc),
    decoded directly (zarrtorch._read.fastpath), and two read through zarr's codecs (F order, a crc32c codec)."""
    root = tmp_path_factory.mktemp("through-zarr")
    data = np.arange(ROWS * 4, dtype=np.float32).reshape(ROWS, 4)
    layouts = {
        "blosc": dict(zarr_format=3, chunks=(CHUNK, 4), compressors=[zarr.codecs.BloscCodec()]),
        "sharded": dict(zarr_format=3, chunks=(CHUNK, 4), shards=(CHUNK * SHARD_CHUNKS, 4)),
        "v2": dict(zarr_format=2, chunks=(CHUNK, 4)),
        "v2-order-F": dict(zarr_format=2, chunks=(CHUNK, 4), order="F"),
        "crc32c": dict(
            zarr_format=3, chunks=(CHUNK, 4), compressors=[zarr.codecs.ZstdCodec(), zarr.codecs.Crc32cCodec()]
        ),
    }
    for name, kwargs in layouts.items():
        fmt = kwargs.pop("zarr_format")
        g = zarr.open_group(str(root / f"{name}.zarr"), mode="w", zarr_format=fmt)
        g.create_array("x", shape=(ROWS, 4), dtype="f4", **kwargs)[:] = data
        zarr.consolidate_metadata(str(root / f"{name}.zarr"))  # HTTP cannot list a directory
    return root


METADATA = ("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata")


@pytest.mark.parametrize("layout", ["blosc", "sharded", "v2", "v2-order-F", "crc32c"])
def test_reads_through_zarr_have_a_deadline_and_one_request_per_chunk(through_zarr, layout):
    """An array of another layout than prepare_zarr's over HTTP, decoded directly or through zarr's codecs: one
    request per chunk or shard (an existence check once doubled them; a shard read whole is one request, its
    index and inner chunks cut from it), and a server that stops answering ends in a ChunkReadError after the
    retries (it once waited forever)."""
    policy = RetryPolicy(timeout_s=1.0, retries=1, backoff_s=0.05)
    read = ReadOptions(retry=policy)
    with HttpStoreServer(through_zarr) as server:
        ds = ZarrIterableDataset(f"{server.url}/{layout}.zarr", shuffle=False, return_index=True, read=read)
        np.testing.assert_array_equal(rows_of(ZarrDataLoader(ds, batch_size=BATCH)), np.arange(ROWS))
        data_requests = {k: n for k, n in server.requests.items() if not k.endswith(METADATA)}
        objects = ROWS // CHUNK // (SHARD_CHUNKS if layout == "sharded" else 1)
        assert len(data_requests) == objects and set(data_requests.values()) == {1}, data_requests
        server.hang()
        start = time.monotonic()
        with pytest.raises(ChunkReadError, match=r"(?s)cannot read chunk \d+ .*2 attempts failed \(timeout 1 s"):
            with_deadline(lambda: rows_of(ZarrDataLoader(ds, batch_size=BATCH)), 60)
        assert time.monotonic() - start < 30
        server.release.set()


# 8 -------------------------------------------------------------------------------------------------------
def test_shared_memory_is_taken_at_the_first_epoch_and_a_small_dev_shm_is_named(store, monkeypatch):
    loader = ZarrDataLoader(ZarrIterableDataset(store, return_index=True), batch_size=BATCH, num_workers=2)
    assert loader.job.ring is not None and loader.job.ring.data is None, "the ring took shared memory at construction"
    monkeypatch.setattr(ring, "shm_free_bytes", lambda path=ring.SHM: loader.job.ring.nbytes // 2)
    with pytest.raises(RuntimeError, match=r"(?s)needs \d+ MiB of shared memory in /dev/shm.*transport='queue'"):
        iter(loader)
    queue = ZarrDataLoader(
        ZarrIterableDataset(store, return_index=True), batch_size=BATCH, num_workers=2, transport="queue"
    )
    assert len(rows_of(queue)) == ROWS
    monkeypatch.undo()
    assert len(rows_of(loader)) == ROWS  # the same loader works once there is room
    assert loader.job.ring.data is not None


# 9 -------------------------------------------------------------------------------------------------------
def add_noise(batch):
    return {"x": batch["x"] + torch.rand(1)}


def test_a_random_transform_draws_in_the_consumers_order_with_no_workers(store):
    """With ``num_workers=0`` the transform once ran in the work-ahead thread, drawing from torch's global
    generator while the training step did: the same seed gave other numbers than without work-ahead."""

    def train(work_ahead):
        torch.manual_seed(0)
        loader = ZarrDataLoader(
            ZarrIterableDataset(store, transform=add_noise), batch_size=BATCH, work_ahead=work_ahead
        )
        return [float(b["x"][0, 0]) + float(torch.rand(1)) for b in loader]

    assert train(2) == train(0)


# 10 ------------------------------------------------------------------------------------------------------
def test_a_checkpoint_carries_the_plans_fingerprint(store):
    ds = ZarrIterableDataset(store, seed=3)
    loader = ZarrDataLoader(ds, batch_size=BATCH)
    next(iter(loader))
    state = loader.state_dict()
    assert state["plan_version"] >= 2 and len(state["fingerprint"]) == 16
    other = ZarrDataLoader(ZarrIterableDataset(store, seed=3), batch_size=BATCH)
    with pytest.raises(ValueError, match="another zarrtorch or NumPy"):
        other.load_state_dict({**state, "fingerprint": "0" * 16})
    with pytest.raises(ValueError, match="plan version: saved 2, now 4: that zarrtorch's plan gives other batches"):
        other.load_state_dict({**state, "plan_version": 2, "fingerprint": "2885dbb67d7b5e03"})  # saved by 0.2
    old = {k: v for k, v in state.items() if k not in ("plan_version", "fingerprint")}  # as version 1 saved
    with pytest.raises(ValueError, match="not a state of this zarrtorch's ZarrDataLoader.*start the epoch afresh"):
        other.load_state_dict(old)
    assert other.state_dict()["batches_seen"] == 0  # refused: nothing changed
    other.load_state_dict(state)
    assert other.state_dict()["batches_seen"] == 1


WORKER = """
import os, sys
from datetime import timedelta
import torch.distributed as dist
from zarrtorch import ZarrDataLoader, ZarrIterableDataset
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
seeds = [int(s) for s in sys.argv[2].split(",")]
loader = ZarrDataLoader(ZarrIterableDataset(sys.argv[1], seed=seeds[rank]), batch_size=8)
try:
    n = sum(1 for _ in loader)
    print("OK", n)
except RuntimeError as exc:
    print("REFUSED", exc)
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("seeds", ["1,1", "1,2"])
def test_ranks_that_computed_different_plans_are_named(store, seeds):
    """Two gloo ranks; with another seed on rank 1 both refuse the epoch and name the ranks (each once
    silently read its own, overlapping, rows)."""
    port = free_port()
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "OMP_NUM_THREADS": "1",
        }
        procs.append(Rank([store, seeds], env, code=WORKER, log_dir=Path(store).parent))  # torch imported once
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        end_still_running(procs)
    for out in outs:
        if seeds == "1,1":
            assert f"OK {-(-ROWS // 2 // 8)}" in out, out[-2000:]
        else:
            assert "REFUSED the ranks computed different plans" in out, out[-2000:]
            assert "rank(s) [0]" in out and "rank(s) [1]" in out


def test_state_json_round_trip(store, tmp_path):
    """A state written as JSON (as the course's CLI and audit read it) loads back unchanged."""
    loader = ZarrDataLoader(ZarrIterableDataset(store), batch_size=BATCH)
    next(iter(loader))
    path = Path(tmp_path) / "state.json"
    path.write_text(json.dumps(loader.state_dict()))
    again = ZarrDataLoader(ZarrIterableDataset(store), batch_size=BATCH)
    again.load_state_dict(json.loads(path.read_text()))
    assert again.state_dict() == loader.state_dict()


def test_a_negative_position_is_refused_not_resumed(store):
    """Found by the model-based fuzz run: a consumer that said it had trained -1 batches (lag before the first
    batch) produced a state with batches_seen=-1, and a loader resumed from it read nothing and gave a negative
    len(). Both ends now refuse it."""
    loader = ZarrDataLoader(ZarrIterableDataset(store, seed=3), batch_size=BATCH)
    iter(loader)
    loader.consumed_batches = lambda: -1
    with pytest.raises(ValueError, match=r"consumed_batches\(\) said -1 batches"):
        loader.state_dict()
    loader.consumed_batches = None
    state = loader.state_dict()
    other = ZarrDataLoader(ZarrIterableDataset(store, seed=3), batch_size=BATCH)
    with pytest.raises(ValueError, match="not a position a loader can be at"):
        other.load_state_dict({**state, "batches_seen": -1})
    with pytest.raises(ValueError, match="not a position a loader can be at"):
        other.load_state_dict({**state, "history": [[2, 0, -3]]})
    assert len(other) == len(loader)


@pytest.mark.parametrize(
    ("batch_order", "shard_chunks"), [("worker", None), ("rank", None), ("worker", 2)], ids=["chunks", "rank", "shards"]
)
def test_a_local_store_rewritten_between_two_epochs_is_refused_at_the_next_epoch_not_read_half_old(
    tmp_path, batch_order, shard_chunks
):
    """prepare_zarr wrote a local store again (other values) between two epochs of one loader: the second epoch's
    first pieces, read early as the first epoch ended, held the old values and the rest the new ones (a sharded
    store: all of them old), silently. The next epoch is refused by name, as a store read through the chunk cache
    is; a new dataset reads the new store."""
    path = tmp_path / "s.zarr"

    def write(scale: int) -> None:
        y = scale * np.arange(120, dtype=np.int64)
        prepare_zarr({"y": y}, path, chunk_rows=10, shard_chunks=shard_chunks, overwrite=True, progress=False)

    write(3)
    loader = ZarrDataLoader(ZarrIterableDataset(path, seed=1), batch_size=8, batch_order=batch_order)
    assert sum(len(b["y"]) for b in loader) == 120
    write(5)
    loader.set_epoch(1)
    with pytest.raises(ValueError, match="rewritten since this dataset opened it"):
        next(iter(loader))
    for batch in ZarrDataLoader(ZarrIterableDataset(path, return_index=True), batch_size=8):
        np.testing.assert_array_equal(batch["y"].numpy(), 5 * batch["index"].numpy())


@pytest.mark.parametrize(
    "rewritten",
    [{"y": 5 * np.arange(115, dtype=np.int64)}, {"y": 5 * np.arange(120, dtype=np.float64)}],
    ids=["fewer-rows", "float64"],
)
def test_a_local_store_rewritten_before_its_first_epoch_is_refused_not_read_with_the_old_shape_and_dtype(
    tmp_path, rewritten
):
    """breaks6: prepare_zarr wrote a local store again after a dataset opened it and before its first epoch, with
    115 rows instead of 120 (the epoch yielded 5 rows of zeros the store does not hold) or float64 instead of int64
    (every row's float bytes yielded as int64): the first epoch was not checked, and read the new chunk files with
    the dataset's old shape and dtype. A local store answers at once: its first epoch is checked too."""
    path = tmp_path / "s.zarr"
    prepare_zarr({"y": 3 * np.arange(120, dtype=np.int64)}, path, chunk_rows=10, progress=False)
    loader = ZarrDataLoader(ZarrIterableDataset(path, seed=1), batch_size=8)
    prepare_zarr(rewritten, path, chunk_rows=10, overwrite=True, progress=False)
    with pytest.raises(ValueError, match="rewritten since this dataset opened it"):
        next(iter(loader))


@pytest.mark.parametrize("epochs_before", [0, 1], ids=["first-epoch", "later-epoch"])
@pytest.mark.parametrize(("workers", "work_ahead"), [(0, 0), (0, 2), (2, 0)])
def test_a_remote_store_rewritten_before_its_first_epoch_is_refused_not_read_with_the_old_dtype(
    tmp_path, workers, work_ahead, epochs_before
):
    """breaks6: prepare_zarr wrote a store served over HTTP again (float64 for int64) after a dataset opened it and
    before its first epoch: the epoch yielded the float64 bytes as int64 (119 of 120 rows), silently. The check runs
    beside the epoch's first reads and is taken before the first batch is handed out; the iterator then refuses to
    go on (its next batches were read with the old dtype too). The same before a later epoch, whose check runs
    beside its reads too since it stopped costing every later epoch a round trip before its first request."""
    root = tmp_path / "served"
    prepare_zarr({"y": 3 * np.arange(120, dtype=np.int64)}, root / "s.zarr", chunk_rows=10, progress=False)
    with HttpStoreServer(root) as server:
        ds = ZarrIterableDataset(f"{server.url}/s.zarr", seed=1)
        loader = ZarrDataLoader(ds, batch_size=8, num_workers=workers, work_ahead=work_ahead)
        for epoch in range(epochs_before):
            loader.set_epoch(epoch)
            assert sum(len(b["y"]) for b in loader) == 120
        loader.set_epoch(epochs_before)
        rewritten = {"y": 5 * np.arange(120, dtype=np.float64)}
        prepare_zarr(rewritten, root / "s.zarr", chunk_rows=10, overwrite=True, progress=False)
        it = iter(loader)
        with pytest.raises(ValueError, match="rewritten since this dataset opened it"):
            next(it)
        with pytest.raises(RuntimeError, match="refused its epoch"):
            next(it)
        with pytest.raises(ValueError, match="rewritten since this dataset opened it"):
            next(iter(loader))  # a new epoch of the same dataset is refused before its first batch


@pytest.mark.parametrize("epochs_before", [0, 1], ids=["first-epoch", "later-epoch"])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(
    "rewritten",
    [{"y": 5 * np.arange(120, dtype=np.int32)}, {"z": 5 * np.arange(120, dtype=np.int64)}],
    ids=["int32", "renamed"],
)
def test_a_remote_store_rewritten_so_its_first_chunk_fails_says_it_was_rewritten_not_damaged(
    tmp_path, rewritten, workers, epochs_before
):
    """breaks7: a store served over HTTP written again after a dataset opened it, as int32 for int64 (its chunks
    decode to half the bytes) or with its array renamed (every chunk the dataset reads is missing): the epoch's first
    chunk read failed before the check beside it was taken, and the error called the chunk damaged, or missing. The
    rewrite is the cause and what to fix: it is raised, from the chunk's error."""
    root = tmp_path / "served"
    prepare_zarr({"y": 3 * np.arange(120, dtype=np.int64)}, root / "s.zarr", chunk_rows=10, progress=False)
    with HttpStoreServer(root) as server:
        loader = ZarrDataLoader(ZarrIterableDataset(f"{server.url}/s.zarr", seed=1), batch_size=8, num_workers=workers)
        for epoch in range(epochs_before):  # a later epoch's check runs beside its reads as the first's does
            loader.set_epoch(epoch)
            assert sum(len(b["y"]) for b in loader) == 120
        loader.set_epoch(epochs_before)
        prepare_zarr(rewritten, root / "s.zarr", chunk_rows=10, overwrite=True, progress=False)
        it = iter(loader)
        with pytest.raises(ValueError, match="rewritten since this dataset opened it") as raised:
            for _ in it:
                pass
        assert isinstance(raised.value.__cause__, Exception), "the chunk's own error is kept as the cause"
        with pytest.raises(RuntimeError, match="refused its epoch"):
            next(it)


@pytest.mark.parametrize("remote", [False, True], ids=["local", "http"])
def test_a_store_kept_in_memory_rewritten_before_its_first_epoch_is_refused(tmp_path, remote):
    """breaks7: with keep_in_memory=True the store was never checked (the rows kept were taken for the data), but
    they are read from the store in the first epoch: prepare_zarr wrote it again (float64 for int64) after the
    dataset opened it, and the epoch yielded 119 of 120 rows as float bytes read as int64, then kept them for every
    later epoch, silently."""
    root = tmp_path / "served"
    prepare_zarr({"y": 3 * np.arange(120, dtype=np.int64)}, root / "s.zarr", chunk_rows=10, progress=False)
    with HttpStoreServer(root) as server:
        source = f"{server.url}/s.zarr" if remote else root / "s.zarr"
        loader = ZarrDataLoader(ZarrIterableDataset(source, seed=1, keep_in_memory=True), batch_size=8)
        prepare_zarr({"y": 5 * np.arange(120, dtype=np.float64)}, root / "s.zarr", chunk_rows=10, overwrite=True)
        with pytest.raises(ValueError, match="rewritten since this dataset opened it"):
            next(iter(loader))


def test_a_group_document_cut_short_once_at_the_store_check_is_fetched_again_and_twice_is_named(tmp_path):
    """breaks7: the answer for the group's zarr.json cut short once (a proxy cutting a response) at the first
    epoch's store check was a bare JSONDecodeError, not retried, and taken for a rewrite (the epoch refused). Cut
    once: fetched again, and the epoch streams every row; cut every time: an error naming the group's attributes
    and the check, not a rewrite."""
    from zarrtorch.course.servers import CUT_SHORT

    root = tmp_path / "served"
    prepare_zarr({"y": 3 * np.arange(120, dtype=np.int64)}, root / "s.zarr", chunk_rows=10, progress=False)
    for times in (1, 100):
        with HttpStoreServer(root) as server:
            loader = ZarrDataLoader(ZarrIterableDataset(f"{server.url}/s.zarr", seed=1), batch_size=8)
            opened = server.requests.get("s.zarr/zarr.json", 0)
            server.faults[r"s\.zarr/zarr\.json$"], server.fault_times = CUT_SHORT, opened + times
            if times == 1:
                values = np.concatenate([b["y"].numpy() for b in loader])
                assert sorted(values.tolist()) == (3 * np.arange(120)).tolist()
                continue
            with pytest.raises(ChunkReadError, match="cannot read the attributes of the group"):  # not a rewrite
                next(iter(loader))


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iterator_used_on_after_a_chunk_error_refuses_and_its_state_resumes_every_row(tmp_path, workers):
    """breaks7: a training loop that logs a failed chunk read and goes on: the next next() of the same iterator
    ended the epoch (StopIteration) after 8 (16 with 2 workers) of 400 rows, silently, as a normal end. It now
    refuses, naming the error before, and the loader's state resumes the epoch on a new loader with every row
    once."""
    root = tmp_path / "served"
    prepare_zarr({"y": 3 * np.arange(400, dtype=np.int64)}, root / "s.zarr", chunk_rows=10, progress=False)
    with HttpStoreServer(root, faults={r"y/c/22$": 503}, fault_times=1) as server:
        read = ReadOptions(retry=RetryPolicy(timeout_s=5, retries=0))
        url = f"{server.url}/s.zarr"
        loader = ZarrDataLoader(ZarrIterableDataset(url, seed=1, read=read), batch_size=8, num_workers=workers)
        it, values = iter(loader), []
        with pytest.raises(ChunkReadError):
            for batch in it:
                values += batch["y"].tolist()
        with pytest.raises(RuntimeError, match="stopped at an error"):
            next(it)
        state = loader.state_dict()
        again = ZarrDataLoader(ZarrIterableDataset(url, seed=1, read=read), batch_size=8, num_workers=workers)
        again.load_state_dict(state)
        values += [v for batch in again for v in batch["y"].tolist()]
    assert sorted(values) == (3 * np.arange(400)).tolist()


def test_a_remote_store_unchanged_streams_its_first_epoch_after_the_check_beside_its_reads(tmp_path):
    """The first epoch's check, run beside the reads, lets an unchanged remote store stream every row once, and it
    is made once: the group's metadata document is asked for once in that epoch."""
    root = tmp_path / "served"
    prepare_zarr({"y": 3 * np.arange(120, dtype=np.int64)}, root / "s.zarr", chunk_rows=10, progress=False)
    with HttpStoreServer(root) as server:
        ds = ZarrIterableDataset(f"{server.url}/s.zarr", seed=1)
        loader = ZarrDataLoader(ds, batch_size=8)
        before = server.requests.get("s.zarr/zarr.json", 0)
        values = np.concatenate([b["y"].numpy() for b in loader])
        assert sorted(values.tolist()) == (3 * np.arange(120)).tolist()
        assert server.requests.get("s.zarr/zarr.json", 0) - before == 1


@pytest.mark.parametrize("work_ahead", [0, 2])
def test_an_iterator_interrupted_inside_next_refuses_to_go_on_and_its_state_resumes_every_row(store, work_ahead):
    """breaks6: a Ctrl-C while the dataset's transform ran inside next(), and the iterator used on after the
    KeyboardInterrupt (a notebook cell run again): with work_ahead=0 the interrupt ended the epoch's generator and
    the epoch stopped at 24 of 400 rows; with work_ahead=2 (the transform runs in the consumer) the batch taken was
    lost, 392 of 400 rows; both silently. The iterator now refuses to go on, and its state resumes every row."""
    calls = {"n": 0}

    def interrupted_at_the_fourth_batch(batch):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return batch

    ds = ZarrIterableDataset(store, seed=2, return_index=True, transform=interrupted_at_the_fourth_batch)
    loader = ZarrDataLoader(ds, batch_size=BATCH, work_ahead=work_ahead)
    it, first = iter(loader), []
    with pytest.raises(KeyboardInterrupt):
        while True:
            first.append(next(it)["index"].numpy())
    with pytest.raises(RuntimeError, match="interrupted"):
        next(it)
    again = ZarrDataLoader(ZarrIterableDataset(store, seed=2, return_index=True), batch_size=BATCH)
    again.load_state_dict(loader.state_dict())
    rows = np.concatenate(first + [b["index"].numpy() for b in again])
    assert sorted(rows.tolist()) == list(range(ROWS))
