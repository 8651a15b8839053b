"""The layouts part's runs of one store, loaders alternating in the same minutes, other checkouts among them.

``run.py``'s layouts part takes its figures in rounds too (``layout_case``: every loader once a round), for
every layout, always this checkout against zarr-beluga. Here one store and sample kind, with zarrtorch from other
checkouts beside it (a change measured against the code before it). The same runs (``run.job`` with
``run.layout_run``'s arguments: one fresh process each, epochs 1 and 2 together, warm page cache) go round
``--reps`` times, every loader and worker count once a round, and each is summed up by its median, with the
1-minute load average beside every run.
A loader is ``beluga`` (zarr-beluga 0.3.0 in its environment under ``.peers/``), ``zarrtorch`` (this checkout),
or ``NAME=DIR``: zarrtorch from another checkout (``DIR`` on ``PYTHONPATH``: ``old=/tmp/main-tree``)::

    python benchmarks/peers/alternate.py --data-dir /work/wt-beluga2/data/bench --kind wb2 --frames 1 \\
        --workers 0,2 --reps 4 --loaders beluga,old=/tmp/main-tree,zarrtorch
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def load_run_py():
    """``benchmarks/peers/run.py`` as a module (``benchmarks/run.py`` holds the same name)."""
    spec = importlib.util.spec_from_file_location("peers_run", HERE / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def layout_args(a, loader: str, workers: int) -> list[str]:
    """A ``layout`` job's options, as ``run.layout_run`` gives them."""
    store = Path(a.data_dir) / f"peers_{a.rows}_c128_s0_{a.kind}.zarr"
    args = ["layout", "--kind", a.kind, "--frames", str(a.frames), "--workers", str(workers)]
    args += ["--store", str(store), "--work", str(Path(a.work) / loader.split("=")[0]), "--rows", str(a.rows)]
    return args + ["--chunk-rows", "1", "--batch-size", str(a.batch_size), "--max-s", str(a.max_s)]


def one_run(run, a, loader: str, workers: int, log) -> tuple[float | None, str]:
    """One fresh process: samples/s over epochs 1 and 2 together (``None`` and why, for a failed run)."""
    name, _, tree = loader.partition("=")
    if name == "beluga":
        python, script = run.envs.ensure_env("beluga", rebuild=False)["python"], "beluga_peer.py"
    else:
        python, script = sys.executable, "zarrtorch_peer.py"
    os.environ["PYTHONPATH"] = tree or str(ROOT)
    result = run.job(python, script, layout_args(a, loader, workers), a.timeout, log)
    epochs = result.get("epochs") or []
    seconds = sum(e["seconds"] for e in epochs)
    if not seconds:
        return None, result.get("error") or result.get("refused") or "no epoch"
    return sum(e["rows"] for e in epochs) / seconds, ""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=str(ROOT / "data" / "bench"))
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--kind", default="wb2", help="the store's layout (beluga_layouts.py): course, frame, sharded, wb2")
    p.add_argument("--frames", type=int, default=1, help="rows per sample (1: single rows; 6: windows of 2 + 4)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=lambda s: [int(w) for w in s.split(",")], default=[0, 2])
    p.add_argument("--loaders", type=lambda s: s.split(","), default=["beluga", "zarrtorch"])
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--max-s", type=float, default=20, help="seconds after which an epoch is cut")
    p.add_argument("--timeout", type=float, default=600, help="seconds per process")
    p.add_argument("--work", default="/tmp/zarrtorch-alternate")
    a = p.parse_args(argv)
    run = load_run_py()
    rates: dict[tuple[str, int], list[float]] = {}
    with Path(a.work).with_suffix(".log").open("a") as log:
        for rep in range(a.reps):
            for workers in a.workers:
                for loader in a.loaders:
                    rate, why = one_run(run, a, loader, workers, log)
                    if rate is not None:
                        rates.setdefault((loader.split("=")[0], workers), []).append(rate)
                    shown = f"{rate:,.0f}/s" if rate is not None else why
                    print(
                        f"round {rep + 1}, {loader.split('=')[0]}, {workers} workers: {shown} "
                        f"(load {os.getloadavg()[0]:.2f})",
                        flush=True,
                    )
    for (loader, workers), values in sorted(rates.items()):
        listed = ", ".join(f"{v:,.0f}" for v in values)
        print(f"{loader}, {workers} workers: median {statistics.median(values):,.0f}/s of [{listed}]")


if __name__ == "__main__":
    main()
