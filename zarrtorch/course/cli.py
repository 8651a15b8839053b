"""The course's commands, ``zarrtorch make-data`` and ``zarrtorch train``: registered with the core's command
line (:mod:`zarrtorch.cli`) through the ``zarrtorch.commands`` entry points in ``pyproject.toml``.
"""

from __future__ import annotations

import argparse


def make_data_command(argv: list[str]) -> int:
    from zarrtorch.course.paths import SIZES, course_size
    from zarrtorch.course.synthetic import make_data

    p = argparse.ArgumentParser(
        prog="python -m zarrtorch make-data",
        description="Generate the course's synthetic geoscience dataset (no download): an archive-layout "
        "Zarr store, a training store chunked along time only and lesson 08's ERA5-like netCDF files, under "
        "data/<size>/ (every file a lesson reads: the lessons only read this folder).",
    )
    p.add_argument("--size", choices=SIZES, default=None, help="dataset size (default: $ZARRTORCH_SIZE or small)")
    p.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    p.add_argument("--overwrite", action="store_true", help="regenerate even if the data exists")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    paths = make_data(course_size(a.size), seed=a.seed, overwrite=a.overwrite, progress=not a.no_progress)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def train_command(argv: list[str]) -> int:
    from zarrtorch.course.train import main as train_main

    return train_main(argv)
