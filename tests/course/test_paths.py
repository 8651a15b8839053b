"""zarrtorch.course.paths: the checkout, the data folder and the size switch, wherever the caller runs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zarrtorch.course import paths

REPO = Path(__file__).resolve().parents[2]


def test_repo_root_is_the_checkout_from_any_working_directory(tmp_path):
    code = "from zarrtorch.course import paths; print(paths.repo_root()); print(paths.data_root())"
    env = {k: v for k, v in os.environ.items() if k not in ("ZARRTORCH_DATA_DIR", "ZARRTORCH_SCRATCH_DIR")}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    )
    root, data = out.stdout.split()
    assert Path(root) == REPO and Path(data) == REPO / "data"


def test_size_switch(monkeypatch):
    monkeypatch.setenv("ZARRTORCH_SIZE", "tiny")
    assert paths.course_size() == "tiny" and paths.course_size("workshop") == "workshop"
    monkeypatch.setenv("ZARRTORCH_SIZE", "huge")
    with pytest.raises(ValueError, match="unknown dataset size 'huge'"):
        paths.course_size()
