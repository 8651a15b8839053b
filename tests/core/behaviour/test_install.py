"""The core installs and streams without any extra: a fresh virtual environment gets torch (the version in
use here, first, as the README's set-up does) and then ``pip install <repo>`` with no extras; a store is
written with ``prepare_zarr`` and streamed with 0 and 2 workers, every row exactly once, while xarray,
dask, lightning, matplotlib, tqdm and h5py are not even installed."""

from __future__ import annotations

import subprocess
import textwrap
import venv
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """
    import importlib.util, sys
    import numpy as np
    from zarrtorch import ZarrDataLoader, ZarrIterableDataset, prepare_zarr

    extras = ("xarray", "dask", "lightning", "matplotlib", "tqdm", "h5py")
    present = [m for m in extras if importlib.util.find_spec(m)]
    assert not present, f"installed although not asked for: {present}"
    store = sys.argv[1]
    x = np.arange(300 * 4, dtype=np.float32).reshape(300, 4)
    prepare_zarr({"x": x, "y": np.arange(300)}, store, chunk_rows=32)
    for workers in (0, 2):
        ds = ZarrIterableDataset(store, seed=1, return_index=True)
        loader = ZarrDataLoader(ds, batch_size=16, num_workers=workers)
        rows = np.concatenate([b["index"].numpy() for b in loader])
        assert sorted(rows.tolist()) == list(range(300)), workers
        for b in loader:
            assert (b["y"] == b["index"]).all() and (b["x"][:, 0] == 4 * b["index"]).all()
    print("streamed 300 rows with 0 and 2 workers")
    """
)


@pytest.mark.slow
def test_core_installs_and_streams_without_extras(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    torch_version = torch.__version__.split("+")[0]

    def pip(*args):
        done = subprocess.run(
            [python, "-m", "pip", "install", "-q", *args], capture_output=True, text=True, timeout=900
        )
        if done.returncode and ("Could not find a version" in done.stderr or "NewConnectionError" in done.stderr):
            pytest.skip(f"no package index reachable for a fresh environment: {done.stderr.strip()[-300:]}")
        assert done.returncode == 0, done.stderr[-3000:]

    pip(f"torch=={torch_version}")  # first: a later resolver must never pull another (CUDA) torch
    pip(str(ROOT), "--constraint", str(_constraint(tmp_path, torch_version)))
    run = subprocess.run(
        [python, "-c", SCRIPT, str(tmp_path / "data.zarr")], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "streamed 300 rows" in run.stdout


def _constraint(tmp_path: Path, torch_version: str) -> Path:
    path = tmp_path / "constraints.txt"
    path.write_text(f"torch=={torch_version}\n")
    return path
