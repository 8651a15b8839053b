"""Arguments grouped and named for their users: reading options in one ReadOptions object, every loader
argument after batch_size by name, names that say what they hold."""

from __future__ import annotations

import numpy as np
import pytest

from zarrtorch import ReadOptions, ReadPlan, RetryPolicy, ZarrDataLoader, ZarrIterableDataset, prepare_zarr


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("options") / "s.zarr"
    prepare_zarr({"x": np.arange(64, dtype=np.float32), "y": np.arange(64)}, path, chunk_rows=8, progress=False)
    return path


def test_reading_options_in_one_object(store):
    read = ReadOptions(decode_threads=2, requests_in_flight=5, retry=RetryPolicy(timeout_s=3), missing_chunks="fill")
    ds = ZarrIterableDataset(store, variables=["x"], read=read)
    assert list(ds.arrays) == ["x"] and ds.read is read
    plan = ReadPlan.of(ds, 0)
    assert plan.chunks_ahead == 5 and plan.decode_threads == 2
    with pytest.raises(ValueError, match="decode_threads must be an integer >= 1"):
        ReadOptions(decode_threads=0)
    with pytest.raises(TypeError, match="retry must be a zarrtorch.RetryPolicy"):
        ReadOptions(retry=30)


@pytest.mark.parametrize("old", ["decode_threads", "requests_in_flight", "missing_chunks", "arrays", "cache"])
def test_spellings_of_before_0_1_are_refused_by_name(store, old):
    """Settings of the dataset that moved into ReadOptions or were renamed (variables=, keep_in_memory=) are
    refused naming the argument: no shim keeps them before 1.0."""
    with pytest.raises(TypeError, match=rf"unexpected keyword argument\(s\) \['{old}'\]"):
        ZarrIterableDataset(store, **{old: 1})


def test_an_unknown_argument_is_named(store):
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['shuffle_chunks'\]"):
        ZarrIterableDataset(store, shuffle_chunks=True)


def test_loader_arguments_after_batch_size_by_name(store):
    """``ZarrDataLoader(ds, 32, True)`` would set drop_last where DataLoader's third positional argument is
    shuffle: every argument after batch_size is taken by name."""
    ds = ZarrIterableDataset(store)
    with pytest.raises(TypeError, match="positional argument"):
        ZarrDataLoader(ds, 24, True)
    assert ZarrDataLoader(ds, 24, drop_last=True).spec.drop_last


def test_the_spec_is_made_once_and_handed_down(store):
    ds = ZarrIterableDataset(store, seed=3, buffer_chunks=2)
    loader = ZarrDataLoader(ds, batch_size=8, drop_last=True)
    assert loader.job.spec is loader.spec == ds.spec(8, True)
    assert loader.state_dict()["fingerprint"] == loader.spec.fingerprint()


def test_reading_options_take_their_fields_by_name():
    """``ReadOptions(4, 64)`` gave decode threads and requests in flight by position: an option added before
    them would have changed what such a call means, silently."""
    with pytest.raises(TypeError, match="positional"):
        ReadOptions(4, 64)
    assert ReadOptions(decode_threads=4, requests_in_flight=64).requests_in_flight == 64
