"""A group's consolidated metadata is one copy of every array's metadata; zarr and xarray open a consolidated
group from it alone. Written before an array changed (rows appended, a resize), it made rows vanish
silently (found by a break-test: 20 appended rows of 60 never streamed) or had rows read past the array's end.
The loader checks it against each array's own metadata and refuses a stale copy with the fix."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import zarr

from zarrtorch import ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch.course.servers import HttpStoreServer


def consolidated_then_changed(path, zarr_format: int, change: str) -> None:
    group = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    group.create_array("i", shape=(40,), chunks=(8,), dtype="i8")[:] = np.arange(40)
    group.create_array("x", shape=(40, 2), chunks=(8, 2), dtype="f4")[:] = np.arange(80).reshape(40, 2)
    zarr.consolidate_metadata(str(path))
    group = zarr.open_group(str(path), mode="r+", use_consolidated=False)
    if change == "append":
        group["i"].append(np.arange(40, 60))
        group["x"].append(np.arange(80, 120, dtype="f4").reshape(20, 2))
    elif change == "shrink":
        group["i"].resize((20,))
        group["x"].resize((20, 2))
    elif change == "attributes":
        group["x"].attrs["scale_factor"] = 0.5
    elif change == "removed":
        shutil.rmtree(path / "x")


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("append", r"shape \[40\] where its own says \[60\]"),
        ("shrink", r"shape \[40\] where its own says \[20\]"),
        ("attributes", "attributes"),
        ("removed", "holds no metadata of its own"),
    ],
)
def test_stale_consolidated_metadata_is_refused(tmp_path, zarr_format, change, said):
    path = tmp_path / "s.zarr"
    consolidated_then_changed(path, zarr_format, change)
    assert zarr.open_group(str(path), mode="r")["i"].shape == (40,)  # what zarr itself reads
    with pytest.raises(ValueError, match=rf"array '[ix]' of .*s\.zarr.*{said}.*zarr\.consolidate_metadata\(path\)"):
        ZarrIterableDataset(path)
    with pytest.raises(ValueError, match=said):  # a group opened by the user is checked too
        ZarrIterableDataset(zarr.open_group(str(path), mode="r"))


def test_stale_consolidated_metadata_is_refused_over_http(tmp_path):
    consolidated_then_changed(tmp_path / "s.zarr", 3, "append")
    with HttpStoreServer(tmp_path) as server:
        with pytest.raises(ValueError, match=r"shape \[40\] where its own says \[60\].*consolidate_metadata"):
            ZarrIterableDataset(f"{server.url}/s.zarr")


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_consolidated_again_streams_every_row(tmp_path, zarr_format):
    path = tmp_path / "s.zarr"
    consolidated_then_changed(path, zarr_format, "append")
    zarr.consolidate_metadata(str(path))  # the fix the message gives
    ds = ZarrIterableDataset(path, shuffle=False, return_index=True)
    got = np.concatenate([b["i"].numpy() for b in ZarrDataLoader(ds, batch_size=16)])
    np.testing.assert_array_equal(np.sort(got), np.arange(60))


def test_consistent_stores_with_nan_fills_are_accepted(tmp_path):
    """Equal metadata is not refused where a NaN fill value differs from itself (xarray's float default)."""
    xr = pytest.importorskip("xarray")
    data = xr.Dataset({"t": (("time", "y"), np.arange(24, dtype="f4").reshape(8, 3))})
    for zarr_format in (2, 3):
        path = tmp_path / f"x{zarr_format}.zarr"
        data.to_zarr(path, zarr_format=zarr_format, consolidated=True)
        meta = zarr.open_group(str(path), mode="r")["t"].metadata.to_dict()
        assert "nan" in json.dumps(meta, default=repr).lower()  # the case this test is about
        assert ZarrIterableDataset(path).rows == 8
    prepare_zarr({"a": np.zeros((5, 2), "f4")}, tmp_path / "p.zarr", chunk_rows=2, progress=False)
    assert ZarrIterableDataset(tmp_path / "p.zarr").rows == 5


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_arrays_handed_over_and_arrays_added_later_are_checked_too(tmp_path, zarr_format):
    """Found by a second break-test: an array or a dict of arrays opened from a stale consolidated group streamed
    40 of 60 rows; an array added after consolidating was left out without a word (or 'unknown array name')."""
    path = tmp_path / "s.zarr"
    consolidated_then_changed(path, zarr_format, "append")
    group = zarr.open_group(str(path), mode="r")
    for source in (group["x"], {"x": group["x"], "i": group["i"]}):
        with pytest.raises(ValueError, match=r"shape \[40.*where its own says \[60"):
            ZarrIterableDataset(source)
    added = tmp_path / "added.zarr"
    consolidated_then_changed(added, zarr_format, "none")
    zarr.open_group(str(added), mode="r+", use_consolidated=False).create_array(
        "y", shape=(40,), chunks=(8,), dtype="f4"
    )
    with pytest.raises(ValueError, match=r"holds arrays \['y'\] that its consolidated metadata does not list"):
        ZarrIterableDataset(added)
    with pytest.raises(ValueError, match=r"array 'y' is in the store .* not in its consolidated metadata"):
        ZarrIterableDataset(added, variables=["x", "y"])
