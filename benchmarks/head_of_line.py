"""Reads handed out in order against a latency tail: what holding finished reads apart from the wire gains.

A reader hands its pieces out in order, so a read that finished waits for every read before it. When the level
of requests in flight counted those finished reads too, one slow answer emptied the wire until it came: with 256
in flight and answers of 100 ms plus a tail (p99 about 240 ms, as measured at 100 ms on this project's 2-core
machine), about 256 / 240 ms came a second instead of 256 / 112 ms. An adapted level now counts the requests on
the wire only, and the reader holds up to ``HOLD`` x the level pieces ahead (``zarrtorch/_read/inflight.py``).

This model needs no server: each read sleeps its drawn latency in a reading thread (the same ``PieceReader``,
the same ordering, the same threads), and the consumer spends ``--work-ms`` on each piece, sleeping as a
training step on a GPU leaves the GIL free (a consumer spinning in Python holds it: reads that finish then wait
for it). The level is held at ``--level`` so that only the holding rule differs: held = level (what a fixed
setting holds, and what every reader held before) against 2, 3 and 4 x the level. Each figure is pieces/s, the
median of ``--repeats`` runs [lowest-highest], and its ratio to the same consumer with reads that take no time.

    .venv/bin/python benchmarks/head_of_line.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zarrtorch import prepare_zarr  # noqa: E402
from zarrtorch._read import inflight  # noqa: E402
from zarrtorch._read.reader import PieceReader  # noqa: E402


class HeldLevel(inflight.InFlight):
    """A level that does not move, holding ``hold`` x the level (``inflight.HOLD`` for the default), so that a run
    compares the holding rule alone."""

    def __init__(self, level: int, hold: int):
        super().__init__(1, level, start=level, most_held=hold * level)
        self.hold = hold

    @property
    def held(self) -> int:
        return self.hold * self.level

    @property
    def fixed(self) -> bool:  # held = level: counted as a fixed setting is (every read ahead, finished or not)
        return self.hold == 1

    def consumed(self, waited: float, latency: float | None = None) -> None:
        pass


def latencies(n: int, base_ms: float, tail_ms: float, spread: float, seed: int = 0) -> np.ndarray:
    """``base_ms`` plus a lognormal tail of median ``tail_ms`` (seconds): with the defaults p50 112, p90 146,
    p99 238 ms."""
    rng = np.random.default_rng(seed)
    return (base_ms + rng.lognormal(np.log(tail_ms), spread, n)) / 1e3


def pieces_per_second(arrays: dict, level: inflight.InFlight, wait: np.ndarray, work_s: float) -> float:
    """Read ``len(wait)`` pieces in order through a ``PieceReader``, each read sleeping its ``wait``, the consumer
    ``work_s`` on each; checks the order."""
    reader = PieceReader(arrays, 1, threads=2, in_flight=level)

    def read(a: int, b: int) -> dict:
        time.sleep(wait[a])
        return {"piece": a}

    start = time.perf_counter()
    for k, piece in enumerate(
        reader.iter_pieces(np.stack([np.arange(len(wait)), np.arange(1, len(wait) + 1)], 1), read=read)
    ):
        if piece["piece"] != k:
            raise AssertionError(f"piece {piece['piece']} handed out in place {k}")
        time.sleep(work_s)  # a training step: the GIL is free meanwhile
    return len(wait) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pieces", type=int, default=6000)
    p.add_argument("--level", type=int, default=256, help="requests on the wire (the adapted default's most)")
    p.add_argument("--work-ms", type=float, default=0.5, help="consumer time per piece (a sleep)")
    p.add_argument("--base-ms", type=float, default=100.0)
    p.add_argument("--tail-ms", type=float, default=12.0)
    p.add_argument("--spread", type=float, default=1.05)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    wait = latencies(args.pieces, args.base_ms, args.tail_ms, args.spread)
    p50, p90, p99 = np.percentile(wait, [50, 90, 99]) * 1e3
    with tempfile.TemporaryDirectory(prefix="zarrtorch-hol-") as tmp:
        path = Path(tmp) / "s.zarr"
        prepare_zarr({"x": np.zeros((8, 1), np.float32)}, path, chunk_rows=1, progress=False)
        arrays = dict(zarr.open_group(path, mode="r").arrays())
        n = args.level
        settings = {"no latency": (HeldLevel(n, 1), np.zeros_like(wait))}
        settings["held = level (before)"] = (HeldLevel(n, 1), wait)
        for hold in (2, 3, 4):
            default = " (default)" if hold == inflight.HOLD else ""
            settings[f"held = {hold} x level{default}"] = (HeldLevel(n, hold), wait)
        rates: dict[str, list[float]] = {name: [] for name in settings}
        for _ in range(args.repeats):  # the settings in turn, so that a busy moment touches all of them
            for name, (level, w) in settings.items():
                rates[name].append(pieces_per_second(arrays, level, w, args.work_ms / 1e3))
    print(
        f"{args.pieces:,} pieces in order, {n} requests on the wire, consumer {args.work_ms:g} ms per piece; "
        f"latency p50 {p50:.0f} ms, p90 {p90:.0f} ms, p99 {p99:.0f} ms; median of {args.repeats} [lowest-highest]"
    )
    print(f"Little's law with the median latency allows {n / (p50 / 1e3):,.0f} pieces/s")
    reference = statistics.median(rates["no latency"])
    for name, values in rates.items():
        ratio = "" if name == "no latency" else f"  ({statistics.median(values) / reference:.2f} x no latency)"
        print(f"  {name:30} {statistics.median(values):>8,.0f} [{min(values):,.0f}-{max(values):,.0f}] pieces/s{ratio}")
    return {"rates": rates, "latency_ms": {"p50": p50, "p90": p90, "p99": p99}}


if __name__ == "__main__":
    main()
