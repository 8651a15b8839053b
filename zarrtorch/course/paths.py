"""Where the course's generated data lives, and which size the whole course uses.

One switch for everything: ``ZARRTORCH_SIZE`` (tiny | small | workshop) selects the dataset, and
``ZARRTORCH_DATA_DIR`` moves the data folder (e.g. to one shared copy on a JupyterHub).
"""

from __future__ import annotations

import os
from pathlib import Path

SIZES = ("tiny", "small", "workshop")
DEFAULT_SIZE = "small"


def course_size(size: str | None = None) -> str:
    """The dataset size to use: the argument, else ``$ZARRTORCH_SIZE``, else ``small``."""
    size = size or os.environ.get("ZARRTORCH_SIZE") or DEFAULT_SIZE
    if size not in SIZES:
        raise ValueError(
            f"unknown dataset size {size!r}: choose one of {', '.join(SIZES)} "
            "(argument `size=` or environment variable ZARRTORCH_SIZE)"
        )
    return size


def repo_root() -> Path:
    """The checkout this package lives in (or the current directory for an installed package)."""
    here = Path(__file__).resolve().parents[2]  # zarrtorch/course/paths.py -> the checkout
    return here if (here / "pyproject.toml").exists() else Path.cwd()


def data_root() -> Path:
    """Folder holding every generated dataset: ``$ZARRTORCH_DATA_DIR`` or ``<repo>/data``."""
    env = os.environ.get("ZARRTORCH_DATA_DIR")
    return Path(env).expanduser().resolve() if env else repo_root() / "data"


def data_dir(size: str | None = None) -> Path:
    """Folder of one dataset size, e.g. ``data/tiny``."""
    return data_root() / course_size(size)


def archive_path(size: str | None = None) -> Path:
    """The generated data in an archive layout (chunked by month and variable, as climate archives are)."""
    return data_dir(size) / "archive.zarr"


def train_store_path(size: str | None = None) -> Path:
    """The generated data prepared for training: Zarr v3, chunked along the first (time) axis only."""
    return data_dir(size) / "train.zarr"


def scratch_dir(size: str | None = None) -> Path:
    """Where lessons write their own stores: ``$ZARRTORCH_SCRATCH_DIR/<size>`` or ``data/<size>/scratch``.

    On a hub whose shared data folder is read-only, each attendee points ``ZARRTORCH_SCRATCH_DIR`` at a
    folder of their own (e.g. ``~/zarrtorch-scratch``); the shared stores are only read.
    """
    env = os.environ.get("ZARRTORCH_SCRATCH_DIR")
    base = Path(env).expanduser().resolve() if env else data_dir(size) / "scratch"
    folder = base / course_size(size) if env else base
    folder.mkdir(parents=True, exist_ok=True)
    return folder
