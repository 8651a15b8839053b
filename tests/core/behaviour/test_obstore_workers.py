"""A store served by obstore (zarr's ``ObjectStore``) with forked DataLoader workers is refused at construction.

obstore's maintainers say it is not fork-safe (developmentseed/obstore #441), and ``benchmarks/obstore_eval.py``
measured it: a forked child's requests never get an answer once the parent has made one, so each worker's reads
waited out their retries and the loader failed with a ChunkReadError about two minutes later. Spawned and
forkserver workers open the store afresh and work.
"""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
import zarr
import zarr.storage

import zarrtorch as zt
from zarrtorch._read.source import fork_unsafe_stores


def _obstore_group(tmp_path):
    """A small store written on disk, opened through obstore's LocalStore behind zarr's ObjectStore."""
    obstore = pytest.importorskip("obstore", reason="obstore is not installed: no ObjectStore to open")
    path = tmp_path / "s.zarr"
    zt.prepare_zarr({"x": np.arange(64 * 3, dtype=np.float32).reshape(64, 3)}, path, chunk_rows=8, progress=False)
    return zarr.open_group(zarr.storage.ObjectStore(obstore.store.LocalStore(str(path)), read_only=True), mode="r")


def test_an_object_store_counts_as_fork_unsafe_and_a_local_one_does_not(tmp_path):
    """The rule itself, without obstore installed: zarr's ObjectStore class is what marks a store as obstore's."""
    unsafe = object.__new__(zarr.storage.ObjectStore)  # no obstore needed to name the class
    local = zarr.storage.LocalStore(str(tmp_path))
    assert fork_unsafe_stores([unsafe, local], "fork") == [unsafe]
    assert fork_unsafe_stores([unsafe, local], "spawn") == []
    assert fork_unsafe_stores([unsafe, local], "forkserver") == []
    assert fork_unsafe_stores([local], "fork") == []


def test_forked_workers_on_an_obstore_store_are_refused_at_construction(tmp_path):
    ds = zt.ZarrIterableDataset(_obstore_group(tmp_path))
    with pytest.raises(ValueError, match="obstore.*fork.*multiprocessing_context='forkserver'"):
        zt.ZarrDataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork")


def test_an_obstore_store_streams_with_no_workers_or_with_forkserver_workers(tmp_path):
    ds = zt.ZarrIterableDataset(_obstore_group(tmp_path))
    for settings in ({"num_workers": 0}, {"num_workers": 2, "multiprocessing_context": "forkserver"}):
        rows = torch_rows(zt.ZarrDataLoader(ds, batch_size=4, **settings))
        assert sorted(rows) == list(range(64)), settings


def test_the_default_start_method_is_what_the_check_reads(tmp_path):
    """With no multiprocessing_context the loader checks the start method DataLoader will use."""
    ds = zt.ZarrIterableDataset(_obstore_group(tmp_path))
    default = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    if default == "fork":
        with pytest.raises(ValueError, match="obstore"):
            zt.ZarrDataLoader(ds, batch_size=4, num_workers=1)
    else:
        zt.ZarrDataLoader(ds, batch_size=4, num_workers=1)


def torch_rows(loader) -> list[int]:
    """The first column's row numbers (x[:, 0] / 3) of one epoch."""
    return [int(v) // 3 for batch in loader for v in batch["x"][:, 0].tolist()]
