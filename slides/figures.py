"""The workshop deck's figures and numbers, computed by zarrtorch from the generated data.

Run by ``slides/build.py`` (``make slides``); also runnable alone::

    .venv/bin/python slides/figures.py --out /tmp/figs      # writes PNGs + values.json

Nothing here is typed in: every figure and every number the deck shows comes out of a function below.

- ``data_map.png``: the synthetic data (``zarrtorch.course.synthetic``, tiny preset): two fields at one step and a
  year of temperature at one grid point.
- ``partition.png``: which rows every (rank, worker) reads in two epochs (``zarrtorch.plan.epoch_plan``).
- ``stream_order.png``, ``shuffle_quality.png``: how shuffled the batches are, without reading data
  (``ZarrIterableDataset.batch_row_ids`` + ``zarrtorch.quality``), against the buffer's memory.
- ``chunk_tradeoff.png``: measured read rate against chunk length (the tiny data rewritten at each length)
  next to shuffle quality for the same buffer memory.
- numbers without a figure: the memory a reading process holds (``worker_memory_bytes``, from disk and by URL),
  lesson 07's requests in flight and the data requests of an epoch as chunks and as shards (the tiny data served
  by ``zarrtorch.course.servers.HttpStoreServer``, counted there), appendix A1's batches per rank of
  zarr-torch-dataset (``reference_rows_per_rank``) against zarrtorch's plan, and the Slurm template's lines.
- ``peers.png``: the figure of the reference page ``docs/peers.md``, rows/s against held memory per loader, with the
  loaders that kept every guarantee on its store (``zarrtorch.course.peers_table``), read from ``make bench-peers``'s
  committed ``benchmarks/peers.json``.
- ``throughput.png``: measured loader throughput (row-by-row Dataset vs ZarrDataLoader vs raw decode), taken
  from ``benchmarks/results/latest.json`` when it exists and is readable, else measured here on tiny data.

Timings are real and taken on whatever machine builds the deck; the deck says which machine and when.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from zarrtorch import (
    ReadOptions,
    available_cpus,  # noqa: E402
)
from zarrtorch._util.sizes import ceil_div  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BENCH_JSON = REPO / "benchmarks" / "results" / "latest.json"

# one colour per (rank, worker) in the partition figure; grey for rows left out
PAIR_COLOURS = ["#1f77b4", "#6baed6", "#d62728", "#fc9272"]
LEFT_OUT = "#d9d9d9"
DPI = 110

plt.rcParams.update(
    {
        "font.size": 13,
        "axes.titlesize": 14,
        "axes.labelsize": 13,
        "legend.fontsize": 11,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "figure.dpi": DPI,
    }
)


def _save(fig, out: Path, name: str) -> str:
    path = out / name
    fig.savefig(path, dpi=DPI, bbox_inches="tight", facecolor="white")
    plt.close(fig)
    return name


METADATA_ONLY = ReadOptions(missing_chunks="fill")  # for a store with no chunk written (none is read)


def _metadata_arrays(rows: int, chunk_rows: int, row_shape=(32, 64)) -> dict:
    """In-memory Zarr arrays with a dataset's shape and chunking but no chunk written: enough for the
    loader's plan and shuffle schedule, which never look at the data."""
    import zarr

    store = zarr.storage.MemoryStore()
    group = zarr.open_group(store, mode="w", zarr_format=3)
    return {
        "fields": group.create_array(
            "fields", shape=(rows, 4, *row_shape), chunks=(chunk_rows, 4, *row_shape), dtype="float32"
        ),
        "target": group.create_array(
            "target", shape=(rows, *row_shape), chunks=(chunk_rows, *row_shape), dtype="float32"
        ),
    }


# ---------------------------------------------------------------------------------------------------------
# The data
# ---------------------------------------------------------------------------------------------------------
def data_facts() -> dict:
    """Sizes of the three presets and the layout of the generated tiny stores (read from their metadata)."""
    import zarr

    from zarrtorch.course import paths, synthetic

    v: dict = {}
    for name, p in synthetic.PRESETS.items():
        v[f"{name}_rows"] = f"{p.n_time:,}"
        v[f"{name}_grid"] = f"{p.n_lat} x {p.n_lon}"
        v[f"{name}_sample_kib"] = f"{p.sample_nbytes / 2**10:.0f}"
        v[f"{name}_gb"] = f"{p.nbytes / 1e9:.2f}" if p.nbytes < 1e9 else f"{p.nbytes / 1e9:.1f}"
        v[f"{name}_chunk_rows"] = str(synthetic.TRAIN_CHUNK_ROWS.get(name, 64))
        v[f"{name}_chunk_mib"] = f"{synthetic.TRAIN_CHUNK_ROWS.get(name, 64) * p.sample_nbytes / 2**20:.1f}"
    archive = zarr.open_group(str(paths.archive_path("tiny")), mode="r")
    train = zarr.open_group(str(paths.train_store_path("tiny")), mode="r")
    a, t = archive["fields"], train["fields"]
    v["archive_chunks"] = "(" + ", ".join(map(str, a.chunks)) + ")"
    v["train_chunks"] = "(" + ", ".join(map(str, t.chunks)) + ")"
    v["fields_shape"] = "(" + ", ".join(map(str, t.shape)) + ")"
    # how many stored chunks one sample (every variable of one time step, plus its target) touches
    per_sample_archive = int(np.prod([s // c for s, c in zip(a.shape[1:], a.chunks[1:], strict=True)])) + 1
    v["archive_chunks_per_sample"] = str(per_sample_archive)
    v["archive_chunk_rows"] = str(a.chunks[0])
    # what the loader says about the archive layout (its layout check, word for word)
    from zarrtorch import LayoutError, check_first_axis_layout

    try:
        check_first_axis_layout({"fields": a, "target": archive["target"]})
        v["archive_verdict"] = "accepted"
    except LayoutError as exc:
        v["archive_verdict"] = str(exc).split(":")[0].strip()
    v["archive_decoded_kib_per_sample"] = f"{per_sample_archive * a.chunks[0] * np.prod(a.chunks[2:]) * 4 / 2**10:,.0f}"
    v["train_decoded_kib_per_sample"] = (
        f"{t.chunks[0] * (np.prod(t.chunks[1:]) + np.prod(t.chunks[2:])) * 4 / 2**10:,.0f}"
    )
    v["train_chunk_rows"] = str(t.chunks[0])
    v["train_n_chunks"] = str(ceil_div(t.shape[0], t.chunks[0]))
    return v


def fig_data_map(out: Path) -> tuple[str, dict]:
    from zarrtorch.course.synthetic import synthetic_dataset

    ds = synthetic_dataset("tiny")
    step0 = ds["fields"].isel(time=0).compute()
    lat_i = int(np.argmin(np.abs(ds["lat"].values - 45.0)))
    series = ds["fields"].sel(variable="t").isel(lat=lat_i, lon=0).compute()
    fig = plt.figure(figsize=(13, 3.0))
    gs = fig.add_gridspec(1, 3, width_ratios=[1, 1, 1.35], wspace=0.42)
    lon, lat = ds["lon"].values, ds["lat"].values
    for k, (var, cmap, name, unit) in enumerate([("t", "RdYlBu_r", "t", "degC"), ("u", "PuOr_r", "u", "m/s")]):
        ax = fig.add_subplot(gs[0, k])
        field = step0.sel(variable=var).values
        lim = None if var == "t" else float(np.abs(field).max())
        im = ax.pcolormesh(lon, lat, field, cmap=cmap, shading="auto", vmin=-lim if lim else None, vmax=lim)
        ax.set_title(f"{name} ({unit}), {str(ds['time'].values[0])[:13].replace('T', ' ')} h")
        ax.set_xticks([0, 90, 180, 270])
        ax.set_xlabel("longitude (degrees east)")
        if k == 0:
            ax.set_ylabel("latitude (degrees north)")
        fig.colorbar(im, ax=ax, shrink=0.85)
    ax = fig.add_subplot(gs[0, 2])
    ax.plot(series["time"].values, series.values, lw=0.6, color="#444")
    ax.set_title(f"t at {lat[lat_i]:.0f}N, 0E: one year every 6 h")
    ax.set_xlabel(f"time (month of {str(series['time'].values[0])[:4]})")
    ax.set_ylabel("t (degC)")
    ax.xaxis.set_major_locator(matplotlib.dates.MonthLocator(bymonth=(1, 4, 7, 10)))
    ax.xaxis.set_major_formatter(matplotlib.dates.DateFormatter("%b"))
    return _save(fig, out, "data_map.png"), {"map_lat": f"{lat[lat_i]:.0f}"}


# ---------------------------------------------------------------------------------------------------------
# Partitioning
# ---------------------------------------------------------------------------------------------------------
PART = {"world_size": 2, "num_workers": 2, "batch_size": 32, "seed": 0}


def fig_partition(out: Path) -> tuple[str, dict]:
    """Owner (rank, worker) of every row of the tiny store in epochs 0 and 1 (drop_last=True)."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    from zarrtorch.course.synthetic import PRESETS, TRAIN_CHUNK_ROWS
    from zarrtorch.plan import epoch_plan, row_budget

    rows, chunk_rows = PRESETS["tiny"].n_time, TRAIN_CHUNK_ROWS["tiny"]
    W, NW, B = PART["world_size"], PART["num_workers"], PART["batch_size"]
    owners, batches = [], {}
    for epoch in (0, 1):
        owner = np.full(rows, -1)
        for rank in range(W):
            plan = epoch_plan(
                rows,
                chunk_rows,
                seed=PART["seed"],
                epoch=epoch,
                batch_size=B,
                drop_last=True,
                world_size=W,
                rank=rank,
                num_workers=NW,
            )
            for wp in plan.workers:
                for lo, hi in wp.pieces:
                    owner[lo:hi] = rank * NW + wp.worker
                batches[(rank, wp.worker)] = len(wp.batch_sizes)
        owners.append(owner)
    assert all(
        (o >= 0).sum() == W * row_budget(rows, world_size=W, batch_size=B, drop_last=True).rows_per_rank for o in owners
    )
    cmap = ListedColormap([LEFT_OUT] + PAIR_COLOURS)
    fig, axes = plt.subplots(2, 1, figsize=(13, 3.6), sharex=True)
    for epoch, (ax, owner) in enumerate(zip(axes, owners, strict=True)):
        ax.imshow(
            (owner + 1)[None, :],
            aspect="auto",
            cmap=cmap,
            vmin=0,
            vmax=len(PAIR_COLOURS),
            interpolation="nearest",
            extent=(0, rows, 0, 1),
        )
        for c in range(0, rows + 1, chunk_rows):
            ax.axvline(c, color="white", lw=1.2)
        ax.set_yticks([0.5], [f"epoch {epoch}"])
        ax.spines[["left", "bottom"]].set_visible(False)
        ax.tick_params(left=False)
    axes[-1].set_xlabel(f"row of the store (time step); white lines: chunk boundaries every {chunk_rows} rows")
    handles = [
        Patch(color=PAIR_COLOURS[r * NW + w], label=f"rank {r} / worker {w}: {batches[(r, w)]} batches")
        for r in range(W)
        for w in range(NW)
    ]
    handles.append(Patch(color=LEFT_OUT, label="left out this epoch"))
    fig.legend(handles=handles, loc="lower center", ncol=3, bbox_to_anchor=(0.5, -0.22), frameon=False)
    budget = row_budget(rows, world_size=W, batch_size=B, drop_last=True)
    pad = row_budget(rows, world_size=W, batch_size=B, drop_last=False)
    from zarrtorch.course.ddp_demo import naive_batch_counts  # chunks dealt round-robin to ranks, the usual first try

    naive = naive_batch_counts(rows, chunk_rows, world_size=W, batch_size=B, drop_last=False)
    naive_dl = naive_batch_counts(rows, chunk_rows, world_size=W, batch_size=B, drop_last=True)
    values = {
        "part_rows": f"{rows:,}",
        "part_chunk_rows": str(chunk_rows),
        "part_n_chunks": str(ceil_div(rows, chunk_rows)),
        "part_last_chunk_rows": str(rows - chunk_rows * (rows // chunk_rows)),
        "part_world": str(W),
        "part_workers": str(NW),
        "part_batch": str(B),
        "part_batches_per_rank": str(budget.batches_per_rank),
        "part_rows_per_rank": str(budget.rows_per_rank),
        "part_dropped": str(budget.dropped_rows),
        "part_ws_times_b": str(W * B),
        "part_eval_batches": str(pad.batches_per_rank),
        "part_eval_padding": str(pad.padding_rows),
        "part_eval_last_batch": str(pad.last_batch_size),
        "part_eval_rows_per_rank": str(pad.rows_per_rank),
        "part_worker_batches": ", ".join(str(batches[(0, w)]) for w in range(NW)),
        "naive_counts": " vs ".join(map(str, naive)),
        "naive_counts_drop_last": " vs ".join(map(str, naive_dl)),
    }
    return _save(fig, out, "partition.png"), values


# ---------------------------------------------------------------------------------------------------------
# Shuffling (row ids only: no I/O)
# ---------------------------------------------------------------------------------------------------------
def _batches(arrays, *, shuffle=True, buffer_chunks=8, world_size=1, num_workers=0, batch_size=64, epoch=0):
    from zarrtorch import ZarrIterableDataset

    ds = ZarrIterableDataset(arrays, shuffle=shuffle, seed=0, buffer_chunks=buffer_chunks, read=METADATA_ONLY)
    return ds, ds.batch_row_ids(
        epoch=epoch, rank=0, world_size=world_size, num_workers=num_workers, batch_size=batch_size, drop_last=True
    )


def fig_stream_order(out: Path) -> tuple[str, dict]:
    """Row number against position in the stream, for the tiny store (one rank, one stream)."""
    from zarrtorch.course import paths
    from zarrtorch.quality import perfect_shuffle_batches

    store = str(paths.train_store_path("tiny"))
    cases = [
        ("no shuffle", dict(shuffle=False)),
        ("chunk order only\n(buffer: 1 chunk)", dict(buffer_chunks=1)),
        ("chunk order +\nbuffer of 8 chunks", dict(buffer_chunks=8)),
    ]
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.7), sharey=True)
    rows = None
    for ax, (title, kw) in zip(axes[: len(cases)], cases, strict=True):
        ds, b = _batches(store, batch_size=32, **kw)
        rows = ds.rows
        stream = np.concatenate(b)
        ax.scatter(np.arange(len(stream)), stream, s=1.5, color="#1f77b4", rasterized=True)
        ax.set_title(title, fontsize=12)
    perfect = np.concatenate(perfect_shuffle_batches(rows, 32))
    axes[3].scatter(np.arange(len(perfect)), perfect, s=1.5, color="#777", rasterized=True)
    axes[3].set_title("perfect shuffle\n(reference)", fontsize=12)
    axes[0].set_ylabel("row number (time)")
    for ax in axes:
        ax.set_xlabel("position in the epoch")
    return _save(fig, out, "stream_order.png"), {}


SHUFFLE = {"world_size": 2, "num_workers": 2, "batch_size": 64}
BUFFERS = (1, 2, 4, 8, 16, 32, 64)


def fig_shuffle_quality(out: Path) -> tuple[str, dict]:
    """Chunk diversity and order correlation against buffer size, on the `small` dataset's shape."""
    from zarrtorch.course.synthetic import PRESETS, TRAIN_CHUNK_ROWS
    from zarrtorch.quality import perfect_shuffle_batches, shuffle_quality

    p = PRESETS["small"]
    rows, chunk_rows = p.n_time, TRAIN_CHUNK_ROWS["small"]
    arrays = _metadata_arrays(rows, chunk_rows, (p.n_lat, p.n_lon))
    div, corr, mem = [], [], []
    for bc in BUFFERS:
        ds, b = _batches(arrays, buffer_chunks=bc, **SHUFFLE)
        q = shuffle_quality(b, rows, chunk_rows)
        div.append(q.chunk_diversity)
        corr.append(q.order_correlation)
        mem.append(ds.worker_memory_bytes(decode_threads=1) / 2**20)
    _, b0 = _batches(arrays, shuffle=False, **SHUFFLE)
    q0 = shuffle_quality(b0, rows, chunk_rows)
    qp = shuffle_quality(perfect_shuffle_batches(rows, SHUFFLE["batch_size"]), rows, chunk_rows)

    fig, ax = plt.subplots(figsize=(11, 4.6))
    x = np.arange(len(BUFFERS))
    ax.plot(
        x,
        div,
        "o-",
        color="#1f77b4",
        lw=2,
        label=f"chunk diversity (perfect shuffle {qp.chunk_diversity:.2f}, none {q0.chunk_diversity:.2f})",
    )
    ax.plot(
        x,
        corr,
        "s-",
        color="#d62728",
        lw=2,
        label=f"order correlation (perfect shuffle {qp.order_correlation:.2f}, none {q0.order_correlation:.2f})",
    )
    ax.axhline(1.0, color="#777", ls="--", lw=1)
    ax.axhline(0.0, color="#777", ls="-", lw=0.6)
    ax.set_xticks(x, [f"{bc}\n{m:.0f} MiB" for bc, m in zip(BUFFERS, mem, strict=True)])
    ax.set_xlabel("buffer_chunks (and decoded memory per worker)")
    ax.set_ylabel("chunk diversity (x a perfect shuffle's)\norder correlation (-1 to 1)")
    ax.set_ylim(-0.15, 1.1)
    ax.legend(loc="upper left", frameon=False)
    ax.set_title(
        f"rank 0 of {SHUFFLE['world_size']}, {SHUFFLE['num_workers']} workers, batch "
        f"{SHUFFLE['batch_size']}: {rows:,} rows in {ceil_div(rows, chunk_rows)} chunks of {chunk_rows}",
        fontsize=12,
    )
    values = {
        "sq_rows": f"{rows:,}",
        "sq_chunks": str(ceil_div(rows, chunk_rows)),
        "sq_chunk_rows": str(chunk_rows),
        "sq_noshuffle_div": f"{q0.chunk_diversity:.2f}",
        "sq_noshuffle_corr": f"{q0.order_correlation:.2f}",
        "sq_perfect_div": f"{qp.chunk_diversity:.2f}",
        "sq_perfect_corr": f"{qp.order_correlation:.2f}",
    }
    for bc, d, c, m in zip(BUFFERS, div, corr, mem, strict=True):
        values[f"sq_div_{bc}"] = f"{d:.2f}"
        values[f"sq_corr_{bc}"] = f"{c:.2f}"
        values[f"sq_mem_{bc}"] = f"{m:.0f}"
    return _save(fig, out, "shuffle_quality.png"), values


# ---------------------------------------------------------------------------------------------------------
# Chunk length: read speed (measured) vs shuffle quality at equal memory (computed)
# ---------------------------------------------------------------------------------------------------------
CHUNK_LENGTHS = (8, 16, 32, 64, 128, 256)
CT_ROWS = 768  # rows of the tiny data rewritten at each chunk length (768 x 40 KiB = 30 MiB)
BUFFER_ROWS = 512  # the fixed shuffle-buffer memory of the comparison, in rows (512 x 40 KiB = 20 MiB)


def _read_all_chunks(arrays: dict, chunk_rows: int, rows: int, *, threads: int = 1, clock=time.perf_counter) -> float:
    """Seconds (of ``clock``) to decode every chunk once, in order, with zarrtorch's reader: one thread and no
    prefetch, or ``threads`` threads decoding ahead as a loader worker does."""
    from zarrtorch._read.reader import PieceReader

    pieces = np.array([[s, min(s + chunk_rows, rows)] for s in range(0, rows, chunk_rows)], dtype=np.int64)
    reader = PieceReader(
        arrays, chunk_rows, threads=threads, prefetch=1 if threads == 1 else threads + 1, check_missing=False
    )
    t0 = clock()
    for _ in reader.iter_pieces(pieces):
        pass
    return clock() - t0


def fig_chunk_tradeoff(out: Path, repeats: int = 5) -> tuple[str, dict]:
    import zarr

    from zarrtorch import prepare_zarr
    from zarrtorch.course import paths
    from zarrtorch.course.synthetic import PRESETS
    from zarrtorch.quality import shuffle_quality

    p = PRESETS["small"]
    src = zarr.open_group(str(paths.train_store_path("tiny")), mode="r")
    source = {"fields": src["fields"], "target": src["target"]}
    rows = min(CT_ROWS, src["fields"].shape[0])
    source = {name: arr[:rows] for name, arr in source.items()}  # NumPy copies: 30 MB
    with tempfile.TemporaryDirectory(prefix="zarrtorch-slides-") as tmp:
        stores = {}
        for cr in CHUNK_LENGTHS:
            g = prepare_zarr(source, Path(tmp) / f"c{cr}.zarr", chunk_rows=cr, progress=False, overwrite=True)
            stores[cr] = {n: g[n] for n in ("fields", "target")}
            _read_all_chunks(stores[cr], cr, rows)  # warm-up: first open, page cache
        # The cost is measured in CPU time of this process (all its threads): on a shared machine, wall time
        # mostly measures the neighbours. Rounds interleave the chunk lengths; the best round of each counts.
        best = {cr: float("inf") for cr in CHUNK_LENGTHS}
        for _ in range(repeats):
            for cr in CHUNK_LENGTHS:
                best[cr] = min(best[cr], _read_all_chunks(stores[cr], cr, rows, clock=time.process_time))
    rates = [rows / best[cr] for cr in CHUNK_LENGTHS]
    small_rows, quality, bufs = p.n_time, [], []
    for cr in CHUNK_LENGTHS:
        arrays = _metadata_arrays(small_rows, cr, (p.n_lat, p.n_lon))
        bc = max(1, BUFFER_ROWS // cr)
        _, b = _batches(arrays, buffer_chunks=bc, **SHUFFLE)
        quality.append(shuffle_quality(b, small_rows, cr).chunk_diversity)
        bufs.append(bc)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 3.7))
    a1.plot(CHUNK_LENGTHS, rates, "o-", color="#2ca02c", lw=2)
    a1.set_xscale("log", base=2)
    a1.set_xticks(CHUNK_LENGTHS, [str(c) for c in CHUNK_LENGTHS])
    a1.set_xlabel(f"chunk length (rows); 1 row = {p.sample_nbytes // 2**10} KiB")
    a1.set_ylabel("samples per CPU-second")
    a1.set_ylim(0, max(rates) * 1.15)
    a1.set_title(f"measured: decode {rows} rows chunk by chunk, 1 thread", fontsize=12)
    a2.plot(CHUNK_LENGTHS, quality, "o-", color="#1f77b4", lw=2)
    for cr, q, bc in zip(CHUNK_LENGTHS, quality, bufs, strict=True):
        a2.annotate(f"{bc} x {cr}", (cr, q), textcoords="offset points", xytext=(4, 8), ha="left", fontsize=10)
    a2.set_xscale("log", base=2)
    a2.set_xlim(CHUNK_LENGTHS[0] / 1.3, CHUNK_LENGTHS[-1] * 1.6)
    a2.set_xticks(CHUNK_LENGTHS, [str(c) for c in CHUNK_LENGTHS])
    a2.set_ylim(0, 1.1)
    a2.set_xlabel("chunk length (rows)")
    a2.set_ylabel("chunk diversity")
    a2.set_title(f"computed: shuffle quality, buffer fixed at {BUFFER_ROWS} rows", fontsize=12)
    values = {"ct_buffer_rows": str(BUFFER_ROWS), "ct_buffer_mib": f"{BUFFER_ROWS * p.sample_nbytes / 2**20:.0f}"}
    values["ct_rows"] = str(rows)
    values["ct_machine"] = machine(load=True)
    for cr, r, q in zip(CHUNK_LENGTHS, rates, quality, strict=True):
        values[f"ct_rate_{cr}"] = f"{r:,.0f}"
        values[f"ct_div_{cr}"] = f"{q:.2f}"
    i_best = int(np.argmax(rates))
    values["ct_rate_ratio"] = f"{max(rates) / rates[0]:.1f}"
    values["ct_best_chunk"] = str(CHUNK_LENGTHS[i_best])
    values["ct_smallest"] = str(CHUNK_LENGTHS[0])
    values["ct_largest"] = str(CHUNK_LENGTHS[-1])
    return _save(fig, out, "chunk_tradeoff.png"), values


# ---------------------------------------------------------------------------------------------------------
# Loader throughput: from the benchmark's results if there are any, else measured here
# ---------------------------------------------------------------------------------------------------------
def machine(load: bool = False) -> str:
    """The machine in words (with its current load average, which says how much the timings were disturbed)."""
    cpus = available_cpus()
    load = f", load average {os.getloadavg()[0]:.1f}" if load and hasattr(os, "getloadavg") else ""
    return f"{platform.system()} {platform.machine()}, {cpus} CPUs{load}, Python {platform.python_version()}"


def from_benchmark(path: Path = BENCH_JSON) -> dict | None:
    """Loader rates from ``make bench``'s results (``benchmarks/run.py`` writes ``latest.json``), or None when
    there is no such file or it lacks what the slide shows (then the build measures on its own)."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        meta, summary = data["meta"], data["summary"]
        one = [s for s in summary if s.get("size") == "1x"]

        def of(kind):
            return [s for s in one if s["kind"] == kind]

        def rate(s, i=0):
            return float(s["epochs"][i]["samples_per_s"])

        naive = max(of("naive"), key=rate)
        zt = max(of("zarrtorch"), key=lambda s: min(rate(s, i) for i in range(len(s["epochs"]))))
        zt_rate = min(rate(zt, i) for i in range(len(zt["epochs"])))
        l0 = max(of("l0"), key=lambda s: s["par"])
        bars = [(f"{naive['label']}\n(map-style, one row per item)", rate(naive))]
        if of("reference"):
            ref = max(of("reference"), key=lambda s: rate(s, -1))
            bars += [(f"{ref['label']}, epoch {e['epoch']}", float(e["samples_per_s"])) for e in ref["epochs"]]
        bars += [(f"{zt['label']}\n(slowest epoch)", zt_rate), (f"{l0['label']}\n(no loader)", rate(l0))]
        m, args = meta["machine"], meta["args"]
        where = f"{m.get('host', '?')} ({m.get('cpu_model') or 'CPU not recorded'}, {m.get('cpus', '?')} CPUs)"
        load = meta.get("load_average_start") or [None]
        gib = float(args["gib"])
        what = (
            f"{gib:g} GiB array, {args['chunk_rows']}-row chunks, batch {args['batch_size']}, median of "
            f"{args['repeats']}, page cache {meta.get('page_cache', '?')}"
        )
        if load[0] is not None:
            what += f", load average {load[0]:.1f} at the start"
        return {
            "row": rate(naive),
            "zarrtorch": zt_rate,
            "raw": rate(l0),
            "raw_label": l0["label"],
            "zt_label": zt["label"],
            "bars": bars,
            "source": f"make bench run started {meta['started']} on {where}: {what} (benchmarks/results/latest.json)",
        }
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        print(f"[figures] {path} not used ({type(exc).__name__}: {exc}); measuring on the tiny data instead")
        return None


def measure_loaders(epochs: int = 5, rbr_batches: int = 4) -> dict:
    """A short measurement on the tiny data: one warm-up epoch, then the best of ``epochs`` (the least
    disturbed by other work on the machine)."""
    import torch
    import zarr
    from torch.utils.data import DataLoader

    from zarrtorch import ZarrDataLoader, ZarrIterableDataset
    from zarrtorch.course import paths
    from zarrtorch.course.baselines import RowByRowDataset

    store = str(paths.train_store_path("tiny"))
    threads = 2
    ds = ZarrIterableDataset(store, seed=0, read=ReadOptions(decode_threads=threads))
    loader = ZarrDataLoader(ds, batch_size=32, drop_last=True, num_workers=0)
    g = zarr.open_group(store, mode="r")
    arrays = {k: g[k] for k in ("fields", "target")}
    chunk_rows = g["fields"].chunks[0]
    # rounds alternate a loader epoch and a raw decode with as many threads, so both see the same machine;
    # round 0 warms up (first open, page cache); the best round of each counts
    zt_best, raw_best = 0.0, 0.0
    for epoch in range(epochs + 1):
        loader.set_epoch(epoch)
        t0, n = time.perf_counter(), 0
        for batch in loader:
            n += len(batch["target"])
        zt = n / (time.perf_counter() - t0)
        raw = ds.rows / _read_all_chunks(arrays, chunk_rows, ds.rows, threads=threads)
        if epoch:
            zt_best, raw_best = max(zt_best, zt), max(raw_best, raw)
    rbr = DataLoader(
        RowByRowDataset(store), batch_size=32, shuffle=True, num_workers=0, generator=torch.Generator().manual_seed(0)
    )
    it = iter(rbr)
    next(it)  # warm-up batch
    t0, n = time.perf_counter(), 0
    for _ in range(rbr_batches):
        n += len(next(it)["target"])
    rbr_rate = n / (time.perf_counter() - t0)
    today = _dt.date.today().isoformat()
    zt_label = f"ZarrDataLoader, main process, {threads} decode threads"
    raw_label = f"zarrtorch's chunk reader alone, {threads} threads"
    bars = [
        ("map-style Dataset,\none row per __getitem__", rbr_rate),
        (f"ZarrDataLoader\nmain process, {threads} decode threads", zt_best),
        (f"no loader: decode every\nchunk in order, {threads} threads", raw_best),
    ]
    return {
        "row": rbr_rate,
        "zarrtorch": zt_best,
        "raw": raw_best,
        "raw_label": raw_label,
        "zt_label": zt_label,
        "bars": bars,
        "source": f"measured while building the deck (make slides) on {today}, {machine(load=True)}: "
        f"tiny data, batch 32, best of {epochs} rounds, page cache warm "
        "(no make bench results found)",
    }


def fig_throughput(out: Path, bench_json: Path | None = BENCH_JSON) -> tuple[str, dict]:
    perf = (from_benchmark(bench_json) if bench_json else None) or measure_loaders()
    labels = [b[0] for b in perf["bars"]]
    vals = [b[1] for b in perf["bars"]]

    def colour(label: str) -> str:
        low = label.lower()
        if "zarrtorch" in low or "zarrdataloader" in low:
            return "#1f77b4"
        if "l0" in low or "no loader" in low:
            return "#2ca02c"
        return "#ff7f0e" if "reference" in low else "#999999"

    colours = [colour(label) for label in labels]
    fig, ax = plt.subplots(figsize=(11, 0.75 * len(vals) + 1.2))
    ax.barh(labels, vals, color=colours)
    ax.set_xscale("log")
    ax.invert_yaxis()
    for y, v in enumerate(vals):
        ax.text(v * 1.08, y, f"{v:,.0f} samples/s", va="center", fontsize=12)
    ax.set_xlim(min(vals) / 2, max(vals) * 8)
    ax.set_xlabel("samples / s (log scale)")
    values = {
        "rbr_rate": f"{perf['row']:,.0f}",
        "zt_rate": f"{perf['zarrtorch']:,.0f}",
        "throughput_ratio": f"{perf['zarrtorch'] / perf['row']:,.0f}",
        "raw_rate": f"{perf['raw']:,.0f}",
        "raw_label": perf["raw_label"],
        "zt_label": perf["zt_label"],
        "perf_source": perf["source"],
    }
    return _save(fig, out, "throughput.png"), values


SLURM_TEMPLATE = REPO / "slurm" / "generic_multinode.sbatch"


def slurm_facts(path: Path = SLURM_TEMPLATE) -> dict:
    """The shape of the course's generic Slurm template, quoted from the file itself: its ``#SBATCH`` lines
    and its ``srun`` command, so the slide shows what ``sbatch`` really submits."""
    if not path.exists():
        return {"slurm_excerpt": f"# {path.relative_to(REPO)} is not in this checkout yet", "slurm_template": "slurm/"}
    lines = path.read_text().splitlines()
    keep = [line for line in lines if line.startswith("#SBATCH") and "--output" not in line and "--error" not in line]
    srun, i = [], 0
    while i < len(lines):
        if lines[i].lstrip().startswith("srun ") or srun:
            srun.append(lines[i].rstrip())
            if not lines[i].rstrip().endswith("\\"):
                break
        i += 1
    # the same command, re-wrapped to fit a slide (the words are the file's)
    import textwrap

    command = " ".join(part.rstrip("\\").strip() for part in srun)
    wrapped = textwrap.wrap(command, width=84, break_long_words=False, break_on_hyphens=False, subsequent_indent="    ")
    srun = [line + " \\" for line in wrapped[:-1]] + wrapped[-1:]
    return {"slurm_excerpt": "\n".join(keep + ["..."] + srun), "slurm_template": str(path.relative_to(REPO))}


def _metadata_store(folder: Path, rows: int, chunk_rows: int, row_shape=(32, 64)) -> Path:
    """A Zarr v3 store on disk with a dataset's shape and chunking, metadata only (consolidated, so that it
    opens by URL too): what the memory figures need, with no chunk written."""
    import zarr

    path = Path(folder) / "train.zarr"
    group = zarr.open_group(str(path), mode="w", zarr_format=3)
    group.create_array("fields", shape=(rows, 4, *row_shape), chunks=(chunk_rows, 4, *row_shape), dtype="float32")
    group.create_array("target", shape=(rows, *row_shape), chunks=(chunk_rows, *row_shape), dtype="float32")
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        zarr.consolidate_metadata(str(path))
    return path


def memory_facts() -> dict:
    """Decoded memory one reading process holds, from the loader's own ``worker_memory_bytes``, for the workshop
    dataset's shape with 2 decode threads: read from a file system (requests in flight: decode threads + 1) and
    by URL (the adaptive default's most requests in flight), served on 127.0.0.1."""
    from zarrtorch import ReadPlan, ZarrIterableDataset
    from zarrtorch.course.servers import HttpStoreServer
    from zarrtorch.course.synthetic import PRESETS, TRAIN_CHUNK_ROWS

    p = PRESETS["workshop"]
    v = {}
    with tempfile.TemporaryDirectory(prefix="zarrtorch-slides-") as tmp:
        path = _metadata_store(Path(tmp), p.n_time, TRAIN_CHUNK_ROWS["workshop"], (p.n_lat, p.n_lon))
        with HttpStoreServer(tmp) as server:
            for where, source in (("file", str(path)), ("url", f"{server.url}/{path.name}")):
                for bc in (2, 8, 32):
                    ds = ZarrIterableDataset(
                        source, buffer_chunks=bc, variables=["fields", "target"], read=METADATA_ONLY
                    )
                    v[f"ws_{where}_mem_{bc}"] = f"{ds.worker_memory_bytes(decode_threads=2) / 2**20:,.0f}"
                v[f"ws_{where}_in_flight"] = str(ReadPlan.of(ds, 0, decode_threads=2).chunks_ahead)
                v["ws_chunk_mib"] = f"{ds.chunk_rows * ds.row_bytes / 2**20:.0f}"
    return v


def object_storage_facts() -> dict:
    """Lesson 07 in numbers that do not depend on the machine: requests in flight by URL, the latency bound of
    one request at a time, and the data requests one epoch sends to a store of chunks and to a copy in shards
    of 4 chunks (the tiny data, served on 127.0.0.1 and counted by the server)."""
    import xarray as xr

    from zarrtorch import ReadPlan, ZarrDataLoader, ZarrIterableDataset, prepare_zarr
    from zarrtorch.course import paths
    from zarrtorch.course.servers import HttpStoreServer

    store = paths.train_store_path("tiny")
    v = {}
    with tempfile.TemporaryDirectory(prefix="zarrtorch-slides-") as tmp:
        source = xr.open_zarr(store)
        chunk_rows = source["fields"].encoding["chunks"][0]
        sharded = Path(tmp) / "sharded.zarr"
        prepare_zarr(
            source, sharded, variables=["fields", "target"], chunk_rows=chunk_rows, shard_chunks=4, progress=False
        )
        for name, folder, key in (
            ("chunks", store.parent, store.name),
            ("shards", tmp, sharded.name),
        ):
            with HttpStoreServer(folder) as server:
                ds = ZarrIterableDataset(f"{server.url}/{key}", variables=["fields", "target"])
                if name == "chunks":
                    plan = ReadPlan.of(ds, 0, decode_threads=2)
                    v |= {
                        "os_in_flight_start": str(plan.start_in_flight),
                        "os_in_flight_most": str(plan.most_in_flight),
                    }
                    v["os_chunk_rows"] = str(ds.chunk_rows)
                    v["os_chunk_mib"] = f"{ds.chunk_rows * ds.row_bytes / 2**20:.1f}"
                    v["os_bound_1"] = f"{ds.chunk_rows / 0.020:,.0f}"
                    v["os_rows"] = f"{ds.rows:,}"
                before = dict(server.requests)
                for _ in ZarrDataLoader(ds, batch_size=64, drop_last=False):
                    pass
                data = sum(n - before.get(k, 0) for k, n in server.requests.items() if "/c/" in k)
                v[f"os_requests_{name}"] = str(data)
    return v


def appendix_facts() -> dict:
    """Appendix A1 computed, not run: rows and batches per rank of zarr-torch-dataset 0.0.9 (its dealing of
    whole chunks, ``reference_rows_per_rank``) against zarrtorch's plan on the tiny data, 2 ranks, batch 32;
    and the memory a worker holds: its whole partition (2 ranks x 2 workers) against zarrtorch's bound."""
    from zarrtorch import ZarrIterableDataset
    from zarrtorch.course.reference_compare import reference_rows_per_rank
    from zarrtorch.course.synthetic import PRESETS, TRAIN_CHUNK_ROWS
    from zarrtorch.plan import epoch_plan

    rows, chunk_rows, batch = PRESETS["tiny"].n_time, TRAIN_CHUNK_ROWS["tiny"], 32
    ref = reference_rows_per_rank(rows, chunk_rows, 2, seed=0)
    ours = [
        epoch_plan(rows, chunk_rows, seed=0, epoch=0, batch_size=batch, drop_last=True, world_size=2, rank=r).batches
        for r in range(2)
    ]
    v = {
        "a1_ref_rows": " and ".join(map(str, ref)),
        "a1_ref_batches": " and ".join(str(n // batch) for n in ref),
        "a1_zt_batches": " and ".join(map(str, ours)),
    }
    for size in ("small", "workshop"):
        p = PRESETS[size]
        ds = ZarrIterableDataset(
            _metadata_arrays(p.n_time, TRAIN_CHUNK_ROWS[size], (p.n_lat, p.n_lon)), read=METADATA_ONLY
        )
        v[f"a1_{size}_partition_mib"] = f"{p.n_time * ds.row_bytes / 4 / 2**20:,.0f}"
        v[f"a1_{size}_bound_mib"] = f"{ds.worker_memory_bytes(decode_threads=1) / 2**20:,.0f}"
    return v


def _even_fork(setting: dict) -> bool:
    return setting["even"] and setting["start_method"] in (None, "fork")


def _lost_any(even: dict[str, str], uneven: dict[str, str] | None) -> bool:
    """A guarantee kept on the even store and not on the uneven one (no verdicts there: all of them)."""
    from zarrtorch.course.peers_table import kept

    return any(kept(v) and not kept((uneven or {}).get(column, "none")) for column, v in even.items())


def _peers_stores(results: dict) -> str:
    """The slide's line (one line on the slide) on where the guarantees were checked: both stores, how the
    uneven one's workers were started, and the loaders that keep all six on the even one and not on the uneven
    one in some pass; without the uneven passes, whether the one store could show those failures."""
    from zarrtorch.course import peers_table

    uneven_passes = peers_table.uneven_passes(results)
    if not uneven_passes:
        if _even_fork(peers_table.guarantee_setting(results)):
            return (
                "Its store splits evenly into whole chunks, workers forked: it cannot show the failures of an "
                "uneven split or a spawn start (A1 does)"
            )
        return "Its store splits unevenly, or starts workers by spawn: it can show the failures A1 shows"
    u = peers_table.guarantee_setting(results, uneven_passes[0])
    even = peers_table.verdicts(results)
    worse = [
        peers_table.short_name(name)
        for name in even
        if any(_lost_any(even[name], peers_table.verdicts(results, which).get(name)) for which in uneven_passes)
    ]
    chunks = u["chunks"] + bool(u["partial_rows"])
    started = " and ".join(
        peers_table.STARTED[peers_table.guarantee_run(results, w)["settings"]["start_method"]] for w in uneven_passes
    )
    line = f"On an uneven store ({chunks} chunks, {started} workers)"
    return line + (f", worse there: {', '.join(worse)}" if worse else ", the same")


def fig_peers(out: Path) -> tuple[str, dict]:
    """The reference page ``docs/peers.md``: ``make bench-peers``'s last committed run (``benchmarks/peers.json``),
    read, not run: rows/s against held memory per loader and worker count (``zarrtorch.course.peers_table.figure``,
    the page's figure), the loaders that kept every guarantee on both stores (the even one and, where the run has
    it, the uneven one, read with forked and with spawned workers), and the loaders that fail more on the uneven
    one."""
    from zarrtorch.course import peers_table

    results = peers_table.load()
    safe = peers_table.keeps_all(results)
    fig, ax = plt.subplots(figsize=(11, 3.4))
    peers_table.figure(results, ax, label_size=11)
    v = {
        "peers_safe": " and ".join(filter(None, [", ".join(safe[:-1]), safe[-1]])),
        "peers_checked": str(len(peers_table.verdicts(results))),
        "peers_date": results["date"].replace("T", " "),
        "peers_machine": results["machine"].split(",")[0],
        "peers_store": _peers_stores(results),
    }
    return _save(fig, out, "peers.png"), v


# ---------------------------------------------------------------------------------------------------------
def make_all(out: Path, *, bench_json: Path | None = BENCH_JSON, log=print) -> dict:
    """Write every figure into ``out``; return the numbers the deck's placeholders use."""
    from zarrtorch.course.synthetic import ensure_data

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ensure_data("tiny")
    values: dict = {"figures": []}
    steps = [
        ("data facts", lambda: (None, data_facts())),
        ("data map", lambda: fig_data_map(out)),
        ("partition", lambda: fig_partition(out)),
        ("stream order", lambda: fig_stream_order(out)),
        ("shuffle quality", lambda: fig_shuffle_quality(out)),
        ("chunk trade-off (writes 6 stores)", lambda: fig_chunk_tradeoff(out)),
        ("throughput", lambda: fig_throughput(out, bench_json)),
        ("memory", lambda: (None, memory_facts())),
        ("object storage (serves the tiny data on 127.0.0.1)", lambda: (None, object_storage_facts())),
        ("appendix A1", lambda: (None, appendix_facts())),
        ("peers (benchmarks/peers.json, docs/peers.md)", lambda: fig_peers(out)),
        ("slurm", lambda: (None, slurm_facts())),
    ]
    for label, step in steps:
        t = time.perf_counter()
        name, v = step()
        if name:
            values["figures"].append(name)
        values.update(v)
        log(f"[figures] {label}: {time.perf_counter() - t:.1f} s")
    values["build_date"] = _dt.date.today().isoformat()
    values["build_machine"] = machine()
    log(f"[figures] all: {time.perf_counter() - t0:.1f} s")
    return values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "slides" / "build" / "figures")
    p.add_argument("--bench", type=Path, default=BENCH_JSON, help="make bench's results (default %(default)s)")
    a = p.parse_args(argv)
    values = make_all(a.out, bench_json=a.bench)
    (a.out / "values.json").write_text(json.dumps(values, indent=2) + "\n")
    print(f"wrote {len(values['figures'])} figures and values.json to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
