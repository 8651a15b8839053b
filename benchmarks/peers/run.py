"""``make bench-peers``: zarrtorch and the loaders its users would pick instead, on one generated store.

Each loader runs in a fresh process of its own environment (``envs.py``): zarrtorch and zarr-torch-dataset in
the project's, every other peer in one built under ``.peers/``. Per loader: its conversion (if it needs its
own format; timed once per store, cached), rank 0 of 1 and of 2 simulated ranks with 0 and 2 workers for
epochs 1 and 2 (rows/s, time to first batch, held memory), then the guarantees with 2 workers on 2 simulated
ranks (``common.py``), every worker started by ``--start-method`` (fork by default).
Then the uneven passes (:func:`run_uneven`, ``--uneven``): the guarantees alone, no timing, on a second store
that splits unevenly over 2 ranks x 2 workers (a partial last chunk), once per ``--uneven-start-methods`` (fork,
then spawn): the main store splits evenly, so it cannot catch a loader dealing unequal shares; the forked pass
catches that, the spawned one a loader that learns its rank inside its workers (where a loader's spawned ranks
read the same rows, their equal batch counts come from that overlap, so the forked pass is needed too).
Then, when zarr-beluga is among the loaders, the layouts part (:func:`run_layouts`): zarrtorch and zarr-beluga
on the peers' store and on its copies in the layouts beluga reads (``beluga_layouts.py``), windows and rows, on
disk and over HTTP with a delay per request. Then the worker-count case (:func:`run_workers_case`,
``--workers-case``): one rank's batches read with 0, 1, 2 and 3 workers, the same or not. Last, the cache case
(:func:`run_cache_case`, ``--cache-case``): each loader's copy served by a stand-in server with a delay per
request, read for a few epochs through the loader's own local cache, the server counting each epoch's requests.
Prints the tables, writes the JSON (``--out``) and, with ``--md``, the markdown page.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import envs  # noqa: E402
import harness  # noqa: E402
import table  # noqa: E402

# (name in the table, script [and its flag], environment: None = the project's own, converts to its own format)
PEERS = [
    ("zarrtorch", "zarrtorch_peer.py", None, False),
    ("zarrtorch, uncompressed copy", "zarrtorch_peer.py --uncompressed", None, True),
    ("zarr-torch-dataset 0.0.9", "zarrdataset_peer.py", None, False),
    ("torchdata StatefulDataLoader", "torchdata_peer.py", "torchdata", False),
    ("xbatcher", "xbatcher_peer.py", "xbatcher", False),
    ("LitData", "litdata_peer.py", "litdata", True),
    ("Grain", "grain_peer.py", "grain", False),
    ("MosaicML Streaming", "mosaicml_peer.py", "mosaicml", True),
    ("anemoi-datasets", "anemoi_peer.py", "anemoi", True),
    ("zarr-beluga 0.3.0", "beluga_peer.py", "beluga", True),
]
# the worker-count case only: zarrtorch's order whose batches do not depend on the worker count
RANK_ORDER = ("zarrtorch, batch_order='rank'", "zarrtorch_peer.py --rank-order", None, False)
BELUGA = "zarr-beluga 0.3.0"
# the layouts part: (store kind in beluga_layouts.py, its description); "course" is the peers' store itself
LAYOUTS = [
    ("course", "the peers' store: Zarr v3, zstd level 3, chunks of 128 rows"),
    ("frame", "beluga's frame layout: Zarr v3, Blosc lz4 + shuffle, one row per chunk"),
    ("sharded", "Zarr v3 shards of 32 rows, inner chunks of one row, zstd level 3"),
    ("wb2", "WeatherBench2-style Zarr v2 group, 10 arrays (2 with 4 levels), Blosc lz4 + shuffle, one row per chunk"),
]
WINDOW_FRAMES, WINDOW_BATCH = 6, 32  # 2 input + 4 target steps, as benchmarks/windows.py
# a peer whose environment builds but that has no script here, and why (none today)
NOT_RUN: dict[str, str] = {}


def job(python: str, script: str, args: list[str], timeout: float, log) -> dict:
    """One fresh process; its ``PEER-RESULT`` line, or ``{"error": ...}`` with the last line it printed."""
    script, *flags = script.split()
    cmd = [python, str(HERE / script), *flags, *args]
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    env = os.environ | {"PYTHONWARNINGS": "ignore", "TF_CPP_MIN_LOG_LEVEL": "3", "PEERS_PROJECT_PYTHON": sys.executable}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=HERE, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    log.write(done.stderr[-20000:])
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("PEER-RESULT "):
            return json.loads(line[len("PEER-RESULT ") :])
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"exit {done.returncode}: {last[:200]}"}


def work_dir(script: str, env_name: str | None, store: dict) -> Path:
    """Where a peer keeps its copy of ``store`` and its scratch state: one folder per script and flag."""
    slug = env_name or script.replace(".py", "").replace(" --", "-")
    return ROOT / ".peers" / slug / "work" / Path(store["path"]).stem


def job_args(script: str, env_name: str | None, store: dict, batch_size: int, start_method: str) -> list[str]:
    """The options every job of one peer on ``store`` takes (``common.py``'s command line)."""
    work = work_dir(script, env_name, store)
    args = ["--store", store["path"], "--work", str(work), "--rows", str(store["rows"])]
    args += ["--chunk-rows", str(store["chunk_rows"]), "--batch-size", str(batch_size)]
    return args + ["--start-method", start_method]


def prepare_peer(name, script, env_name, converts, store: dict, a, log, start_method: str) -> tuple[dict, str, list]:
    """The peer's environment and its conversion of ``store``: ``(record, python, job options)``; the record's
    ``status`` is ``ok`` unless the peer cannot run (not installable, conversion failed), and then says why."""
    out: dict = {"name": name, "status": "ok"}
    python = sys.executable
    if script is None:  # nothing to run: say why without spending minutes on its environment
        return out | {"status": "not run", "reason": NOT_RUN[name]}, python, []
    if env_name is not None:
        env = envs.ensure_env(env_name, rebuild=a.rebuild)
        out["environment"] = env
        if not env["ok"]:
            return out | {"status": "not installable", "reason": f"not installable: {env['reason']}"}, python, []
        python = env["python"]
    common = job_args(script, env_name, store, a.batch_size, start_method)
    if converts:
        out["conversion"] = job(python, script, ["convert", *common], a.timeout, log)
        if "error" in out["conversion"]:
            return out | {"status": "failed", "reason": f"conversion failed: {out['conversion']['error']}"}, python, []
    return out, python, common


def run_peer(name, script, env_name, converts, store: dict, a, log) -> dict:
    out, python, common = prepare_peer(name, script, env_name, converts, store, a, log, a.start_method)
    if out["status"] != "ok":
        return out
    for world, key in table.SERIES:  # rank 0 of 1; rank 0 of 2 (half the rows)
        out[key] = {}
        for w in a.workers:
            print(f"  {name}: {w} workers, rank 0 of {world}", flush=True)
            args = ["throughput", "--workers", str(w), "--world", str(world), *common]
            out[key][str(w)] = job(python, script, args, a.timeout, log)
    print(f"  {name}: guarantees", flush=True)
    out["guarantees"] = job(python, script, ["guarantees", "--workers", "2", *common], a.timeout, log)
    return out


def run_uneven_peer(name, script, env_name, converts, store: dict, a, log, start_method: str) -> dict:
    """One peer on the uneven store: its conversion, then the guarantees only (2 simulated ranks x 2 workers
    started by ``start_method``, three resumes), no timing."""
    out, python, common = prepare_peer(name, script, env_name, converts, store, a, log, start_method)
    if out["status"] != "ok":
        return out
    print(f"  {name}: guarantees, uneven store, {start_method}", flush=True)
    out["guarantees"] = job(python, script, ["guarantees", "--workers", "2", *common], a.timeout, log)
    return out


def run_workers_case(store: dict, a, log) -> dict:
    """Issue 44's third case on the main store: rank 0 of 2 simulated ranks, epochs 1 and 2, read by a new
    loader with each of ``--worker-counts``; does a loader give the same batches whatever the count? Every
    selected peer, and zarrtorch's ``batch_order='rank'`` beside its default."""
    t0 = time.perf_counter()
    counts = ",".join(str(w) for w in a.worker_counts)
    out: dict = {"settings": {"counts": a.worker_counts, "batch_size": a.batch_size, "start_method": a.start_method}}
    out["peers"] = []
    wanted = wanted_names(a)
    chosen = selected(wanted) + ([RANK_ORDER] if not wanted or any("zarrtorch".startswith(w) for w in wanted) else [])
    for name, script, env_name, converts in chosen:
        print(f"  {name}: worker counts {counts}", flush=True)
        record, python, common = prepare_peer(name, script, env_name, converts, store, a, log, a.start_method)
        if record["status"] == "ok":
            record["workers"] = job(python, script, ["workers", "--counts", counts, *common], a.timeout, log)
        out["peers"].append({k: v for k, v in record.items() if k != "environment"})
    return out | machine_and_date() | {"wall_s": time.perf_counter() - t0}


def uneven_split(rows: int, chunk_rows: int, batch_size: int, ranks: int = 2, workers: int = 2) -> dict:
    """How ``rows`` in chunks of ``chunk_rows`` split over ``ranks`` x ``workers`` reading processes: ``chunks``
    (the partial last one included), ``partial_rows`` (of that last chunk; 0: none), ``chunks_per_reader``
    (``None`` when they do not divide) and ``batches_per_rank`` (full batches of an equal share; ``None`` when
    the share is no whole number of batches). A store can catch a loader dealing unequal shares only when a
    ``None`` or a partial chunk is there."""
    full, partial = divmod(rows, chunk_rows)
    chunks, readers = full + (partial > 0), ranks * workers
    share = rows // ranks if rows % ranks == 0 else None
    return {
        "chunks": chunks,
        "partial_rows": partial,
        "chunks_per_reader": chunks // readers if chunks % readers == 0 else None,
        "batches_per_rank": share // batch_size if share is not None and share % batch_size == 0 else None,
    }


def uneven_store(a) -> dict:
    """The uneven pass's store (``--uneven-rows`` rows in chunks of ``--chunk-rows``), made once; refused when it
    splits evenly, since such a store cannot catch a loader dealing unequal shares."""
    from store import ensure_peer_store

    split = uneven_split(a.uneven_rows, a.chunk_rows, a.batch_size)
    if not split["partial_rows"] and split["chunks_per_reader"] and split["batches_per_rank"]:
        raise SystemExit(
            f"--uneven-rows {a.uneven_rows} splits evenly ({split['chunks']} whole chunks, "
            f"{split['chunks_per_reader']} per reading process of 2 ranks x 2 workers): pick a row count that "
            f"leaves a partial last chunk, e.g. {a.uneven_rows + a.chunk_rows // 2}"
        )
    return ensure_peer_store(a.data_dir, a.uneven_rows, a.chunk_rows)


def run_uneven(a, wanted: list[str], log, start_method: str) -> dict:
    """One guarantees pass on the uneven store with workers started by ``start_method``: every selected peer
    (converting peers convert that store as they do the main one, once for all passes), guarantees only."""
    t0 = time.perf_counter()
    store = uneven_store(a)
    settings = {"rows": a.uneven_rows, "chunk_rows": a.chunk_rows, "batch_size": a.batch_size, "workers": [2]}
    settings["start_method"] = start_method
    out = {"store": store, "settings": settings, "split": uneven_split(a.uneven_rows, a.chunk_rows, a.batch_size)}
    out["peers"] = []
    print(f"uneven store: {a.uneven_rows} rows, chunks of {a.chunk_rows}, {start_method}", flush=True)
    for name, script, env_name, converts in selected(wanted):
        print(name, flush=True)
        out["peers"].append(run_uneven_peer(name, script, env_name, converts, store, a, log, start_method))
    out["wall_s"] = time.perf_counter() - t0
    out["date"] = datetime.datetime.now().isoformat(timespec="minutes")
    return out


def selected(wanted: list[str]) -> list[tuple]:
    """The entries of :data:`PEERS` whose names start with one of ``wanted`` (lower case; empty: all)."""
    return [peer for peer in PEERS if not wanted or any(peer[0].lower().startswith(w) for w in wanted)]


def start_methods(text: str) -> list[str]:
    """``--uneven-start-methods``: comma-separated start methods, each once, in the order given."""
    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in methods if m not in table.START_METHODS]
    if not methods or unknown or len(set(methods)) != len(methods):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give one or more of {', '.join(table.START_METHODS)}, comma-separated, each once "
            "(e.g. fork,spawn)"
        )
    return methods


def parser() -> argparse.ArgumentParser:
    """``make bench-peers``'s options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--rows", type=int, default=8192, help="rows of the store (64 KiB each; a partial last chunk is allowed)"
    )
    p.add_argument("--chunk-rows", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=lambda s: [int(w) for w in s.split(",")], default=[0, 2])
    p.add_argument("--only", default="", help="comma-separated names (as in the table, case-insensitive prefix)")
    p.add_argument("--rebuild", action="store_true", help="rebuild the peers' environments (a failed one too)")
    p.add_argument("--timeout", type=float, default=1200, help="seconds per process")
    p.add_argument("--data-dir", default=str(ROOT / "data" / "bench"))
    p.add_argument(
        "--layouts",
        choices=["auto", "yes", "no", "only"],
        default="auto",
        help="zarrtorch and zarr-beluga on the layouts beluga reads (auto: when zarr-beluga is among the loaders; "
        "only: that part alone, merged into the JSON beside --md, or --out, keeping the rest)",
    )
    p.add_argument("--layout-cap", type=float, default=20, help="layouts: seconds after which an epoch is cut")
    p.add_argument(
        "--layout-rounds",
        type=int,
        default=3,
        help="layouts: rounds per store and sample kind, each running every loader once (medians and ranges)",
    )
    p.add_argument(
        "--layout-lock",
        default="",
        help="layouts: a file to flock for each round (e.g. /tmp/heavy.lock on a machine shared with other timed "
        "jobs; empty: none)",
    )
    p.add_argument(
        "--remote-ms",
        type=lambda s: [float(v) for v in s.split(",") if v],
        default=[20.0],
        help="layouts: also read beluga's stores over HTTP with this delay per request (ms; empty: not at all)",
    )
    p.add_argument(
        "--start-method",
        choices=["fork", "spawn"],
        default="fork",
        help="how each peer process starts its DataLoader workers in the main run (fork: an ordinary Linux script)",
    )
    p.add_argument(
        "--uneven",
        choices=["yes", "no", "only"],
        default="yes",
        help="the guarantees passes on a store that splits unevenly, one per --uneven-start-methods, after the main "
        "run (only: those passes alone, merged into the JSON beside --md, or --out, keeping the rest)",
    )
    p.add_argument(
        "--uneven-rows",
        type=int,
        default=2150,
        help="rows of the uneven store: 2150 in chunks of 128 = 16 full chunks and one of 102 rows, 17 chunks "
        "over 2 ranks x 2 workers",
    )
    p.add_argument(
        "--uneven-start-methods",
        type=start_methods,
        default=list(table.START_METHODS),
        help="one uneven pass per start method of the DataLoader workers, comma-separated (default: fork,spawn)",
    )
    p.add_argument(
        "--workers-case",
        choices=["yes", "no", "only"],
        default="yes",
        help="one rank's batches read with each of --worker-counts: the same whatever the count? (only: that part "
        "alone, merged into the JSON beside --md, or --out, keeping the rest)",
    )
    p.add_argument("--worker-counts", type=lambda s: [int(w) for w in s.split(",")], default=[0, 1, 2, 3])
    p.add_argument(
        "--mix-case",
        choices=["yes", "no", "only"],
        default="yes",
        help="several stores read by each loader that mixes, with each of --mix-weights (only: that part alone, "
        "merged into the JSON beside --md, or --out, keeping the rest)",
    )
    p.add_argument("--mix-rows", type=lambda s: [int(r) for r in s.split(",")], default=[1024, 512])
    p.add_argument("--mix-weights", type=mix_weights, default=mix_weights("0.7,0.3;0.3,0.7;0.5,0.5"))
    p.add_argument("--mix-epoch-rows", type=int, default=1536, help="mix: rows per epoch asked of the weights")
    p.add_argument("--mix-world", type=int, default=2, help="mix: simulated ranks")
    p.add_argument("--mix-workers", type=int, default=0, help="mix: DataLoader workers per loader")
    p.add_argument("--mix-data-dir", default=str(ROOT / "data" / "bench" / "mix"), help="mix: its stores and copies")
    p.add_argument(
        "--cache-case",
        choices=["yes", "no", "only"],
        default="yes",
        help="each loader's copy served over HTTP/S3 with --cache-delay-ms per request, read for --cache-epochs "
        "epochs through its own local cache: requests, bytes and rows/s per epoch (only: that part alone, merged "
        "into the JSON beside --md, or --out, keeping the rest)",
    )
    p.add_argument("--cache-epochs", type=int, default=3, help="the cache case's epochs (at least 2)")
    p.add_argument("--cache-delay-ms", type=float, default=20.0, help="the cache case's delay per request")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "peers.json"))
    p.add_argument(
        "--md",
        default=None,
        help="also write the table with the machine and date (benchmarks/peers.md), and its JSON beside it",
    )
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    a = parser().parse_args(argv)
    if a.layouts != "no" and a.layout_rounds < 1:
        parser().error(f"--layout-rounds {a.layout_rounds}: each case needs at least 1 round (3 for a range)")
    if a.cache_case != "no" and a.cache_epochs < 2:
        parser().error(f"--cache-epochs {a.cache_epochs}: the cache case compares epoch 2 on with epoch 1: give 2+")
    return a


def main() -> None:
    a = parse_args()
    if a.uneven == "only":
        return main_uneven_only(a)
    if a.layouts == "only":
        return main_layouts_only(a)
    if a.workers_case == "only":
        return main_workers_only(a)
    if a.mix_case == "only":
        return main_mix_case(a)
    if a.cache_case == "only":
        return main_cache_case(a)
    t0 = time.perf_counter()
    from store import ensure_peer_store

    store = ensure_peer_store(a.data_dir, a.rows, a.chunk_rows)
    harness.prepare_cache(store["path"], "warm")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    log_path = Path(a.out).with_suffix(".log")
    results = {"store": store, "settings": {k: v for k, v in vars(a).items() if k not in ("out", "md")}, "peers": []}
    with log_path.open("w") as log:
        print("L0 (raw decode)", flush=True)
        results["l0"] = job(sys.executable, "l0.py", ["--store", store["path"]], a.timeout, log)
        wanted = wanted_names(a)
        for name, script, env_name, converts in selected(wanted):
            print(name, flush=True)
            results["peers"].append(run_peer(name, script, env_name, converts, store, a, log))
        if a.uneven == "yes":
            for method in a.uneven_start_methods:
                results[table.uneven_key(method)] = run_uneven(a, wanted, log, method)
        beluga_wanted = not wanted or any(BELUGA.lower().startswith(w) for w in wanted)
        if a.layouts == "yes" or (a.layouts == "auto" and beluga_wanted):
            results["layouts"] = run_layouts(store, a, log)
        if a.workers_case == "yes":
            results["workers_case"] = run_workers_case(store, a, log)
        if a.mix_case == "yes":
            results["mix_case"] = run_mix_case(a, log)
        if a.cache_case == "yes":
            results["cache_case"] = run_cache_case(store, a, log)
    results["wall_s"] = time.perf_counter() - t0
    results |= machine_and_date()
    Path(a.out).write_text(json.dumps(results, indent=1))
    text = table.markdown(results)
    if results.get("layouts"):
        text += "\n\n" + table.layouts_markdown(results["layouts"])
    text += tail_sections(results)
    print(text)
    print(
        f"\n{a.rows} rows x 64 KiB, chunks of {a.chunk_rows} rows, batch {a.batch_size}; {results['wall_s']:.0f} s; "
        f"JSON: {a.out}; processes' stderr: {log_path}"
    )
    if a.md:  # the page and its numbers, committed: docs/peers.md is generated from the JSON
        Path(a.md).write_text(page(results, text, a))
        Path(a.md).with_suffix(".json").write_text(json.dumps(results, indent=1))


def wanted_names(a) -> list[str]:
    return [w.strip().lower() for w in a.only.split(",") if w.strip()]


def main_uneven_only(a) -> None:
    """``--uneven only``: the uneven passes of ``--uneven-start-methods`` alone, each put under its key
    (``table.uneven_key``) in the JSON beside ``--md`` (else ``--out``), whose other results (the main run, a
    pass not rerun) are kept as they are."""
    path = Path(a.md).with_suffix(".json") if a.md else Path(a.out)
    results = json.loads(path.read_text()) if path.exists() else {}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with Path(a.out).with_suffix(".uneven.log").open("w") as log:
        for method in a.uneven_start_methods:
            results[table.uneven_key(method)] = run_uneven(a, wanted_names(a), log, method)
    for target in {path, Path(a.out)}:
        target.write_text(json.dumps(results, indent=1))
    if a.md and Path(a.md).exists():  # the page keeps the main run's table; its uneven sections are replaced
        kept = Path(a.md).read_text().split(UNEVEN_HEADING)[0].split(WORKERS_HEADING)[0]
        kept = kept.split(MIX_HEADING)[0].split(CACHE_HEADING)[0]
        kept = kept.rstrip("\n")
        Path(a.md).write_text(kept + tail_sections(results) + "\n")
    for method in a.uneven_start_methods:
        uneven = results[table.uneven_key(method)]
        print(f"\n{method}:\n{table.uneven_markdown(uneven)}\n{uneven['wall_s']:.0f} s")
    print(f"JSON: {path}")


def machine_and_date() -> dict:
    """Where and when a run was made: the page prints both beside its figures."""
    machine = f"{platform.node()}: {os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}"
    return {"machine": machine, "date": datetime.datetime.now().isoformat(timespec="minutes")}


def main_layouts_only(a) -> None:
    """``--layouts only``: the layouts part alone (zarrtorch and zarr-beluga on beluga's layouts), put under
    ``layouts`` in the JSON beside ``--md`` (else ``--out``) with its own machine, date, epoch cap and wall time
    (the page says them, as they are not the main run's); the main run and the uneven passes are kept."""
    from store import ensure_peer_store

    path = Path(a.md).with_suffix(".json") if a.md else Path(a.out)
    results = json.loads(path.read_text()) if path.exists() else {}
    t0 = time.perf_counter()
    store = ensure_peer_store(a.data_dir, a.rows, a.chunk_rows)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with Path(a.out).with_suffix(".layouts.log").open("w") as log:
        layouts = run_layouts(store, a, log)
    layouts |= machine_and_date() | {"layout_cap": a.layout_cap, "wall_s": time.perf_counter() - t0}
    results["layouts"] = layouts
    for target in {path, Path(a.out)}:
        target.write_text(json.dumps(results, indent=1))
    text = table.layouts_markdown(layouts)
    if a.md and Path(a.md).exists():  # the page keeps the main run's table; its layouts table is replaced
        kept = Path(a.md).read_text().split(table.LAYOUT_TABLE_START)[0]
        kept = kept.split(UNEVEN_HEADING)[0].split(WORKERS_HEADING)[0].split(MIX_HEADING)[0].split(CACHE_HEADING)[0]
        Path(a.md).write_text(kept.rstrip("\n") + "\n\n" + text + tail_sections(results) + "\n")
    print(f"{text}\n{layouts['wall_s']:.0f} s; JSON: {path}")


UNEVEN_HEADING = "## Guarantees on the uneven store"
WORKERS_HEADING = "## One rank's batches and the worker count"
CACHE_HEADING = "## A remote copy and the loader's local cache"


def main_workers_only(a) -> None:
    """``--workers-case only``: the worker-count case alone, put under ``workers_case`` in the JSON beside
    ``--md`` (else ``--out``) with its own machine and date; the rest of the results are kept."""
    from store import ensure_peer_store

    path = Path(a.md).with_suffix(".json") if a.md else Path(a.out)
    results = json.loads(path.read_text()) if path.exists() else {}
    store = ensure_peer_store(a.data_dir, a.rows, a.chunk_rows)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with Path(a.out).with_suffix(".workers.log").open("w") as log:
        results["workers_case"] = run_workers_case(store, a, log)
    for target in {path, Path(a.out)}:
        target.write_text(json.dumps(results, indent=1))
    if a.md and Path(a.md).exists():  # the page keeps everything else; its worker-count section is replaced
        kept = Path(a.md).read_text().split(WORKERS_HEADING)[0].split(MIX_HEADING)[0].split(CACHE_HEADING)[0]
        kept = kept.rstrip("\n")
        Path(a.md).write_text(kept + workers_section(results) + mix_section(results) + cache_section(results) + "\n")
    print(f"{table.workers_markdown(results['workers_case'])}\n{results['workers_case']['wall_s']:.0f} s; JSON: {path}")


def rewrite_case_sections(md: Path, results: dict) -> None:
    """The page with its mixing and cache sections (the last two, in that order) made again from ``results``,
    everything before them kept: a part run alone replaces its own section and keeps the other's."""
    kept = md.read_text().split(MIX_HEADING)[0].split(CACHE_HEADING)[0].rstrip("\n")
    md.write_text(kept + mix_section(results) + cache_section(results) + "\n")


def tail_sections(results: dict) -> str:
    """The sections after the layouts table: the uneven passes, the worker-count case, the mixing case, then the
    cache case."""
    return uneven_sections(results) + workers_section(results) + mix_section(results) + cache_section(results)


def workers_section(results: dict) -> str:
    """The worker-count case as a section of ``benchmarks/peers.md`` ("" when the results have none)."""
    case = results.get("workers_case")
    if not case:
        return ""
    settings = case["settings"]
    about = (
        f"Rank 0 of 2 simulated ranks, epochs 1 and 2, batch size {settings['batch_size']}, a new loader for each of "
        f"{', '.join(map(str, settings['counts']))} DataLoader workers (started by {settings['start_method']}); "
        f"{case['date']}, {case['wall_s']:.0f} s."
    )
    return f"\n\n{WORKERS_HEADING}\n\n{about}\n\n{table.workers_markdown(case)}"


def uneven_sections(results: dict) -> str:
    """Every uneven pass in ``results`` as a section of ``benchmarks/peers.md`` (fork first, then spawn)."""
    return "".join(uneven_section(uneven) for _, uneven in table.uneven_passes(results))


def uneven_section(uneven: dict) -> str:
    """One uneven pass as a section of ``benchmarks/peers.md``: its store, start method and date, then its table."""
    store, settings = uneven["store"], uneven["settings"]
    about = (
        f"{store['rows']} rows in chunks of {store['chunk_rows']} rows, 2 simulated ranks x 2 DataLoader workers "
        f"started by {settings['start_method']}, batch size {settings['batch_size']}; {uneven['date']}, "
        f"{uneven['wall_s']:.0f} s."
    )
    heading = f"{UNEVEN_HEADING}, workers started by {settings['start_method']}"
    return f"\n\n{heading}\n\n{about}\n\n{table.uneven_markdown(uneven)}"


# the cache case: (name in PEERS, its remote copy's scheme); a loader of PEERS not here says why in CACHE_NOT_RUN
CACHE_PEERS = [("zarrtorch", "http"), ("MosaicML Streaming", "s3"), ("LitData", "s3")]
# beside LitData: the same with its S3 client allowed plain HTTP (litdata_peer.py, LitDataHttpAllowed), which the
# stand-in needs; (name, script, environment, converts) as in PEERS, its copy LitData's own
LITDATA_HTTP = ("LitData, obstore allowed http (patched)", "litdata_peer.py --allow-http", "litdata", True)
CACHE_NOT_RUN = {
    "Grain": "no remote cache: Grain's data sources read where they are given (local files, or a bucket mounted "
    "as a file system) and it keeps no local copy of what it read",
}


# what the page says beside the cache case's table (run.py writes it into the results: the page reads no code)
CACHE_NOTES = {
    "copies": "each loader reads its own copy: zarrtorch the Zarr store (zstd, 263 MiB for 8,192 rows), MosaicML "
    "Streaming and LitData their uncompressed conversions (512 MiB), so their bytes per epoch differ by that much",
    "LitData": "LitData 0.2.76 fetches chunks with obstore, whose S3 client it builds with client options of its own "
    "(litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS) that do not allow plain HTTP; given options, obstore "
    "ignores AWS_ALLOW_HTTP, so an http:// endpoint (a local MinIO or this stand-in) is refused before any request "
    "(its index.json, read with boto3, was fetched). The patched row adds allow_http to those options",
}


def cache_peers(wanted: list[str]) -> list[tuple[tuple, str]]:
    """The :data:`PEERS` entries the cache case runs (``--only`` filters them as the rest), each with its scheme."""
    schemes = dict(CACHE_PEERS)
    chosen = [(peer, schemes[peer[0]]) for peer in selected(wanted) if peer[0] in schemes]
    return chosen + [(LITDATA_HTTP, "s3")] if any(peer[0] == "LitData" for peer, _ in chosen) else chosen


def remote_folder(script: str, env_name: str | None, converts: bool, store: dict) -> Path:
    """The local folder the stand-in serves as a peer's remote copy: its own format's, else the Zarr store."""
    return work_dir(script, env_name, store) / "converted" if converts else Path(store["path"])


def run_cache_case(store: dict, a, log) -> dict:
    """Issue 44's cache case: rank 0 of 1, 0 workers, each loader's copy of the main store served by one stand-in
    (``cache_case.EpochCountingServer``, ``--cache-delay-ms`` per request; zarrtorch over HTTP, MosaicML Streaming
    and LitData over S3) and read for ``--cache-epochs`` epochs by one loader through its own local cache (a
    fresh temporary folder, removed after): per epoch the requests and bytes the server answered, rows/s, and
    whether the order is the epoch before's."""
    import shutil
    import tempfile

    from cache_case import EpochCountingServer, http_address, s3_address

    t0, load_before = time.perf_counter(), os.getloadavg()[0]
    chosen = cache_peers(wanted_names(a))
    prepared = []
    for (name, script, env_name, converts), scheme in chosen:
        record, python, common = prepare_peer(name, script, env_name, converts, store, a, log, a.start_method)
        prepared.append((record, python, script, common, remote_folder(script, env_name, converts, store), scheme))
    folders = [folder.resolve() for *_, folder, _ in prepared] or [Path(store["path"]).resolve()]
    root = Path(os.path.commonpath(folders)).parent  # the bucket is the served folder's first part
    settings = {"epochs": a.cache_epochs, "delay_ms": a.cache_delay_ms, "batch_size": a.batch_size, "workers": 0}
    out: dict = {"settings": settings, "peers": [], "not_run": dict(CACHE_NOT_RUN), "notes": dict(CACHE_NOTES)}
    for record, python, script, common, folder, scheme in prepared:
        record = {k: v for k, v in record.items() if k != "environment"}
        if record["status"] == "ok":
            print(f"  {record['name']}: cache case, {a.cache_epochs} epochs, {a.cache_delay_ms:g} ms", flush=True)
            cache_dir = Path(tempfile.mkdtemp(prefix="peers-cache-case-"))
            try:
                with EpochCountingServer(root, delay_ms=a.cache_delay_ms) as server:
                    remote = s3_address(root, folder) if scheme == "s3" else http_address(server.url, root, folder)
                    args = ["cache", "--remote", remote, "--endpoint", server.url, "--cache-dir", str(cache_dir)]
                    result = job(python, script, [*args, "--epochs", str(a.cache_epochs), *common], a.timeout, log)
                result["traffic"] = server.per_epoch
            finally:
                shutil.rmtree(cache_dir, ignore_errors=True)
            record["cache"] = result
        out["peers"].append(record)
    out["load_average"] = [load_before, os.getloadavg()[0]]  # the machine's 1-minute load before and after: the
    # rates move with what else runs, the request and byte counts do not
    return out | machine_and_date() | {"wall_s": time.perf_counter() - t0}


def main_cache_case(a) -> None:
    """``--cache-case only``: the cache case alone, put under ``cache_case`` in the JSON beside ``--md`` (else
    ``--out``) with its own machine and date; the rest of the results are kept."""
    from store import ensure_peer_store

    path = Path(a.md).with_suffix(".json") if a.md else Path(a.out)
    results = json.loads(path.read_text()) if path.exists() else {}
    store = ensure_peer_store(a.data_dir, a.rows, a.chunk_rows)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with Path(a.out).with_suffix(".cache.log").open("w") as log:
        results["cache_case"] = run_cache_case(store, a, log)
    for target in {path, Path(a.out)}:
        target.write_text(json.dumps(results, indent=1))
    if a.md and Path(a.md).exists():
        rewrite_case_sections(Path(a.md), results)
    print(f"{table.cache_markdown(results['cache_case'])}\n{results['cache_case']['wall_s']:.0f} s; JSON: {path}")


def cache_section(results: dict) -> str:
    """The cache case as a section of ``benchmarks/peers.md`` ("" when the results have none)."""
    case = results.get("cache_case")
    if not case:
        return ""
    settings = case["settings"]
    about = (
        f"Rank 0 of 1, 0 workers, batch size {settings['batch_size']}: each loader's copy served by one stand-in "
        f"with {settings['delay_ms']:g} ms per request, read for {settings['epochs']} epochs through the loader's "
        f"own local cache; {case['date']}, {case['wall_s']:.0f} s, load average "
        f"{'-'.join(f'{v:.1f}' for v in case.get('load_average', []))}."
    )
    return f"\n\n{CACHE_HEADING}\n\n{about}\n\n{table.cache_markdown(case)}"


def layout_jobs(frames: int, batch_size: int) -> list[tuple[str, str, int, int]]:
    """``(loader, script, workers, batch size)`` per layout run: beluga batched with 0 and 2 workers and its
    samples one by one (batch size 0); zarrtorch with 0 and 2 workers."""
    beluga = [(BELUGA, "beluga_peer.py", w, batch_size) for w in (0, 2)] + [(BELUGA, "beluga_peer.py", 0, 0)]
    return beluga + [("zarrtorch", "zarrtorch_peer.py", w, batch_size) for w in (0, 2)]


def run_layouts(store: dict, a, log) -> dict:
    """zarrtorch and zarr-beluga on the peers' store and on its copies in beluga's layouts (``beluga_layouts.py``),
    windows of 2 + 4 steps and single rows, in the same minutes: per case (a store and a sample kind) every loader
    runs once a round for ``--layout-rounds`` rounds (:func:`layout_case`), so a ratio compares runs that shared
    the machine's load; a loader that refuses a store is reported with its error."""
    from store import ensure_layout_stores

    env = envs.ensure_env("beluga", rebuild=False)
    pythons = {"beluga_peer.py": env.get("python"), "zarrtorch_peer.py": sys.executable}
    stores = {"course": store} | ensure_layout_stores(store, a.data_dir)
    out: dict = {"stores": {k: stores[k] for k, _ in LAYOUTS}, "described": dict(LAYOUTS), "runs": [], "rounds": []}
    out |= {"window_frames": WINDOW_FRAMES, "window_batch": WINDOW_BATCH, "row_batch": a.batch_size}
    if not env["ok"]:
        out["beluga_error"] = env["reason"]
    context = {"python": pythons, "store": store, "a": a, "log": log, "rounds": out["rounds"]}
    for kind, _ in LAYOUTS:
        harness.prepare_cache(stores[kind]["path"], "warm")
        for frames, batch in ((WINDOW_FRAMES, WINDOW_BATCH), (1, a.batch_size)):
            jobs = [j for j in layout_jobs(frames, batch) if pythons[j[1]] is not None]
            out["runs"] += layout_case(jobs, kind, kind, stores[kind]["path"], frames, context)
    for delay in a.remote_ms:  # over HTTP: the stores' folder served with a delay per request, windows only
        from zarrtorch.course.servers import HttpStoreProcess

        with HttpStoreProcess(a.data_dir, delay_ms=delay, asyncio=True) as server:
            out.setdefault("remote", {})[f"{delay:g} ms"] = {"server": "zarrtorch.course.servers.HttpStoreProcess"}
            for kind in ("frame", "sharded", "wb2"):
                url = f"{server.url}/{Path(stores[kind]['path']).name}"
                # beluga's samples one by one (batch size 0): on disk only
                jobs = [j for j in layout_jobs(WINDOW_FRAMES, WINDOW_BATCH) if pythons[j[1]] is not None and j[3]]
                label = f"{kind} over HTTP, {delay:g} ms"
                out["runs"] += layout_case(jobs, kind, label, url, WINDOW_FRAMES, context)
    loads = [v for r in out["rounds"] for v in r["load_average"]]
    out["load_average"] = [min(loads), max(loads)] if loads else []
    out["layout_rounds"] = a.layout_rounds
    return out


def layout_case(jobs: list[tuple[str, str, int, int]], kind: str, label: str, path: str, frames: int, run: dict):
    """One case of the layouts part: every loader of ``jobs`` (:func:`layout_jobs` entries) on one layout store
    (``path``: a folder or a URL; ``label`` names it in the table) with samples of ``frames`` rows, for
    ``--layout-rounds`` rounds. A round runs each loader once, in a fresh process, in the listed order and the
    reverse order the next round (no loader always first after a pause or last before one), holding
    ``--layout-lock`` for the round only, so other timed jobs on a shared machine run between rounds rather than
    during one. Returns one record per loader for the JSON, its ``rounds`` in round order (the same index is the
    same round for every loader of the case, which is what a ratio per round pairs), and the medians and ranges
    (``table.layout_figures``); each round's times and 1-minute load averages go to ``run["rounds"]``."""
    a = run["a"]
    records = [
        {"store": label, "setting": "", "loader": loader, "frames": frames, "workers": workers, "batch": batch}
        | {"rounds": []}
        for loader, _, workers, batch in jobs
    ]
    scripts = [script for _, script, _, _ in jobs]
    for number in range(1, a.layout_rounds + 1):
        order = list(zip(records, scripts, strict=True))
        with held_lock(a.layout_lock):
            began, load_before = utc_now(), os.getloadavg()[0]
            for record, script in order if number % 2 else order[::-1]:
                before = os.getloadavg()[0]
                result = layout_run(record, script, kind, path, run)
                record["rounds"].append(result | {"round": number, "load_average": [before, os.getloadavg()[0]]})
            ended = utc_now()
        load = [load_before, os.getloadavg()[0]]
        run["rounds"].append(
            {"store": label, "frames": frames, "round": number, "utc": [began, ended]} | {"load_average": load}
        )
    for record, figures in zip(records, table.layout_figures(records), strict=True):
        record |= figures  # per_s and x_beluga: median, min, max and each round's value
    return records


def layout_run(record: dict, script: str, kind: str, path: str, run: dict) -> dict:
    """One fresh process of one loader on one layout store: samples/s in epochs 1 and 2 (``common.py``'s
    ``layout`` job), or its refusal or error."""
    store, a = run["store"], run["a"]
    loader, frames, workers, batch_size = record["loader"], record["frames"], record["workers"], record["batch"]
    print(
        f"  layouts: {loader} on {record['store']}, frames {frames}, {workers} workers, batch {batch_size}", flush=True
    )
    work = ROOT / ".peers" / script.removesuffix(".py") / "work" / f"{Path(store['path']).stem}_{kind}"
    args = ["layout", "--kind", kind, "--frames", str(frames), "--workers", str(workers)]
    args += ["--store", path, "--work", str(work), "--rows", str(store["rows"]), "--chunk-rows", "1"]
    args += ["--batch-size", str(batch_size), "--max-s", str(a.layout_cap)]
    return job(run["python"][script], script, args, a.timeout, run["log"])


@contextlib.contextmanager
def held_lock(path: str):
    """An exclusive ``flock`` on ``path`` for the block (``flock(1)``'s lock, so shell jobs that take it with
    ``flock PATH command`` wait for the block, and it for them); nothing when ``path`` is empty."""
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- the mixing case (``--mix-case``) --------------------------------------------------------------------------------
# (name in the table, mix script, environment: None = the project's own, peer script whose conversion it reuses:
# None = the loader reads the Zarr stores themselves)
MIXERS = [
    ("zarrtorch", "zarrtorch_mix.py", None, None),
    ("MosaicML Streaming", "mosaicml_mix.py", "mosaicml", "mosaicml_peer.py"),
    ("LitData", "litdata_mix.py", "litdata", "litdata_peer.py"),
    ("Grain", "grain_mix.py", "grain", None),
]
MIX_HEADING = "## Several stores mixed by weight"


def mix_weights(text: str) -> list[list[float]]:
    """``--mix-weights``: weight settings separated by ``;``, each comma-separated, one weight per store."""
    settings = [[float(w) for w in s.split(",")] for s in text.split(";") if s.strip()]
    if not settings or any(len(s) != len(settings[0]) or min(s) < 0 or not sum(s) for s in settings):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give weight settings separated by ';', each one non-negative weight per store, not all 0 "
            "(e.g. 0.7,0.3;0.3,0.7)"
        )
    return settings


def mix_store(data_dir: str, source: int, rows: int, chunk_rows: int) -> dict:
    """Store ``source`` of the mixing case: the peers' store's values (seed ``source``) and ``idx`` =
    ``source * SOURCE_OFFSET + row``, so each row handed back names its store. Made once."""
    import numpy as np
    from mix_case import SOURCE_OFFSET
    from store import name_dimensions

    from zarrtorch import prepare_zarr

    path = Path(data_dir).resolve() / f"mix_{source}_{rows}_c{chunk_rows}.zarr"
    marker = path.with_suffix(".json")
    if marker.exists():
        return json.loads(marker.read_text())
    data = {"x": harness._LazyRows(rows, chunk_rows, source)}
    data["idx"] = np.arange(rows, dtype=np.int64) + source * SOURCE_OFFSET
    prepare_zarr(data, path, chunk_rows=chunk_rows, codec="zstd", level=3, overwrite=True, progress=False)
    name_dimensions(path)
    info = {"path": str(path), "rows": rows, "chunk_rows": chunk_rows, "source": source}
    marker.write_text(json.dumps(info))
    return info


def run_mix_peer(mixer: tuple, stores: list[dict], weights: list[float], a, log) -> dict:
    """One loader's mixing runs with one weight setting: its conversion of every store (cached), then each of its
    variants, 2 simulated ranks in turn, epochs 1 and 2 (``mix_case.py``)."""
    name, script, env_name, converts_with = mixer
    out: dict = {"name": name, "status": "ok"}
    python = sys.executable
    if env_name is not None:
        env = envs.ensure_env(env_name, rebuild=False)
        if not env["ok"]:
            return out | {"status": "not installable", "reason": env["reason"]}
        python = env["python"]
    work = Path(a.mix_data_dir) / "work" / script.removesuffix(".py")
    args = ["--stores", ",".join(s["path"] for s in stores), "--rows", ",".join(str(s["rows"]) for s in stores)]
    args += ["--work", str(work), "--chunk-rows", str(a.chunk_rows), "--batch-size", str(a.batch_size)]
    args += ["--workers", str(a.mix_workers), "--world", str(a.mix_world), "--start-method", a.start_method]
    if converts_with is not None:  # a loader that reads its own format: every store converted once, cached
        out["conversion"] = job(python, script, ["convert", *args], a.timeout, log)
        if "error" in out["conversion"]:
            return out | {"status": "failed", "reason": f"conversion failed: {out['conversion']['error']}"}
    weighted = ["--weights", ",".join(f"{w:g}" for w in weights), "--epoch-rows", str(a.mix_epoch_rows)]
    return out | {"mix": job(python, script, ["mix", *args, *weighted], a.timeout, log)}


def run_mix_case(a, log) -> dict:
    """Issue 44's mixing case: stores of ``--mix-rows`` rows read by each loader that mixes, for each weight
    setting of ``--mix-weights`` over ``--mix-epoch-rows`` rows per epoch; every run's rows judged by
    ``mix_case.mix_verdicts``."""
    t0, load_before = time.perf_counter(), os.getloadavg()[0]
    stores = [mix_store(a.mix_data_dir, k, rows, a.chunk_rows) for k, rows in enumerate(a.mix_rows)]
    settings = {"rows": a.mix_rows, "chunk_rows": a.chunk_rows, "batch_size": a.batch_size}
    settings |= {"epoch_rows": a.mix_epoch_rows, "world": a.mix_world, "workers": a.mix_workers}
    settings |= {"weights": a.mix_weights, "start_method": a.start_method}
    out: dict = {"settings": settings, "runs": []}
    wanted = wanted_names(a)
    for mixer in [m for m in MIXERS if not wanted or any(m[0].lower().startswith(w) for w in wanted)]:
        for weights in a.mix_weights:
            print(f"  {mixer[0]}: mixing, weights {weights}", flush=True)
            out["runs"].append(run_mix_peer(mixer, stores, weights, a, log) | {"weights": weights})
    load = {"load_average": [load_before, os.getloadavg()[0]]}  # the machine is shared: the rows/s say beside it
    return out | machine_and_date() | {"wall_s": time.perf_counter() - t0} | load


def main_mix_case(a) -> None:
    """``--mix-case only``: the mixing case alone, put under ``mix_case`` in the JSON beside ``--md`` (else
    ``--out``) with its own machine and date; the rest of the results are kept."""
    path = Path(a.md).with_suffix(".json") if a.md else Path(a.out)
    results = json.loads(path.read_text()) if path.exists() else {}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with Path(a.out).with_suffix(".mix.log").open("w") as log:
        results["mix_case"] = run_mix_case(a, log)
    for target in {path, Path(a.out)}:
        target.write_text(json.dumps(results, indent=1))
    if a.md and Path(a.md).exists():
        rewrite_case_sections(Path(a.md), results)
    print(f"{table.mix_markdown(results['mix_case'])}\n{results['mix_case']['wall_s']:.0f} s; JSON: {path}")


def mix_section(results: dict) -> str:
    """The mixing case as a section of ``benchmarks/peers.md`` ("" when the results have none)."""
    case = results.get("mix_case")
    if not case:
        return ""
    s = case["settings"]
    about = (
        f"Stores of {' and '.join(map(str, s['rows']))} rows, {s['epoch_rows']} rows per epoch, {s['world']} simulated "
        f"ranks, {s['workers']} workers, batch size {s['batch_size']}, epochs 1 and 2; {case['date']}, "
        f"{case['wall_s']:.0f} s, load average {' then '.join(f'{v:.1f}' for v in case['load_average'])}."
    )
    return f"\n\n{MIX_HEADING}\n\n{about}\n\n{table.mix_markdown(case)}"


def page(results: dict, text: str, a) -> str:
    store = results["store"]
    built = sum(p["environment"]["build_s"] for p in results["peers"] if (p.get("environment") or {}).get("built_now"))
    head = f"""# zarrtorch and the alternatives: the measured table

Written by `make bench-peers` (`benchmarks/peers/run.py --md benchmarks/peers.md`) on {results["date"]}:
{results["machine"]}. Store: {a.rows} rows x 64 KiB float32 ({store["decoded_bytes"] / 2**20:.0f} MiB decoded,
{store["stored_bytes"] / 2**20:.0f} MiB stored, zstd level 3), chunks of {a.chunk_rows} rows, batch size {a.batch_size},
warm page cache. Whole run: {results["wall_s"]:.0f} s, of which {built:.0f} s building peer environments.
What the columns mean, and each recipe's source: benchmarks/README.md, "Peers".

"""
    return head + text + "\n"


if __name__ == "__main__":
    main()
