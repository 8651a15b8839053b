"""Run zarr-torch-dataset 0.0.9 (import name ``zarrdataset``) and zarrtorch side by side on the course data,
in real processes: the appendix notebook ``A1_from_zarr_torch_dataset`` uses it.

Each rank is a separate Python process that joins a gloo process group on 127.0.0.1, builds one library's
loader, and

1. iterates ``epochs`` epochs without any collective, recording the row numbers of every batch (the
   reference library gets ``targets=np.arange(rows)``, so its targets *are* the row numbers; zarrtorch
   returns them as ``"index"``);
2. optionally trains one more epoch of a one-layer model under ``DistributedDataParallel``: every
   ``backward()`` all-reduces the gradients, so a rank with one batch more than its peer blocks there until
   gloo reports the lost peer or its timeout (``timeout_s``).

Every run is bounded: the gloo timeout, and a wall limit after which the launcher kills what is left.

    python -m zarrtorch.course.reference_compare --library reference --num-workers 2 --context spawn
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import timedelta

import numpy as np
import torch

RESULT_PREFIX = "ZARRTORCH-REFERENCE-COMPARE "
LIBRARIES = ("reference", "zarrtorch")


def reference_loader(
    store,
    *,
    batch_size: int,
    drop_last: bool,
    num_workers: int,
    context: str | None,
    seed: int = 0,
    array: str = "fields",
):
    """zarr-torch-dataset's loader as its README shows it (chunk shuffle with a shared seed, buffer shuffle),
    with the row numbers as targets. Batches are ``(samples, row numbers)``."""
    import zarr
    from zarrdataset import ZarrDataLoader, ZarrIterableDataset

    samples = zarr.open_group(str(store), mode="r")[array]
    ds = ZarrIterableDataset(
        samples=samples,
        targets=np.arange(samples.shape[0]),
        shuffle_chunks=True,
        chunks_shuffle_seed=seed,
        shuffle_buffer=True,
        buffer_shuffle_seed=seed,
    )
    return ZarrDataLoader(
        dataset=ds,
        num_workers=num_workers,
        batch_size=batch_size,
        drop_last=drop_last,
        multiprocessing_context=context if num_workers else None,
    )


def zarrtorch_loader(
    store,
    *,
    batch_size: int,
    drop_last: bool,
    num_workers: int,
    context: str | None,
    seed: int = 0,
    array: str = "fields",
):
    """zarrtorch's loader on the same array, with the row numbers (``"index"``)."""
    from zarrtorch import ZarrDataLoader, ZarrIterableDataset

    ds = ZarrIterableDataset(store, variables=[array], seed=seed, return_index=True)
    extra = {"multiprocessing_context": context} if num_workers and context else {}
    return ZarrDataLoader(ds, batch_size=batch_size, drop_last=drop_last, num_workers=num_workers, **extra)


def split_batch(library: str, batch, array: str = "fields") -> tuple[torch.Tensor, np.ndarray]:
    """(samples, row numbers) of one batch of either library."""
    if library == "reference":
        x, rows = batch
        return x, rows.numpy().astype(np.int64)
    return batch[array], batch["index"].numpy()


def run_rank(
    *,
    library: str,
    rank: int,
    world_size: int,
    init_method: str,
    store: str,
    batch_size: int = 32,
    drop_last: bool = True,
    num_workers: int = 0,
    context: str | None = None,
    epochs: int = 1,
    train: bool = False,
    timeout_s: float = 5.0,
    seed: int = 0,
) -> dict:
    """Join the process group, record ``epochs`` epochs of row numbers, then (``train``) one epoch of DDP."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if library not in LIBRARIES:
        raise ValueError(f"library must be one of {LIBRARIES}, got {library!r}")
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
    )
    make = reference_loader if library == "reference" else zarrtorch_loader
    loader = make(
        store, batch_size=batch_size, drop_last=drop_last, num_workers=num_workers, context=context, seed=seed
    )
    summary: dict = {
        "library": library,
        "rank": rank,
        "world_size": world_size,
        "num_workers": num_workers,
        "context": context,
        "epochs": [],
    }
    for epoch in range(epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        rows = [split_batch(library, b)[1] for b in loader]
        summary["epochs"].append({"batches": len(rows), "rows": np.concatenate(rows).tolist() if rows else []})
    if train:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epochs)
        model = DistributedDataParallel(torch.nn.Conv2d(4, 1, kernel_size=3, padding=1))
        opt = torch.optim.SGD(model.parameters(), lr=1e-6)
        result = {"status": "ok", "batches_done": 0, "error": None}
        try:
            for batch in loader:
                x, _ = split_batch(library, batch)
                loss = model(x).pow(2).mean()  # a stand-in loss: only the gradients' all-reduce matters here
                opt.zero_grad()
                loss.backward()  # every rank must enter this all-reduce the same number of times
                opt.step()
                result["batches_done"] += 1
        except Exception as exc:  # the all-reduce of an extra batch: lost peer or timeout
            result.update(status="error", error=f"{type(exc).__name__}: {_first_line(exc)}")
        summary["train"] = result
    summary["elapsed_s"] = round(time.perf_counter() - t0, 2)
    return summary


def _first_line(exc: BaseException, limit: int = 120) -> str:
    import re

    text = str(exc).strip().splitlines()
    line = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", text[0] if text else "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def launch(
    library: str,
    *,
    store,
    world_size: int = 2,
    batch_size: int = 32,
    drop_last: bool = True,
    num_workers: int = 0,
    context: str | None = None,
    epochs: int = 1,
    train: bool = False,
    timeout_s: float = 5.0,
    seed: int = 0,
    wall_limit_s: float = 60.0,
) -> list[dict]:
    """Start ``world_size`` rank processes on 127.0.0.1; return their summaries, rank by rank. A rank that
    dies without a summary is reported with ``status="crashed"``; ranks still running after ``wall_limit_s``
    are killed and reported with ``status="killed"``."""
    from zarrtorch.course.ddp_demo import free_port

    init_method = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    args = [
        sys.executable,
        "-m",
        "zarrtorch.course.reference_compare",
        "--library",
        library,
        "--world-size",
        str(world_size),
        "--store",
        os.fspath(store),
        "--batch-size",
        str(batch_size),
        "--num-workers",
        str(num_workers),
        "--epochs",
        str(epochs),
        "--timeout",
        str(timeout_s),
        "--seed",
        str(seed),
        "--init-method",
        init_method,
    ]
    args += ["--context", context] if context else []
    args += [] if drop_last else ["--keep-last"]
    args += ["--train"] if train else []
    procs = [
        subprocess.Popen(args + ["--rank", str(r)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(world_size)
    ]
    deadline = time.monotonic() + wall_limit_s
    results = []
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            results.append({"library": library, "rank": r, "status": "killed", "stderr_tail": err[-2000:]})
            continue
        lines = [ln[len(RESULT_PREFIX) :] for ln in out.splitlines() if ln.startswith(RESULT_PREFIX)]
        if lines:
            results.append({"status": "ok", **json.loads(lines[-1])})
        else:
            results.append(
                {
                    "library": library,
                    "rank": r,
                    "status": "crashed",
                    "returncode": p.returncode,
                    "stderr_tail": err[-2000:],
                }
            )
    return results


def reference_rows_per_rank(rows: int, chunk_rows: int, world_size: int, seed: int = 0) -> list[int]:
    """Rows each rank of zarr-torch-dataset 0.0.9 yields (``num_workers <= 1``, ``chunks_shuffle_seed=seed``),
    computed without running it, as its ``_fill_buffers`` does: the chunks in the seed's permutation are
    dealt in contiguous runs, the first ``n_chunks % world_size`` ranks getting one chunk more, and those
    ranks drop the last ``chunk_rows`` rows of their buffer. A partial last chunk, wherever the permutation
    puts it, leaves its rank with fewer rows."""
    n_chunks = -(-rows // chunk_rows)  # the last chunk may be partial
    order = np.random.Generator(np.random.PCG64(seed)).permutation(np.arange(n_chunks))
    sizes = np.minimum(chunk_rows, rows - order * chunk_rows)  # rows of each chunk, in the permuted order
    base, extra = divmod(n_chunks, world_size)
    out, start = [], 0
    for r in range(world_size):
        count = base + (r < extra)
        out.append(int(sizes[start : start + count].sum()) - (chunk_rows if r < extra else 0))
        start += count
    return out


COMPARISON_BUDGET_MB = 1024  # the reference reads everything in every process: at most this much per process


def comparison_rows(
    rows: int,
    chunk_rows: int,
    row_nbytes: int,
    *,
    batch_size: int,
    world_size: int = 2,
    seed: int = 0,
    budget_mb: float = COMPARISON_BUDGET_MB,
) -> int:
    """How many of the first rows the comparison uses: all of them when they fit ``budget_mb`` (decoded), else
    whole chunks plus half a chunk (a partial last chunk, as the course stores have), the largest that fits
    and still deals the reference's ranks unequal batch counts (what the appendix shows)."""
    if rows * row_nbytes <= budget_mb * 2**20:
        return rows
    fit = max(1, min(int(budget_mb * 2**20 // (chunk_rows * row_nbytes)), rows // chunk_rows) - 1)
    for k in range(fit, 0, -1):
        n = k * chunk_rows + chunk_rows // 2
        if len({r // batch_size for r in reference_rows_per_rank(n, chunk_rows, world_size, seed=seed)}) > 1:
            return n
    return fit * chunk_rows + chunk_rows // 2


def comparison_store(
    store, *, batch_size: int, world_size: int = 2, seed: int = 0, budget_mb: float = COMPARISON_BUDGET_MB, out_dir=None
):
    """The store itself when it fits the budget, else a copy of its first :func:`comparison_rows` rows written
    once (same chunks) in ``out_dir`` (default: beside the store; a hub's shared data may be read-only), so
    that no process holds more than the budget of the reference's rows."""
    from pathlib import Path

    import xarray as xr

    from zarrtorch import prepare_zarr

    store = Path(store)
    ds = xr.open_zarr(store)
    names = sorted(ds.data_vars)  # the data, not the coordinates
    first = ds[names[0]]
    dim, chunk_rows = first.dims[0], first.encoding["chunks"][0]
    row_nbytes = sum(ds[n].dtype.itemsize * int(np.prod(ds[n].shape[1:])) for n in names)
    rows = comparison_rows(
        first.shape[0],
        chunk_rows,
        row_nbytes,
        batch_size=batch_size,
        world_size=world_size,
        seed=seed,
        budget_mb=budget_mb,
    )
    if rows == first.shape[0]:
        return store
    target = Path(out_dir or store.parent) / f"{store.stem}_first_{rows}_rows.zarr"
    if not (target / "zarr.json").exists():
        prepare_zarr(
            ds.isel({dim: slice(0, rows)}),
            target,
            chunk_rows=chunk_rows,
            variables=names,
            overwrite=True,
            progress=False,
        )
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m zarrtorch.course.reference_compare", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--library", choices=LIBRARIES, required=True)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--store", default=None, help="training store (default: the course's train.zarr)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--keep-last", action="store_true", help="drop_last=False")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--context", default=None, help="fork | spawn | forkserver (DataLoader workers)")
    p.add_argument("--epochs", type=int, default=1, help="epochs recorded before training")
    p.add_argument("--train", action="store_true", help="then train one epoch under DDP")
    p.add_argument("--timeout", type=float, default=5.0, help="gloo collective timeout in seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rank", type=int, default=None, help="run one rank (used by the launcher)")
    p.add_argument("--init-method", default=None, help="tcp://host:port (used by the launcher)")
    a = p.parse_args(argv)
    common = dict(
        world_size=a.world_size,
        batch_size=a.batch_size,
        drop_last=not a.keep_last,
        num_workers=a.num_workers,
        context=a.context,
        epochs=a.epochs,
        train=a.train,
        timeout_s=a.timeout,
        seed=a.seed,
    )
    store = a.store
    if store is None:
        from zarrtorch.course.synthetic import ensure_data

        store = str(ensure_data()["train"])
    if a.rank is None:
        for res in launch(a.library, store=store, **common):
            print(json.dumps({k: v for k, v in res.items() if k != "epochs"}))
        return 0
    if a.init_method is None:
        p.error("--rank needs --init-method")
    summary = run_rank(library=a.library, rank=a.rank, init_method=a.init_method, store=store, **common)
    print(RESULT_PREFIX + json.dumps(summary), flush=True)
    sys.stdout.flush()
    os._exit(0)  # a rank whose peer is gone must not wait in the process group's shutdown


if __name__ == "__main__":
    raise SystemExit(main())
