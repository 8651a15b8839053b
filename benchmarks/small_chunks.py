"""Where a local store's small chunks are read: in the thread that gathers the batches (the default for chunks of
64 KiB or less decoded in one thread) or in a reading thread beside it (``ReadOptions(requests_in_flight=n)``).

    .venv/bin/python benchmarks/small_chunks.py                       # 4,096 rows, 12 rounds, 0 and 2 workers
    .venv/bin/python benchmarks/small_chunks.py --rounds 20 --json /tmp/small.json

The store is a WeatherBench2-style group written as zarr-python 2 writes one: ten float32 arrays of one row per
chunk (two of 4 x 32 x 32, eight of 32 x 32: 4-16 KiB a chunk), Blosc lz4 + byte shuffle, Zarr v2. Every loader
is made once and its epochs alternate with the others' (the order turned each round), in this one process, so
that a machine that slows down for a while slows each setting alike; a ratio is taken per round, then its median.
Shuffled rows in batches of 64 and 2 + 4 windows in batches of 32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numcodecs
import numpy as np
import zarr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zarrtorch import ReadOptions, Windows, ZarrDataLoader, ZarrIterableDataset  # noqa: E402

LEVELS, GRID = 4, (32, 32)
VARIABLES = {f"level_{i}": (LEVELS, *GRID) for i in range(2)} | {f"surface_{i}": GRID for i in range(8)}
SETTINGS = {  # name -> ReadOptions keywords
    "default (read where gathered)": {},
    "a reading thread beside, 2 in flight": {"requests_in_flight": 2},
}


def group_store(rows: int, data_dir: Path) -> Path:
    """The ten-array group of ``rows`` rows, written once under ``data_dir``."""
    path = data_dir / f"small-chunks-{rows}.zarr"
    if not path.exists():
        writing = path.with_name(path.name + ".writing")
        group = zarr.open_group(str(writing), mode="w", zarr_format=2)
        blosc = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
        rng = np.random.default_rng(0)
        for name, shape in VARIABLES.items():
            arr = group.create_array(name, shape=(rows, *shape), chunks=(1, *shape), dtype="f4", compressors=blosc)
            arr[:] = rng.standard_normal((rows, *shape)).astype("f4").cumsum(axis=-1)  # smooth: it compresses
        zarr.consolidate_metadata(str(writing), zarr_format=2)
        writing.rename(path)
    return path


def epoch_rate(loader: ZarrDataLoader, epoch: int) -> float:
    loader.set_epoch(epoch)
    start, samples = time.perf_counter(), 0
    for batch in loader:
        samples += len(next(iter(batch.values())))
    return samples / (time.perf_counter() - start)


def compare(store: Path, *, windows: bool, workers: int, rounds: int) -> dict:
    """Samples/s of each setting per round, and each setting's ratio to the first, per round."""
    loaders = {}
    for name, options in SETTINGS.items():
        ds = ZarrIterableDataset(
            store,
            variables=list(VARIABLES),
            shuffle=True,
            seed=0,
            windows=Windows(history=2, lead=4) if windows else None,
            read=ReadOptions(**options),
        )
        loaders[name] = ZarrDataLoader(
            ds, batch_size=32 if windows else 64, num_workers=workers, persistent_workers=workers > 0
        )
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    names = list(loaders)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            rates[name].append(epoch_rate(loaders[name], r))
    first = names[0]
    return {
        name: {
            "per_s": [round(v) for v in values],
            "median_per_s": round(statistics.median(values)),
            f"x {first}": round(statistics.median(v / f for v, f in zip(values, rates[first], strict=True)), 2),
        }
        for name, values in rates.items()
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--workers", type=lambda s: [int(w) for w in s.split(",")], default=[0, 2])
    p.add_argument("--data-dir", default=str(ROOT / "data" / "bench"))
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    store = group_store(args.rows, Path(args.data_dir))
    results = {}
    for windows in (False, True):
        for workers in args.workers:
            case = f"{'windows of 6' if windows else 'rows'}, {workers} workers"
            results[case] = compare(store, windows=windows, workers=workers, rounds=args.rounds)
            for name, got in results[case].items():
                ratio = next(v for k, v in got.items() if k.startswith("x "))
                print(f"{case:22s} {name:38s} {got['median_per_s']:>8,} per s  x{ratio:.2f} the default")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
