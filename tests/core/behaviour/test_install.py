"""The core installs and streams without any extra: a fresh virtual environment gets torch (the version in
use here, first, as the README's set-up does) and then ``pip install <repo>`` with no extras; a store is
written with ``prepare_zarr`` and streamed with 0 and 2 workers, every row exactly once, while xarray,
dask, lightning, matplotlib, tqdm and h5py are not even installed.

torch and what it requires are placed in the new environment as hard links to this environment's installed files
(a copy where links cannot be made), file by file from their records: what is tested is what pip does with the
package's own requirements beside an installed torch, not pip unpacking torch's wheel again (a minute of CI's
CPU). A hard link, unlike a symbolic one, is never a way for pip to change this environment's files."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import textwrap
import venv
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

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
            [python, "-m", "pip", "install", "-q", "--no-compile", *args], capture_output=True, text=True, timeout=900
        )
        if done.returncode and ("Could not find a version" in done.stderr or "NewConnectionError" in done.stderr):
            pytest.skip(f"no package index reachable for a fresh environment: {done.stderr.strip()[-300:]}")
        assert done.returncode == 0, done.stderr[-3000:]

    installed = _place_installed("torch", env_dir)  # first: a later resolver must never pull another (CUDA) torch
    assert {"torch", "sympy"} <= installed, installed
    pip(str(ROOT), "--constraint", str(_constraint(tmp_path, torch_version)))
    run = subprocess.run(
        [python, "-c", SCRIPT, str(tmp_path / "data.zarr")], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "streamed 300 rows" in run.stdout


def _place_installed(name: str, env_dir: Path) -> set[str]:
    """Place the installed distribution ``name`` and those it requires (extras left out), as this interpreter has
    them, into the virtual environment ``env_dir``: each file of its record hard-linked (copied across file
    systems); a distribution the environment already has is left as it is. The distributions' names."""
    target = Path(
        subprocess.run(
            [str(env_dir / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    present = {_canonical(d.metadata["Name"]) for d in importlib.metadata.distributions(path=[str(target)])}
    placed, todo = set(), [name]
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        key = _canonical(dist.metadata["Name"])
        if key in placed or key in present:
            continue
        placed.add(key)
        for file in dist.files or ():
            source = Path(dist.locate_file(file)).resolve()
            relative = Path(file)
            if relative.is_absolute() or ".." in relative.parts or not source.is_file():
                continue  # scripts in bin/ and the like: not needed to import it
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, destination)
            except OSError:
                shutil.copy2(source, destination)
        for requirement in map(Requirement, dist.requires or ()):
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return placed


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _constraint(tmp_path: Path, torch_version: str) -> Path:
    path = tmp_path / "constraints.txt"
    path.write_text(f"torch=={torch_version}\n")
    return path
