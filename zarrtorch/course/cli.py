"""Command line: ``python -m zarrtorch make-data | train | audit | roofline``.

Each sub-command lives in its own module; this file only parses and dispatches.
"""

from __future__ import annotations

import argparse
import sys


def _make_data(argv: list[str]) -> int:
    from zarrtorch.course.paths import SIZES, course_size
    from zarrtorch.course.synthetic import make_data

    p = argparse.ArgumentParser(
        prog="python -m zarrtorch make-data",
        description="Generate the course's synthetic geoscience dataset (no download): an archive-layout "
        "Zarr store and a training store chunked along time only, under data/<size>/.",
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


def _train(argv: list[str]) -> int:
    from zarrtorch.course.train import main as train_main

    return train_main(argv)


def _audit(argv: list[str]) -> int:
    from zarrtorch.audit import main as audit_main

    return audit_main(argv)


def _roofline(argv: list[str]) -> int:
    from zarrtorch.roofline import main as roofline_main

    return roofline_main(argv)


COMMANDS = {"make-data": _make_data, "train": _train, "audit": _audit, "roofline": _roofline}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: python -m zarrtorch {make-data,train,audit,roofline} [options]   (add --help after a command)")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:])
