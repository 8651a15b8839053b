"""How many chunks a reading task takes: loaders that differ only in ``READ_TASK_BYTES``, in one process (issue 43).

    .venv/bin/python benchmarks/task_size.py                                   # 0 workers, 21 rounds
    .venv/bin/python benchmarks/task_size.py --workers 2 --rounds 15
    .venv/bin/python benchmarks/task_size.py --windows --layouts "v2 blosc lz4 shuffle"

A local store's reader hands each reading thread tasks of consecutive chunks up to ``READ_TASK_BYTES`` decoded
(:func:`zarrtorch._util.sizes.pieces_per_read`). For each layout of ``layouts.py`` (its stores: one 128 KiB row a
chunk), one loader per task size is made (default settings, shuffled, batch 32; ``--windows``: 2 + 4 windows),
then their epochs alternate, the order turned each round, followed by the raw decode of 2 threads
(``layouts.raw_rate``): a machine that slows for a while slows each alike. Printed per layout: the medians, the
median per round of each size's rate over the first size's, and of each over the raw decode of its round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import layouts

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import zarrtorch._util.sizes as sizes  # noqa: E402
from zarrtorch import Windows, ZarrDataLoader, ZarrIterableDataset  # noqa: E402

DEFAULT_LAYOUTS = ("v3 zstd", "v2 blosc lz4 shuffle", "v2 no compressor")


def a_loader(arrays: dict, task_bytes: int, workers: int, windows: bool) -> ZarrDataLoader:
    """``layouts.a_loader`` (or the same with 2 + 4 windows) made while ``READ_TASK_BYTES`` is ``task_bytes``: the
    read plan takes it when the loader is made."""
    before, sizes.READ_TASK_BYTES = sizes.READ_TASK_BYTES, task_bytes
    try:
        if not windows:
            return layouts.a_loader(arrays, workers=workers)
        ds = ZarrIterableDataset(arrays, seed=0, windows=Windows(history=2, lead=4))
        persistent = {"persistent_workers": True} if workers else {}
        return ZarrDataLoader(ds, batch_size=layouts.BATCH, num_workers=workers, **persistent)
    finally:
        sizes.READ_TASK_BYTES = before


def compare(layout: str, rows: int, task_kib: list[int], workers: int, rounds: int, windows: bool, data_dir: Path):
    arrays = {"x": layouts.generated_store(layout, rows, data_dir)}
    loaders = {kib: a_loader(arrays, kib << 10, workers, windows) for kib in task_kib}
    rates: dict = {kib: [] for kib in task_kib} | {"raw": []}
    for r in range(rounds):
        for kib in task_kib if r % 2 else task_kib[::-1]:
            rates[kib].append(layouts.epoch_rate(loaders[kib], r, False))
        rates["raw"].append(layouts.raw_rate(arrays, 2)[0])

    def per_round(top: list[float], bottom: list[float]) -> float:
        return statistics.median([a / b for a, b in zip(top, bottom, strict=True)])

    first = task_kib[0]
    return {
        "pieces_per_read": {kib: loaders[kib].job.read_plan.pieces_per_read for kib in task_kib},
        "median": {k: statistics.median(v) for k, v in rates.items()},
        "over_first": {kib: per_round(rates[kib], rates[first]) for kib in task_kib},
        "over_raw": {kib: per_round(rates[kib], rates["raw"]) for kib in task_kib},
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layouts", nargs="+", default=list(DEFAULT_LAYOUTS), choices=list(layouts.LAYOUTS))
    p.add_argument("--task-kib", nargs="+", type=int, default=[256, 1024], help="task sizes; the first is the base")
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--windows", action="store_true", help="2 + 4 windows instead of rows")
    p.add_argument("--data-dir", type=Path, default=layouts.DATA)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    result = {"workers": args.workers, "rows": args.rows, "rounds": args.rounds, "windows": args.windows, "layouts": {}}
    unit = "windows/s" if args.windows else "rows/s"
    print(f"{args.rows} rows of 128 KiB, {args.workers} workers, {args.rounds} rounds, {unit} (raw: rows/s)")
    for layout in args.layouts:
        run = compare(layout, args.rows, args.task_kib, args.workers, args.rounds, args.windows, args.data_dir)
        result["layouts"][layout] = run
        print(f"\n{layout}")
        for kib in args.task_kib:
            print(
                f"  {kib:5d} KiB tasks ({run['pieces_per_read'][kib]:2d} chunks) {run['median'][kib]:9,.0f}"
                f"  over {args.task_kib[0]} KiB {run['over_first'][kib]:.2f}"
                f"  over raw 2 threads {run['over_raw'][kib]:.2f}"
            )
        print(f"  raw 2 threads {run['median']['raw']:,.0f}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
