"""A real two-process DDP run on CPU (gloo, 127.0.0.1) that shows why every rank needs the same batch count.

Each rank trains a tiny convolutional model wrapped in ``DistributedDataParallel``: every ``backward()``
all-reduces the gradients, a collective that every rank must enter the same number of times. Two ways of
splitting the store across ranks:

- ``naive``: the common first attempt. Chunks are dealt to ranks round-robin (chunk ``c`` goes to rank
  ``c % world_size``) and each rank cuts its rows into batches (:class:`NaiveChunkSplit`). When the chunk
  count does not divide evenly, or the last chunk is partial, ranks get different batch counts: the rank
  with fewer batches leaves the loop and the process ends, and the other one blocks in the all-reduce of its
  extra batch until gloo reports the lost peer or the timeout.
- ``zarrtorch``: :class:`zarrtorch.ZarrIterableDataset` with :class:`zarrtorch.ZarrDataLoader`, which give every
  rank the same number of batches; after the epoch the ranks also exchange the row numbers they read to show
  that no row was read twice.

Command line (launches ``world_size`` processes and prints one JSON summary per rank)::

    python -m zarrtorch.course.ddp_demo --split naive --world-size 2
    python -m zarrtorch.course.ddp_demo --split zarrtorch --world-size 2 --num-workers 1

From Python: :func:`launch` returns the list of summaries; :func:`naive_batch_counts` predicts the naive
split's counts without running anything.

The demo trains on CPU, one thread per rank. On the larger course sizes a whole epoch would take minutes, so
:func:`demo_rows` picks a window of the first rows that fits a byte budget (``rows=`` of :func:`launch`); the
notebook prints what it leaves out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import timedelta

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative integers."""
    return -(-int(a) // int(b))


RESULT_PREFIX = "ZARRTORCH-DDP-DEMO "
SPLITS = ("naive", "zarrtorch")
DEMO_BUDGET_MB = 128  # decoded MiB one demo epoch reads at most (all ranks together): a few seconds on 2 cores


# ---------------------------------------------------------------------------------------------------------
# The naive split
# ---------------------------------------------------------------------------------------------------------
def naive_rank_chunks(n_chunks: int, rank: int, world_size: int) -> np.ndarray:
    """The chunks rank ``rank`` reads in the naive split: every ``world_size``-th chunk from ``rank`` on."""
    return np.arange(rank, n_chunks, world_size, dtype=np.int64)


def naive_batch_counts(
    rows: int, chunk_rows: int, *, world_size: int, batch_size: int, drop_last: bool = False
) -> list[int]:
    """Batches per rank with chunks dealt round-robin to ranks (no I/O): usually not all equal."""
    n_chunks = ceil_div(rows, chunk_rows)
    counts = []
    for r in range(world_size):
        chunks = naive_rank_chunks(n_chunks, r, world_size)
        rank_rows = int(np.minimum(chunk_rows, rows - chunks * chunk_rows).sum()) if len(chunks) else 0
        counts.append(rank_rows // batch_size if drop_last else ceil_div(rank_rows, batch_size))
    return counts


def demo_rows(
    rows: int,
    chunk_rows: int,
    row_nbytes: int,
    *,
    world_size: int,
    batch_size: int,
    budget_mb: float = DEMO_BUDGET_MB,
) -> int:
    """How many of the first rows the demo trains on: all of them when they fit ``budget_mb`` (MiB, decoded),
    otherwise a window of whole chunks that fits it.

    The window's chunk count is chosen, from the largest that fits downwards, so that the naive split still
    deals the ranks unequal batch counts (what the demo is about); whole chunks keep the window a valid
    ``row_range`` for :class:`zarrtorch.ZarrIterableDataset`. If no window has unequal counts, the largest
    that fits is returned.
    """
    rows, chunk_rows, row_nbytes = int(rows), int(chunk_rows), max(1, int(row_nbytes))
    if rows * row_nbytes <= budget_mb * 2**20:
        return rows
    fit = max(1, int(budget_mb * 2**20 // (chunk_rows * row_nbytes)))  # whole chunks within the budget
    fit = min(fit, rows // chunk_rows) or 1
    for k in range(fit, 0, -1):
        counts = naive_batch_counts(k * chunk_rows, chunk_rows, world_size=world_size, batch_size=batch_size)
        if len(set(counts)) > 1:
            return k * chunk_rows
    return min(rows, fit * chunk_rows)


class NaiveChunkSplit(IterableDataset):
    """Chunks dealt round-robin to ranks (and, inside a rank, to DataLoader workers); each reader cuts its
    rows into batches in chunk order. Yields ``{name: tensor}`` batches plus ``"index"`` (row numbers).
    Use with ``DataLoader(dataset, batch_size=None)``; the rank comes from ``torch.distributed``.
    ``rows``: use only the first ``rows`` rows (a whole number of chunks, or all rows).
    ``split_by_worker=False``: the common slip of an ``IterableDataset`` that looks only at its rank, so every
    DataLoader worker yields the rank's whole share (each row once per worker; lesson 02 shows it)."""

    def __init__(
        self,
        source,
        *,
        batch_size: int,
        variables: Sequence[str] | None = None,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        rows: int | None = None,
        split_by_worker: bool = True,
    ):
        from zarrtorch import open_arrays
        from zarrtorch.layout import check_first_axis_layout, restrict_rows

        self.arrays = open_arrays(source, variables)
        self.layout = check_first_axis_layout(self.arrays)
        if rows is not None:
            _, self.layout = restrict_rows(self.layout, (0, rows))
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self.rank, self.world_size = rank, world_size
        self.split_by_worker = bool(split_by_worker)

    def _topology(self) -> tuple[int, int]:
        if self.rank is not None:
            return int(self.rank), int(self.world_size)
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def chunks(self) -> np.ndarray:
        """The chunks this process reads (its rank's share, split again across DataLoader workers)."""
        rank, world = self._topology()
        mine = naive_rank_chunks(self.layout.n_chunks, rank, world)
        info = get_worker_info() if self.split_by_worker else None
        return mine[info.id :: info.num_workers] if info is not None else mine

    def __len__(self) -> int:
        rank, world = self._topology()
        return naive_batch_counts(
            self.layout.rows,
            self.layout.chunk_rows,
            world_size=world,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
        )[rank]

    def __iter__(self):
        rows, chunk_rows, b = self.layout.rows, self.layout.chunk_rows, self.batch_size
        pending: list[dict[str, np.ndarray]] = []
        held = 0
        for c in self.chunks():
            lo, hi = int(c) * chunk_rows, min(rows, (int(c) + 1) * chunk_rows)
            part = {name: arr[lo:hi] for name, arr in self.arrays.items()}
            part["index"] = np.arange(lo, hi, dtype=np.int64)
            pending.append(part)
            held += hi - lo
            while held >= b:
                joined = {k: np.concatenate([p[k] for p in pending]) for k in pending[0]}
                yield {k: torch.from_numpy(np.ascontiguousarray(v[:b])) for k, v in joined.items()}
                pending, held = [{k: v[b:] for k, v in joined.items()}], held - b
        if held and not self.drop_last:
            joined = {k: np.concatenate([p[k] for p in pending]) for k in pending[0]}
            yield {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in joined.items()}


# ---------------------------------------------------------------------------------------------------------
# One rank
# ---------------------------------------------------------------------------------------------------------
class TinyModel(torch.nn.Module):
    """One 3x3 convolution from the input channels to one output field."""

    def __init__(self, in_channels: int):
        super().__init__()
        self.conv = torch.nn.Conv2d(in_channels, 1, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)[:, 0]


def _first_line(exc: BaseException, limit: int = 160) -> str:
    """The first line of an exception's message without the C++ source location gloo puts in front."""
    text = str(exc).strip().splitlines()
    line = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", text[0] if text else "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def run_rank(
    *,
    split: str,
    rank: int,
    world_size: int,
    init_method: str,
    store: str,
    batch_size: int = 32,
    num_workers: int = 0,
    timeout_s: float = 10.0,
    seed: int = 0,
    epochs: int = 1,
    inputs: str = "fields",
    target: str = "target",
    rows: int | None = None,
) -> dict:
    """Join the process group, train ``epochs`` epochs on the first ``rows`` rows (default: all), and return
    this rank's summary (never raises for a collective that fails: the failure is the result)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
    )
    summary = {
        "split": split,
        "rank": rank,
        "world_size": world_size,
        "batch_size": batch_size,
        "num_workers": num_workers,
        "epochs": epochs,
        "rows": rows,
    }
    if split == "naive":
        dataset = NaiveChunkSplit(store, batch_size=batch_size, variables=[inputs, target], rows=rows)
        loader = DataLoader(dataset, batch_size=None, num_workers=num_workers)
    else:
        from zarrtorch import ZarrDataLoader, ZarrIterableDataset

        window = None if rows is None else (0, int(rows))
        dataset = ZarrIterableDataset(store, variables=[inputs, target], seed=seed, return_index=True, row_range=window)
        loader = ZarrDataLoader(dataset, batch_size=batch_size, drop_last=True, num_workers=num_workers)
    in_channels = int(dataset.arrays[inputs].shape[1])
    model = DistributedDataParallel(TinyModel(in_channels))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    planned = len(loader)
    summary.update(
        batches_planned=planned * epochs,
        batches_done=0,
        rows_read=0,
        status="ok",
        error_type=None,
        error=None,
        loss=None,
    )
    seen: list[np.ndarray] = []
    try:
        for epoch in range(epochs):
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)
            for batch in loader:
                x, y = batch[inputs], batch[target]
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()  # DDP all-reduces the gradients here: every rank must take part
                opt.step()
                summary["batches_done"] += 1
                summary["rows_read"] += len(x)
                summary["loss"] = round(float(loss), 4)
                if epoch == 0:
                    seen.append(batch["index"].numpy())
        if split == "zarrtorch":  # one more collective: who read which rows in epoch 0
            mine = np.concatenate(seen) if seen else np.zeros(0, dtype=np.int64)
            gathered: list = [None] * world_size
            dist.all_gather_object(gathered, mine.tolist())
            every = np.concatenate([np.asarray(g, dtype=np.int64) for g in gathered])
            summary["rows_all_ranks"] = int(len(every))
            summary["rows_read_twice"] = int(len(every) - len(np.unique(every)))
    except Exception as exc:  # the collective of the extra batch: lost peer or timeout
        summary.update(status="error", error_type=type(exc).__name__, error=_first_line(exc))
    summary["elapsed_s"] = round(time.perf_counter() - t0, 2)
    if summary["status"] == "ok":
        dist.destroy_process_group()
    return summary


# ---------------------------------------------------------------------------------------------------------
# The launcher
# ---------------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(
    split: str,
    *,
    world_size: int = 2,
    store=None,
    batch_size: int = 32,
    num_workers: int = 0,
    timeout_s: float = 10.0,
    seed: int = 0,
    epochs: int = 1,
    inputs: str = "fields",
    target: str = "target",
    python: str | None = None,
    wall_limit_s: float | None = None,
    rows: int | None = None,
) -> list[dict]:
    """Start ``world_size`` rank processes on 127.0.0.1 and return their summaries, rank by rank.

    ``rows``: train on the first ``rows`` rows only (see :func:`demo_rows`). A rank that dies without a
    summary is reported with ``status="crashed"``, its exit code and the end of its stderr; ranks still
    running after ``wall_limit_s`` (default: a generous multiple of ``timeout_s``) are killed and reported
    with ``status="killed"``. Every summary has ``elapsed_s`` (for those two, the time until the launcher
    gave up on the rank).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if store is None:
        from zarrtorch.course.synthetic import ensure_data

        store = ensure_data()["train"]
    init_method = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    args = [
        python or sys.executable,
        "-m",
        "zarrtorch.course.ddp_demo",
        "--split",
        split,
        "--world-size",
        str(world_size),
        "--store",
        os.fspath(store),
        "--batch-size",
        str(batch_size),
        "--num-workers",
        str(num_workers),
        "--timeout",
        str(timeout_s),
        "--seed",
        str(seed),
        "--epochs",
        str(epochs),
        "--inputs",
        inputs,
        "--target",
        target,
        "--init-method",
        init_method,
    ]
    if rows is not None:
        args += ["--rows", str(int(rows))]
    started = time.perf_counter()
    procs = [
        subprocess.Popen(args + ["--rank", str(r)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(world_size)
    ]
    deadline = time.monotonic() + (wall_limit_s if wall_limit_s is not None else 4 * timeout_s + 90)
    results = []
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            results.append(
                {
                    "split": split,
                    "rank": r,
                    "status": "killed",
                    "stderr_tail": err[-2000:],
                    "elapsed_s": round(time.perf_counter() - started, 2),
                }
            )
            continue
        lines = [ln[len(RESULT_PREFIX) :] for ln in out.splitlines() if ln.startswith(RESULT_PREFIX)]
        if lines:
            results.append(json.loads(lines[-1]))
        else:
            results.append(
                {
                    "split": split,
                    "rank": r,
                    "status": "crashed",
                    "returncode": p.returncode,
                    "stderr_tail": err[-2000:],
                    "elapsed_s": round(time.perf_counter() - started, 2),
                }
            )
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zarrtorch.course.ddp_demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--split", choices=SPLITS, required=True)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--store", default=None, help="training store (default: the course's train.zarr)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--timeout", type=float, default=10.0, help="gloo collective timeout in seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--inputs", default="fields")
    p.add_argument("--target", default="target")
    p.add_argument("--rows", type=int, default=None, help="train on the first ROWS rows only (whole chunks)")
    p.add_argument("--rank", type=int, default=None, help="run one rank (used by the launcher)")
    p.add_argument("--init-method", default=None, help="tcp://host:port (used by the launcher)")
    a = p.parse_args(argv)
    common = dict(
        split=a.split,
        world_size=a.world_size,
        batch_size=a.batch_size,
        num_workers=a.num_workers,
        timeout_s=a.timeout,
        seed=a.seed,
        epochs=a.epochs,
        inputs=a.inputs,
        target=a.target,
        rows=a.rows,
    )
    if a.rank is None:
        results = launch(store=a.store, **common)
        for res in results:
            print(json.dumps(res))
        return 0 if all(r["status"] == "ok" for r in results) else 1
    if a.init_method is None or a.store is None:
        p.error("--rank needs --init-method and --store")
    summary = run_rank(rank=a.rank, init_method=a.init_method, store=a.store, **common)
    print(RESULT_PREFIX + json.dumps(summary), flush=True)
    # a rank whose peer is gone must not wait in the process group's shutdown
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
