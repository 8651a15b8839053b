"""What a rank's plan and an elastic resume cost, from 10^6 to 10^10 rows and 1 to 4,096 ranks (no data read).

    .venv/bin/python benchmarks/scale.py                  # the table (about a minute)
    .venv/bin/python benchmarks/scale.py --plot scale.png # and the log-log figure of benchmarks/README.md
    .venv/bin/python benchmarks/scale.py --quick          # a few points (a quick look)

A second table varies the DataLoader workers per rank (1, 4, 16) at 1,024 ranks: a plan computes every
worker's pieces, a resume continues on that many workers.

Plan: one rank in the middle of ``world`` ranks x 16 workers computes every worker's pieces for an epoch
(what its workers then read), in 100-row chunks. Resume: a state saved half-way through an epoch on
``world`` ranks x 4 workers is continued on rank ``world'/2`` of ``world' = ceil(3 world / 4)`` ranks x 2
workers (every worker's pieces). Time: the median of 3 runs; memory: the peak of Python's allocations
(tracemalloc) in a separate run. Every point starts with empty caches. Configurations where one rank would
read more than ``--max-rank-rows`` rows are left out (said so in the table): their cost is that rank's
reading, not the plan.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import tracemalloc

from zarrtorch.plan import EpochSpec, Segment, Topology, _cached_plan, epoch_plan
from zarrtorch.resume import remaining_stream, resumed_plan

CHUNK = 100
BATCH = 64
MiB = 2**20


def plan_cost(rows: int, world: int, workers: int = 16) -> None:
    plan = epoch_plan(
        rows,
        CHUNK,
        seed=0,
        epoch=1,
        batch_size=BATCH,
        drop_last=True,
        world_size=world,
        rank=world // 2,
        num_workers=workers,
    )
    for w in plan.workers:
        w.pieces  # noqa: B018  computed on first use


def resume_cost(rows: int, world: int, workers: int = 2) -> None:
    spec = EpochSpec(rows=rows, chunk_rows=CHUNK, batch_size=BATCH, drop_last=True, seed=1, buffer_chunks=8)
    half = rows // (world * BATCH) // 2
    after = max(1, math.ceil(3 * world / 4))
    plan = resumed_plan(spec, 2, (Segment(world, 4, half),), Topology(after // 2, after, workers))
    for w in plan.workers:
        w.pieces  # noqa: B018


def measure(fn, *args) -> tuple[float, float]:
    """(median seconds of 3 runs, peak MiB of Python allocations), each from empty caches."""
    times = []
    for _ in range(3):
        _cached_plan.cache_clear()
        remaining_stream.cache_clear()
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    _cached_plan.cache_clear()
    remaining_stream.cache_clear()
    tracemalloc.start()
    fn(*args)
    peak = tracemalloc.get_traced_memory()[1] / MiB
    tracemalloc.stop()
    return statistics.median(times), peak


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="10^6-10^8 rows, 1-256 ranks")
    p.add_argument("--max-rank-rows", type=float, default=2e7, help="leave out configurations above this")
    p.add_argument("--plot", help="write the log-log figure here (needs matplotlib)")
    p.add_argument("--out", help="write every point as JSON here")
    args = p.parse_args(argv)
    sizes = [10**k for k in (range(6, 9) if args.quick else range(6, 11))]
    worlds = [1, 16, 256] if args.quick else [1, 16, 256, 1024, 4096]
    points = []
    print(f"{'rows':>8} {'ranks':>6} | {'plan s':>8} {'plan MiB':>9} | {'resume s':>9} {'resume MiB':>10}")
    for rows in sizes:
        for world in worlds:
            per_rank = rows / world
            if per_rank > args.max_rank_rows or rows < world * BATCH * 2:
                print(f"{rows:>8.0e} {world:>6} | left out: one rank reads {per_rank:.0e} rows")
                continue
            plan_s, plan_mib = measure(plan_cost, rows, world)
            resume_s, resume_mib = measure(resume_cost, rows, world)
            points.append(
                dict(rows=rows, world=world, plan_s=plan_s, plan_mib=plan_mib, resume_s=resume_s, resume_mib=resume_mib)
            )
            print(f"{rows:>8.0e} {world:>6} | {plan_s:>8.4f} {plan_mib:>9.1f} | {resume_s:>9.4f} {resume_mib:>10.1f}")
    points += workers_table(sizes[-2:] if args.quick else [10**8, 10**9], world=256 if args.quick else 1024)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(points, f, indent=1)
    if args.plot:
        plot(points, args.plot)
    return 0


def workers_table(sizes: list[int], world: int) -> list[dict]:
    """Plan and resume cost against the workers per rank, at ``world`` ranks: a rank computes each worker's
    pieces, so the cost may grow with the workers even where it does not with the ranks."""
    print(f"\nworkers per rank, {world:,} ranks")
    print(f"{'rows':>8} {'workers':>7} | {'plan s':>8} {'plan MiB':>9} | {'resume s':>9} {'resume MiB':>10}")
    points = []
    for rows in sizes:
        for workers in (1, 4, 16):
            plan_s, plan_mib = measure(plan_cost, rows, world, workers)
            resume_s, resume_mib = measure(resume_cost, rows, world, workers)
            points.append(
                dict(
                    rows=rows,
                    world=world,
                    workers=workers,
                    plan_s=plan_s,
                    plan_mib=plan_mib,
                    resume_s=resume_s,
                    resume_mib=resume_mib,
                )
            )
            print(f"{rows:>8.0e} {workers:>7} | {plan_s:>8.4f} {plan_mib:>9.1f} | {resume_s:>9.4f} {resume_mib:>10.1f}")
    return points


def plot(points: list[dict], path: str) -> None:
    points = [p for p in points if "workers" not in p]  # the figure: ranks at 16 (plan) and 2 (resume) workers
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, key, title in [
        (axes[0], "plan_s", "a rank's plan (16 workers)"),
        (axes[1], "resume_s", "an elastic resume"),
    ]:
        for world in sorted({p["world"] for p in points}):
            mine = [p for p in points if p["world"] == world]
            ax.loglog([p["rows"] / world for p in mine], [p[key] for p in mine], "o-", label=f"{world} ranks")
        ax.set_xlabel("rows one rank reads")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("time per process (s)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
