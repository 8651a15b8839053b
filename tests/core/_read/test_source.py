"""Opening what the user passes (zarrtorch._read.source): a failed read is never taken for an answer about the
store (no metadata, not a Zarr store) that the store did not give."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from zarrtorch import ReadOptions, RetryPolicy, ZarrIterableDataset, prepare_zarr
from zarrtorch._read.source import open_arrays
from zarrtorch.course.servers import HttpStoreServer

QUICK = RetryPolicy(timeout_s=1.0, retries=1, backoff_s=0.01)


class Unreachable(zarr.storage.WrapperStore):
    """A store whose requests for keys under ``prefix`` fail as a dropped connection does."""

    prefix = "y/"

    async def get(self, key, prototype, byte_range=None):
        if key.startswith(self.prefix):
            raise ConnectionResetError(f"connection reset by peer while reading {key}")
        return await self._store.get(key, prototype, byte_range)

    async def exists(self, key):
        if key.startswith(self.prefix):
            raise ConnectionResetError(f"connection reset by peer while reading {key}")
        return await self._store.exists(key)


def consolidated_then_added(path) -> None:
    """A group consolidated with ``x``, then given ``y`` (so only ``y``'s own metadata says it exists)."""
    group = zarr.open_group(str(path), mode="w")
    group.create_array("x", shape=(20,), chunks=(5,), dtype="f4")[:] = np.arange(20, dtype="f4")
    zarr.consolidate_metadata(str(path))
    zarr.open_group(str(path), mode="r+", use_consolidated=False).create_array(
        "y", shape=(20,), chunks=(5,), dtype="f4"
    )


def test_a_network_error_on_an_arrays_own_metadata_is_not_read_as_no_metadata(tmp_path):
    """An array named by ``variables=`` and absent from the consolidated metadata is looked for by its own metadata:
    a failed request for it was read as "no metadata" (``except Exception: return False``) and said "unknown array
    name 'y'", hiding the dropped connection. The network error is raised, with its message."""
    consolidated_then_added(tmp_path / "s.zarr")
    group = zarr.open_group(Unreachable(zarr.storage.LocalStore(str(tmp_path / "s.zarr"), read_only=True)), mode="r")
    with pytest.raises(ConnectionResetError, match="connection reset by peer while reading y/"):
        open_arrays(group, ["x", "y"])


def test_an_array_with_no_metadata_of_its_own_is_still_unknown(tmp_path):
    """What does mean "no metadata" (no object at the key, or a group's there) still says the name is unknown."""
    consolidated_then_added(tmp_path / "s.zarr")
    zarr.open_group(str(tmp_path / "s.zarr"), mode="r+", use_consolidated=False).create_group("sub")
    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")
    for name in ("nothing", "sub"):
        with pytest.raises(KeyError, match=f"unknown array name '{name}'"):
            open_arrays(group, ["x", name])
    with pytest.raises(ValueError, match="array 'y' is in the store .* not in its consolidated metadata"):
        open_arrays(group, ["x", "y"])


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_metadata_request_says_access_was_refused(tmp_path, status):
    """HTTP 401/403 on a store's metadata was said as "not a readable Zarr store (ClientResponseError: 403...)":
    the store was never read. It says the access was refused, and what to check."""
    prepare_zarr({"x": np.arange(40, dtype=np.float32)}, tmp_path / "s.zarr", chunk_rows=10, progress=False)
    with HttpStoreServer(tmp_path, faults={r"s\.zarr/zarr\.json$": status}) as server:
        with pytest.raises(PermissionError, match=rf"access to .*s\.zarr was refused \(HTTP {status}\b") as err:
            ZarrIterableDataset(f"{server.url}/s.zarr", read=ReadOptions(retry=QUICK))
        assert "not a readable Zarr store" not in str(err.value)
        assert server.requests["s.zarr/zarr.json"] == 1  # a refusal is final: not retried


def test_another_permanent_http_answer_names_the_status(tmp_path):
    prepare_zarr({"x": np.arange(40, dtype=np.float32)}, tmp_path / "s.zarr", chunk_rows=10, progress=False)
    with HttpStoreServer(tmp_path, faults={r"s\.zarr/zarr\.json$": 410}) as server:
        with pytest.raises(ConnectionError, match=r"answered HTTP 410 \(Gone\)") as err:
            ZarrIterableDataset(f"{server.url}/s.zarr", read=ReadOptions(retry=QUICK))
        assert "not a readable Zarr store" not in str(err.value)
