"""Stage a store to node-local disk, or read it in place? The copy time against the epochs that pay it back.

    .venv/bin/python benchmarks/staging.py                  # data/tiny/train.zarr, copied to a temporary folder
    .venv/bin/python benchmarks/staging.py --size small     # data/small (python -m zarrtorch make-data --size small)

On a cluster, in a job on one compute node (the source on the parallel file system, the copy on the node):

    python benchmarks/staging.py --source /shared/fs/zarrtorch-data/workshop/train.zarr --dest "$TMPDIR"
    python benchmarks/staging.py --source /shared/fs/zarrtorch-data/workshop/train.zarr --dest /dev/shm

It copies the store (every file, then fsync: the copy is on the destination when the clock stops), then times
one epoch of ``ZarrDataLoader`` (``--workers 0``, decode threads = CPUs - 1, the train command's default) reading the
original and one reading the copy, each twice: "cold", after asking the kernel to drop the store's pages from
its page cache (``posix_fadvise(DONTNEED)`` on every file: advice, which a parallel file system's client may
not follow), and "warm", right after a read of the same store. Break-even = copy time / (epoch in place -
epoch from the copy): the epochs after which staging has paid for itself; "never" when the copy is not
faster to read. Figures are medians of ``--repeats`` epochs. Where source and destination share a disk (as
on a laptop, or this project's machine) the figures show the method and the cost of the copy, not what a
parallel file system and a local SSD differ by.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pagecache

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def store_files(folder: Path) -> dict[str, int]:
    """Every file of a store, by path relative to it, with its size."""
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def copy_store(source: Path, dest: Path) -> float:
    """Copy ``source`` to ``dest`` (which must not exist) and fsync every file; seconds taken."""
    start = time.perf_counter()
    shutil.copytree(source, dest)
    for name in store_files(dest):
        fd = os.open(dest / name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return time.perf_counter() - start


def epoch_seconds(store: Path, *, batch_size: int, decode_threads: int, epoch: int = 0) -> tuple[float, int]:
    """One epoch of the library's loader over ``store``, the course's way (no workers): seconds and rows."""
    from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset

    dataset = ZarrIterableDataset(store, seed=0, read=ReadOptions(decode_threads=decode_threads))
    loader = ZarrDataLoader(dataset, batch_size, drop_last=True, num_workers=0)
    loader.set_epoch(epoch)
    rows = 0
    start = time.perf_counter()
    for batch in loader:
        rows += len(next(iter(batch.values())))
    return time.perf_counter() - start, rows


def break_even(copy_s: float, in_place_s: float, from_copy_s: float) -> float | str:
    """Epochs after which the copy has paid for itself, or "never" when reading the copy is not faster."""
    saved = in_place_s - from_copy_s
    return copy_s / saved if saved > 0 else "never"


def measure(
    source: Path, dest_dir: Path, *, batch_size: int = 32, decode_threads: int | None = None, repeats: int = 3
) -> dict:
    """Copy ``source`` into ``dest_dir`` and time epochs read in place and from the copy, cold and warm."""
    from zarrtorch import available_cpus

    source, dest_dir = Path(source), Path(dest_dir)
    threads = decode_threads or max(1, available_cpus() - 1)
    dest = dest_dir / f"{source.name}.staged-{os.getpid()}"
    pagecache.drop_from_cache(source)  # the copy reads the source as a job's first read would
    copy_s = copy_store(source, dest)
    try:
        files, copied = store_files(source), store_files(dest)
        result = {
            "source": str(source),
            "dest": str(dest),
            "same_device": source.stat().st_dev == dest_dir.stat().st_dev,
            "files": len(files),
            "bytes": sum(files.values()),
            "files_copied": len(copied),
            "bytes_copied": sum(copied.values()),
            "copy_complete": files == copied,
            "copy_s": copy_s,
            "batch_size": batch_size,
            "decode_threads": threads,
            "repeats": repeats,
        }
        for mode in ("cold", "warm"):
            times = {"in_place": [], "from_copy": []}
            for r in range(repeats):
                order = ("in_place", "from_copy") if r % 2 == 0 else ("from_copy", "in_place")  # drift on both
                for where in order:
                    store = source if where == "in_place" else dest
                    if mode == "cold":
                        pagecache.drop_from_cache(store)
                    else:
                        epoch_seconds(store, batch_size=batch_size, decode_threads=threads, epoch=r)  # warms it
                    seconds, rows = epoch_seconds(store, batch_size=batch_size, decode_threads=threads, epoch=r)
                    times[where].append(seconds)
            in_place, from_copy = statistics.median(times["in_place"]), statistics.median(times["from_copy"])
            result[mode] = {
                "in_place_s": in_place,
                "from_copy_s": from_copy,
                "saved_per_epoch_s": in_place - from_copy,
                "break_even_epochs": break_even(copy_s, in_place, from_copy),
                "rows_per_epoch": rows,
                "all_in_place_s": times["in_place"],
                "all_from_copy_s": times["from_copy"],
            }
        return result
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def table(result: dict) -> str:
    """The figures as a Markdown table."""
    lines = [
        "| page cache | copy (s) | epoch in place (s) | epoch from the copy (s) | saved per epoch (s) | break-even |",
        "|---|---|---|---|---|---|",
    ]
    for mode in ("cold", "warm"):
        m = result[mode]
        even = m["break_even_epochs"]
        even = f"{even:.1f} epochs" if isinstance(even, float) else even
        lines.append(
            f"| {mode} | {result['copy_s']:.2f} | {m['in_place_s']:.2f} | {m['from_copy_s']:.2f} | "
            f"{m['saved_per_epoch_s']:+.2f} | {even} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, help="the store to stage (default: the course's train.zarr of --size)")
    parser.add_argument("--size", default="tiny", help="course data size when --source is not given (default tiny)")
    parser.add_argument("--dest", type=Path, help="where to copy it (default: a temporary folder; $TMPDIR on a node)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--decode-threads", type=int, help="default: this process's CPUs - 1 (at least 1)")
    parser.add_argument("--repeats", type=int, default=3, help="epochs each way and mode; medians (default 3)")
    args = parser.parse_args(argv)
    source = args.source
    if source is None:
        from zarrtorch.course.paths import train_store_path

        source = train_store_path(args.size)
        if not source.exists():
            print(f"no {source}: python -m zarrtorch make-data --size {args.size}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="zarrtorch-staging-", dir=args.dest) as dest:
        result = measure(
            source, Path(dest), batch_size=args.batch_size, decode_threads=args.decode_threads, repeats=args.repeats
        )
    print(
        f"{result['source']}: {result['files']} files, {result['bytes'] / 2**20:.1f} MiB, copied to "
        f"{Path(result['dest']).parent} ({'the same' if result['same_device'] else 'another'} device); one epoch = "
        f"{result['cold']['rows_per_epoch']} rows, batch {result['batch_size']}, {result['decode_threads']} decode "
        f"thread(s), medians of {result['repeats']}"
    )
    print(table(result))
    if result["same_device"]:
        print("source and copy are on the same device here: the difference is noise, not what staging saves")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
