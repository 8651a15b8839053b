"""Arguments are taken as what they say or refused by name at construction: Python's own conversions (``int(4.5)``,
``bool("no")``, ``list("t2m")``) ran other settings than the user asked for, with no error anywhere, or failed
later inside NumPy or a worker without naming the argument."""

from __future__ import annotations

import math

import numpy as np
import pytest

from zarrtorch import RetryPolicy, ZarrDataLoader, ZarrIterableDataset, prepare_zarr

ROWS, CHUNK = 64, 8


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("args") / "s.zarr"
    data = {"t2m": np.arange(ROWS, dtype=np.float32), "msl": np.arange(ROWS, dtype=np.float32)}
    prepare_zarr(data, path, chunk_rows=CHUNK, progress=False)
    return path


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(row_range=(4.5, 8.9)), r"row_range\[0\] must be a whole number"),
        (dict(row_range=(8, 16.5)), r"row_range\[1\] must be a whole number"),
        (dict(row_range=8), r"row_range must be \(start, stop\)"),
        (dict(shuffle="no"), "shuffle must be True or False, got 'no'"),
        (dict(return_index=1), "return_index must be True or False"),
        (dict(return_padding="yes"), "return_padding must be True or False"),
        (dict(keep_in_memory="no"), "keep_in_memory must be True or False"),
        (dict(variables="t2m"), r"variables must be a list of array names .*got 't2m'"),
        (dict(stack={"x": "t2m"}), r"stack\['x'\] must be a list of array names"),
        (dict(stack=["t2m"]), r"stack must be a dict"),
        (dict(seed=-1), r"seed .* must be a whole number >= 0"),
        (dict(seed=2**64), r"seed .* must be a whole number >= 0 \(and below 2\*\*63\)"),
        (dict(seed=1.5), r"seed .* must be a whole number"),
        (dict(buffer_chunks=True), r"buffer_chunks .* must be a whole number"),
    ],
)
def test_dataset_arguments_are_refused_by_name(store, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        ZarrIterableDataset(store, **kwargs)


def test_the_read_options_and_the_transform_are_checked_at_construction(store):
    with pytest.raises(TypeError, match=r"read must be a zarrtorch.ReadOptions\(...\), got dict"):
        ZarrIterableDataset(store, read={"decode_threads": 2})
    with pytest.raises(TypeError, match="transform must be a function batch dict -> batch dict"):
        ZarrIterableDataset(store, transform=5)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(rank=1.7, world_size=2), r"rank must be a whole number in \[0, 2\), got 1.7"),
        (dict(rank=1, world_size=2.5), r"world_size must be a whole number >= 1, got 2.5"),
        (dict(drop_last="no"), "drop_last must be True or False, got 'no'"),
        (dict(num_workers=1.5), "num_workers must be a whole number >= 0"),
        (dict(work_ahead=-1), r"work_ahead .* must be a whole number >= 0"),
        (dict(check_ranks="off"), "check_ranks must be True or False"),
    ],
)
def test_loader_arguments_are_refused_by_name(store, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        ZarrDataLoader(ZarrIterableDataset(store), batch_size=4, **kwargs)


def test_numpy_integers_are_whole_numbers(store):
    ds = ZarrIterableDataset(store, seed=np.int64(3), buffer_chunks=np.int32(2), row_range=(np.int64(8), 64.0))
    loader = ZarrDataLoader(ds, batch_size=np.int64(4), num_workers=np.int64(0), rank=np.int64(0), world_size=2)
    assert loader.spec.batch_size == 4 and type(loader.spec.batch_size) is int
    assert len(loader) == (ROWS - 8) // (2 * 4)
    loader.set_epoch(np.int64(2))
    assert loader.epoch == 2


@pytest.mark.parametrize("epoch", [-1, 2**64, 1.5, "3", None])
def test_set_epoch_refuses_what_is_not_an_epoch(store, epoch):
    loader = ZarrDataLoader(ZarrIterableDataset(store), batch_size=4)
    with pytest.raises(ValueError, match="epoch must be a whole number >= 0"):
        loader.set_epoch(epoch)
    assert loader.epoch == 0


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(retries=1.5), r"RetryPolicy\(retries=...\) must be a whole number >= 0"),
        (dict(retries=-1), r"RetryPolicy\(retries=...\) must be a whole number >= 0"),
        (dict(timeout_s=math.nan), r"RetryPolicy\(timeout_s=...\) must be a finite number > 0"),
        (dict(timeout_s=math.inf), r"RetryPolicy\(timeout_s=...\) must be a finite number > 0"),
        (dict(timeout_s=0), r"RetryPolicy\(timeout_s=...\) must be a finite number > 0"),
        (dict(backoff_s=-0.1), r"RetryPolicy\(backoff_s=...\) must be a finite number >= 0"),
        (dict(backoff_s=True), r"RetryPolicy\(backoff_s=...\) must be a finite number >= 0"),
    ],
)
def test_retry_policy_values_are_checked(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        RetryPolicy(**kwargs)


def test_without_shuffle_a_state_resumes_whatever_the_seed_and_buffer(store):
    """Without shuffle neither the seed nor the buffer changes a batch, yet a state saved with
    ``buffer_chunks=8`` was refused by a loader with ``buffer_chunks=2``."""
    saved = ZarrDataLoader(ZarrIterableDataset(store, shuffle=False, buffer_chunks=8, seed=1), batch_size=4)
    it = iter(saved)
    first = [next(it)["t2m"] for _ in range(3)]
    state = saved.state_dict()
    rest = [b["t2m"] for b in it]
    resumed = ZarrDataLoader(ZarrIterableDataset(store, shuffle=False, buffer_chunks=2, seed=7), batch_size=4)
    resumed.load_state_dict(state)
    got = [b["t2m"] for b in resumed]
    assert [t.tolist() for t in got] == [t.tolist() for t in rest]
    assert np.concatenate(first + got).tolist() == list(range(ROWS))
    with pytest.raises(ValueError, match="buffer_chunks: saved 8, now 2"):  # with shuffle, the buffer counts
        shuffled = ZarrDataLoader(ZarrIterableDataset(store, buffer_chunks=8), batch_size=4)
        other = ZarrDataLoader(ZarrIterableDataset(store, buffer_chunks=2), batch_size=4)
        other.load_state_dict(shuffled.state_dict())
