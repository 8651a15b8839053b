"""Arguments grouped and named for their users: reading options in one ReadOptions object, every loader
argument after batch_size by name, names that say what they hold. The spellings of zarrtorch 0.1 still work,
for one release, each with a DeprecationWarning that gives the new one."""

from __future__ import annotations

import numpy as np
import pytest

from zarrtorch import ReadOptions, RetryPolicy, ZarrDataLoader, ZarrIterableDataset, prepare_zarr


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("options") / "s.zarr"
    prepare_zarr({"x": np.arange(64, dtype=np.float32), "y": np.arange(64)}, path, chunk_rows=8, progress=False)
    return path


def test_reading_options_in_one_object(store):
    read = ReadOptions(decode_threads=2, requests_in_flight=5, retry=RetryPolicy(timeout_s=3), missing_chunks="fill")
    ds = ZarrIterableDataset(store, variables=["x"], read=read)
    assert list(ds.arrays) == ["x"] and ds.read is read
    assert ds.in_flight(ds.decode_threads(0)) == 5 and ds.decode_threads(0) == 2
    with pytest.raises(ValueError, match="decode_threads must be an integer >= 1"):
        ReadOptions(decode_threads=0)
    with pytest.raises(TypeError, match="retry must be a zarrtorch.RetryPolicy"):
        ReadOptions(retry=30)


@pytest.mark.parametrize(
    "old,check",
    [
        (dict(decode_threads=3), lambda ds: ds.read.decode_threads == 3),
        (dict(requests_in_flight=4, missing_chunks="fill"), lambda ds: ds.read.missing_chunks == "fill"),
        (dict(arrays=["y"]), lambda ds: list(ds.arrays) == ["y"]),
        (dict(cache=True), lambda ds: ds.keep_in_memory),
    ],
)
def test_old_spellings_still_work_with_a_warning_naming_the_new_one(store, old, check):
    with pytest.warns(DeprecationWarning, match=r"ReadOptions\(|called variables=|called keep_in_memory="):
        ds = ZarrIterableDataset(store, **old)
    assert check(ds)


def test_an_unknown_argument_is_named(store):
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['shuffle_chunks'\]"):
        ZarrIterableDataset(store, shuffle_chunks=True)


def test_loader_arguments_after_batch_size_by_name(store):
    """``ZarrDataLoader(ds, 32, True)`` set drop_last where DataLoader's third positional argument is shuffle."""
    ds = ZarrIterableDataset(store)
    with pytest.warns(DeprecationWarning, match="pass drop_last= and num_workers= by name"):
        loader = ZarrDataLoader(ds, 24, True)
    assert loader.config.drop_last and len(loader) == 64 // 24
    with pytest.warns(DeprecationWarning):
        assert ZarrDataLoader(ds, 8, False, 0).config.num_workers == 0
    with pytest.raises(TypeError, match="batch_size by position"):
        ZarrDataLoader(ds, 8, False, 0, True)


def test_the_spec_is_made_once_and_handed_down(store):
    ds = ZarrIterableDataset(store, seed=3, buffer_chunks=2)
    loader = ZarrDataLoader(ds, batch_size=8, drop_last=True)
    assert loader.config.spec is loader.spec == ds.spec(8, True)
    assert loader.state_dict()["fingerprint"] == loader.spec.fingerprint()


def test_reading_options_take_their_fields_by_name():
    """``ReadOptions(4, 64)`` gave decode threads and requests in flight by position: an option added before
    them would have changed what such a call means, silently."""
    with pytest.raises(TypeError, match="positional"):
        ReadOptions(4, 64)
    assert ReadOptions(decode_threads=4, requests_in_flight=64).requests_in_flight == 64
