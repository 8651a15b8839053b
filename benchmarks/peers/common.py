"""What every peer script runs, inside that peer's own environment and a fresh process.

A peer script defines a :class:`Peer` (how its library opens, iterates, saves and restores a loader, written
from that library's documentation) and calls :func:`main`. One process does one job: ``convert`` (the
peer's own format, timed, with its size on disk), ``throughput`` (rank 0 of 1 or of 2, epochs 1 and 2: rows/s, time
to first batch, held memory), ``guarantees`` (2 simulated ranks run in turn, and three resumes), ``layout``
(rows or windows/s over one of ``beluga_layouts.py``'s stores), ``workers`` (one rank's batches read with
several DataLoader worker counts) or ``cache`` (a remote copy read for a few epochs through the library's own
local cache, the stand-in server told where each epoch starts), and prints
one ``PEER-RESULT {json}`` line (with the start method its children were started by: ``--start-method fork``, as
an ordinary Linux script, or ``spawn``, as macOS, Windows and CUDA code). Only numpy, torch and the standard
library are assumed here; memory is read
with the project's own sampler (``zarrtorch/course/memory.py``, stdlib only), loaded by path so that the
peer's environment needs no zarrtorch.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import checks

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("zarrtorch_memory", ROOT / "zarrtorch" / "course" / "memory.py")
memory = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(memory)
MiB = 2**20


class NoAPI(Exception):
    """The peer offers no way to do this (reported as ``no API``, not as a failure)."""


@dataclass
class Ctx:
    """What a peer needs to open a loader: the store, its converted copy, the common settings."""

    store: str
    work: Path  # the peer's folder for its converted copy and scratch state
    rows: int
    chunk_rows: int
    batch_size: int
    seed: int = 0

    @property
    def converted(self) -> Path:
        return self.work / "converted"


class Peer:
    """A loader library used the way its documentation says. Override what the library supports."""

    name = "?"
    recipe = "?"  # where the recipe comes from (URL or repository path)
    converts = False  # needs its own format (``convert``)
    drop_last = True  # rows a rank may drop at the end of an epoch (fewer than world * batch size)

    def convert(self, ctx: Ctx) -> None:
        raise NotImplementedError

    def open(self, ctx: Ctx, *, rank: int, world: int, workers: int):
        raise NotImplementedError

    def epoch(self, loader, epoch: int):
        """An iterator over epoch ``epoch`` (0-based) of ``loader``; called for epochs 0, 1... in order."""
        return iter(loader)

    def rows_of(self, batch) -> list[int]:
        """The row numbers (read from the store's ``idx``) of a batch."""
        return [int(i) for i in batch["idx"]]

    def state(self, loader, iterator):
        raise NoAPI

    def restore(self, ctx: Ctx, state, *, rank: int, world: int, workers: int):
        """A new loader that continues from ``state``; :meth:`epoch` is then called with the same epoch."""
        raise NoAPI

    def open_layout(self, ctx: Ctx, *, kind: str, frames: int, workers: int):
        """A loader over the layout store ``ctx.store`` (``beluga_layouts.py``: ``kind`` is ``frame``, ``sharded``,
        ``wb2`` or ``course``, the peers' store itself), each sample a window of ``frames`` consecutive rows
        (1: single rows), shuffled, rank 0 of 1."""
        raise NoAPI

    def samples_in(self, batch) -> int:
        """How many samples (rows or windows) a batch of :meth:`open_layout`'s loader holds."""
        return len(self.rows_of(batch))

    def open_remote(self, ctx: Ctx, *, remote: str, cache_dir: Path, workers: int):
        """A loader over the remote copy at ``remote`` (``s3://`` or ``http://``) that keeps what it fetches in
        ``cache_dir`` on the local disk, shuffled, rank 0 of 1 (the cache case)."""
        raise NoAPI


class LoaderStatePeer(Peer):
    """A peer whose loader saves and restores its position itself (``state_dict`` / ``load_state_dict``)."""

    def state(self, loader, iterator):
        return loader.state_dict()

    def restore(self, ctx: Ctx, state, *, rank: int, world: int, workers: int):
        loader = self.open(ctx, rank=rank, world=world, workers=workers)
        loader.load_state_dict(state)
        return loader


# ----------------------------------------------------------------------------------------------------------
def collect(peer: Peer, iterator, limit: int | None = None) -> list[list[int]]:
    out = []
    for batch in iterator:
        out.append(peer.rows_of(batch))
        if limit is not None and len(out) >= limit:
            break
    return out


def timed_epoch(peer: Peer, loader, epoch: int, sampler, count=None, max_s: float | None = None) -> dict:
    """Rows/s from ``iter()`` to the last batch, time to first batch, memory held (as ``make bench``).
    ``count``: samples in a batch (default: its rows); ``max_s``: stop after this many seconds (a loader too slow
    for a whole epoch within the run; ``capped`` says so, and the rate is that of the part read)."""
    count = count or (lambda batch: len(peer.rows_of(batch)))
    sampler.reset()
    sampler.sample(with_uss=False)
    t0 = time.perf_counter()
    rows = batches = 0
    ttfb = None
    capped = False
    for batch in peer.epoch(loader, epoch):
        if ttfb is None:
            ttfb = time.perf_counter() - t0
            sampler.sample()  # see the workers even if the epoch ends before the sampler's next look
        rows += count(batch)
        batches += 1
        del batch
        if max_s is not None and time.perf_counter() - t0 > max_s:
            capped = True
            break
    seconds = time.perf_counter() - t0
    sampler.sample()
    out = {
        "epoch": epoch + 1,
        "rows": rows,
        "batches": batches,
        "seconds": seconds,
        "rows_per_s": rows / seconds if seconds else None,
        "ttfb_s": ttfb,
        "held_mib": sampler.held / MiB,
        "rss_main_peak_mib": sampler.peak_rss_main / MiB,
    }
    return out | ({"capped_after_s": max_s} if capped else {})


def throughput(peer: Peer, ctx: Ctx, workers: int, world: int = 1, max_s: float | None = None) -> dict:
    """Rank 0 of ``world`` (its share of the rows), epochs 1 and 2."""
    with memory.MemorySampler(every_s=0.01, uss_every_s=0.1) as sampler:
        t0 = time.perf_counter()
        loader = peer.open(ctx, rank=0, world=world, workers=workers)
        open_s = time.perf_counter() - t0
        epochs = [timed_epoch(peer, loader, e, sampler, max_s=max_s) for e in range(2)]
        del loader
    return {"workers": workers, "world": world, "open_s": open_s, "epochs": epochs}


def layout_throughput(peer: Peer, ctx: Ctx, kind: str, frames: int, workers: int, max_s: float | None) -> dict:
    """Samples/s over a layout store (:meth:`Peer.open_layout`), rank 0 of 1, epochs 1 and 2; a loader that
    refuses the store is reported with its error (``refused``), as a guarantee check reports a refused resume."""
    with memory.MemorySampler(every_s=0.01, uss_every_s=0.1) as sampler:
        t0 = time.perf_counter()
        try:
            loader = peer.open_layout(ctx, kind=kind, frames=frames, workers=workers)
        except NoAPI:
            return {"refused": "no API"}
        except Exception as e:  # the loader refuses this layout: say what it said
            return {"refused": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"}
        open_s = time.perf_counter() - t0
        epochs = [timed_epoch(peer, loader, e, sampler, count=peer.samples_in, max_s=max_s) for e in range(2)]
        del loader
    return {"kind": kind, "frames": frames, "workers": workers, "open_s": open_s, "epochs": epochs}


def _verdict(fn) -> str:
    """Run one resume check: its verdict, ``no API``, or ``refused: <error>`` when the library raised."""
    try:
        return fn()
    except NoAPI:
        return "no API"
    except Exception as e:  # the library refused the state (or broke on it): say what it said
        traceback.print_exc(file=sys.stderr)
        return f"refused: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"


def guarantees(peer: Peer, ctx: Ctx, workers: int) -> dict:
    """Two simulated ranks (world size 2) run in turn for epochs 1 and 2, then the three resumes."""
    world, may_drop = 2, (2 * ctx.batch_size - 1 if peer.drop_last else 0)
    t0 = time.perf_counter()
    per_epoch: list[list] = [[], []]
    for rank in range(world):
        loader = peer.open(ctx, rank=rank, world=world, workers=workers)
        for e in range(2):
            per_epoch[e].append(collect(peer, peer.epoch(loader, e)))
        del loader
    out = {"workers": workers, "batches_per_rank": [len(b) for b in per_epoch[0]]}
    once = [checks.every_row_once(per_epoch[e], ctx.rows, may_drop) for e in range(2)]
    out["every_row_once"] = next((v for v in once if not v.startswith("yes")), once[0])
    out["equal_batches"] = checks.equal_batches(per_epoch[0])
    out["reshuffled"] = checks.reshuffled_across_ranks(per_epoch[0], per_epoch[1])
    k = max(1, min(len(b) for b in per_epoch[0]) // 2)

    def resume_same() -> str:  # rank 0 of 2, epoch 1, state after k batches, a new loader
        loader = peer.open(ctx, rank=0, world=world, workers=workers)
        it = peer.epoch(loader, 0)
        before = collect(peer, it, k)
        state = peer.state(loader, it)
        del it, loader
        after = collect(peer, peer.epoch(peer.restore(ctx, state, rank=0, world=world, workers=workers), 0))
        return checks.resume_exact(per_epoch[0][0], before, after)

    def resume_world() -> str:  # both ranks of 2 stop after k batches; one rank goes on alone
        befores, states = [], []
        for rank in range(world):
            loader = peer.open(ctx, rank=rank, world=world, workers=workers)
            it = peer.epoch(loader, 0)
            befores.append(collect(peer, it, k))
            states.append(peer.state(loader, it))
            del it, loader
        after = collect(peer, peer.epoch(peer.restore(ctx, states[0], rank=0, world=1, workers=workers), 0))
        # the epoch was dealt over ``world`` ranks: its drop_last remainder may be what that world drops
        return checks.resume_elsewhere(befores, [after], ctx.rows, may_drop)

    def resume_workers() -> str:  # one rank, state after k batches with ``workers``, resumed with another count
        other = 0 if workers else 2
        loader = peer.open(ctx, rank=0, world=1, workers=workers)
        it = peer.epoch(loader, 0)
        before = collect(peer, it, k)
        state = peer.state(loader, it)
        del it, loader
        after = collect(peer, peer.epoch(peer.restore(ctx, state, rank=0, world=1, workers=other), 0))
        return checks.resume_elsewhere([before], [after], ctx.rows, ctx.batch_size - 1 if peer.drop_last else 0)

    out["resume_exact"] = _verdict(resume_same)
    out["resume_other_world"] = _verdict(resume_world)
    out["resume_other_workers"] = _verdict(resume_workers)
    out["seconds"] = time.perf_counter() - t0
    return out


def worker_counts(peer: Peer, ctx: Ctx, counts: list[int]) -> dict:
    """Rank 0 of 2, epochs 1 and 2, read by a new loader for each DataLoader worker count in ``counts``: are its
    batches the same whatever the count (issue 44's third case)?"""
    t0 = time.perf_counter()
    per_epoch: list[dict[int, list]] = [{}, {}]
    for w in counts:
        loader = peer.open(ctx, rank=0, world=2, workers=w)
        for e in range(2):
            per_epoch[e][w] = collect(peer, peer.epoch(loader, e))
        del loader
    verdicts = [checks.same_batches_any_workers(per) for per in per_epoch]
    out = {"counts": list(counts), "batches": {str(w): len(b) for w, b in per_epoch[0].items()}}
    out["same_batches"] = next((v for v in verdicts if v != "yes"), "yes")
    return out | {"seconds": time.perf_counter() - t0}


# the stand-in server's credentials (moto's test ones) and how each library finds an S3 endpoint that is not AWS:
# boto3 reads AWS_ENDPOINT_URL, MosaicML Streaming S3_ENDPOINT_URL, obstore AWS_ENDPOINT and AWS_ALLOW_HTTP
S3_ENVIRONMENT = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "S3_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3")


def use_endpoint(endpoint: str) -> None:
    """Point every S3 client this process makes at ``endpoint`` (plain HTTP), with the stand-in's credentials."""
    os.environ.update(S3_ENVIRONMENT | dict.fromkeys(ENDPOINT_VARIABLES, endpoint) | {"AWS_ALLOW_HTTP": "true"})


def mark_epoch(endpoint: str, label: str) -> None:
    """Tell the stand-in server that epoch ``label`` starts: it counts the requests after this one as that epoch's
    (a request for ``_epoch/<label>``, answered 404)."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(f"{endpoint}/_epoch/{label}", timeout=30).close()
    except urllib.error.HTTPError:
        pass


def refusal(error: Exception) -> str:
    """What a library said when it could not read the stand-in: the error's first line, with the root cause a Rust
    HTTP client hides in its debug text (``BadScheme``: it was not allowed to speak plain ``http://``)."""
    first = str(error).splitlines()[0] if str(error) else ""
    first = first[first.find("Original error: ") :] if "Original error: " in first else first  # the cause, not the wait
    text = f"{type(error).__name__}: {first[:200]}"
    if "BadScheme" in str(error):
        text += " [the HTTP client refused the scheme http:// (BadScheme): it was not allowed plain HTTP]"
    return text


def cache_epochs(peer: Peer, ctx: Ctx, *, remote: str, endpoint: str, cache_dir: Path, epochs: int) -> dict:
    """The cache case, rank 0 of 1 with 0 workers: ``epochs`` epochs of one loader over ``remote`` through the
    library's local cache in ``cache_dir``, each epoch's start told to the server (which counts its requests and
    bytes); per epoch rows/s and whether its order is the epoch before's. A loader that refuses the remote copy
    or breaks on it is reported with its error (``refused``)."""
    use_endpoint(endpoint)
    cache_dir.mkdir(parents=True, exist_ok=True)
    out: dict = {"remote": remote, "epochs": []}
    orders: list[list[int]] = []
    try:
        t0 = time.perf_counter()
        loader = peer.open_remote(ctx, remote=remote, cache_dir=cache_dir, workers=0)
        out["open_s"] = time.perf_counter() - t0
        for e in range(epochs):
            mark_epoch(endpoint, str(e + 1))
            t0, rows = time.perf_counter(), []
            for batch in peer.epoch(loader, e):
                rows += peer.rows_of(batch)
            seconds = time.perf_counter() - t0
            record = {"epoch": e + 1, "rows": len(rows), "distinct": len(set(rows)), "seconds": seconds}
            record["rows_per_s"] = len(rows) / seconds if seconds else None
            record["order_as_before"] = rows == orders[-1] if orders else None
            out["epochs"].append(record)
            orders.append(rows)
        mark_epoch(endpoint, "end")
    except NoAPI:
        return out | {"refused": "no API"}
    except Exception as e:  # the library cannot reach or read the stand-in: say what it said
        traceback.print_exc(file=sys.stderr)
        return out | {"refused": refusal(e)}
    disk = sum(f.stat().st_size for f in cache_dir.rglob("*") if f.is_file())
    return out | {"cache_bytes": disk}


def convert(peer: Peer, ctx: Ctx) -> dict:
    """The peer's own copy of the store, made once per store (``done.json`` marks a finished one)."""
    done = ctx.work / "done.json"
    if done.exists():
        return json.loads(done.read_text()) | {"cached": True}
    shutil.rmtree(ctx.converted, ignore_errors=True)
    ctx.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    peer.convert(ctx)
    seconds = time.perf_counter() - t0
    disk = sum(f.stat().st_size for f in ctx.converted.rglob("*") if f.is_file())
    result = {"conversion_s": seconds, "disk_bytes": disk}
    done.write_text(json.dumps(result))
    return result | {"cached": False}


START_METHODS = ("fork", "spawn")


def parser(name: str) -> argparse.ArgumentParser:
    """The options of one peer job (every peer script's command line)."""
    p = argparse.ArgumentParser(description=f"one job of the peer benchmark for {name}")
    p.add_argument("job", choices=["convert", "throughput", "guarantees", "layout", "workers", "cache"])
    p.add_argument("--store", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--chunk-rows", type=int, required=True)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument(
        "--counts", type=lambda s: [int(w) for w in s.split(",")], default=[0, 1, 2, 3], help="workers: the counts"
    )
    p.add_argument("--world", type=int, default=1, help="throughput: rank 0 of this many simulated ranks")
    p.add_argument("--max-s", type=float, default=None, help="throughput, layout: stop an epoch after this long")
    p.add_argument("--kind", default="course", help="layout: the store's layout (beluga_layouts.py)")
    p.add_argument("--frames", type=int, default=1, help="layout: rows per sample (1: single rows)")
    p.add_argument("--remote", default=None, help="cache: the remote copy's address (s3:// or http://)")
    p.add_argument("--endpoint", default=None, help="cache: the stand-in server (http://127.0.0.1:PORT)")
    p.add_argument("--cache-dir", default=None, help="cache: the library's local cache folder (made empty)")
    p.add_argument("--epochs", type=int, default=3, help="cache: epochs read")
    p.add_argument(
        "--start-method",
        choices=START_METHODS,
        default="fork",
        help="how this process starts its children (DataLoader workers and any other process the library starts "
        "with multiprocessing's default context): fork, as an ordinary Linux script; spawn, as macOS, Windows "
        "and code that needs CUDA in its workers",
    )
    return p


def use_start_method(method: str) -> str:
    """Make ``method`` multiprocessing's default start method in this process and return the one now in force.
    A loader that names its own context (xbatcher's recipe passes ``multiprocessing_context="forkserver"``)
    keeps it: the recipe is the library's documentation."""
    import multiprocessing

    multiprocessing.set_start_method(method, force=True)
    return multiprocessing.get_start_method()


def main(peer: Peer) -> None:
    a = parser(peer.name).parse_args()
    ctx = Ctx(a.store, Path(a.work), a.rows, a.chunk_rows, a.batch_size)
    import warnings

    warnings.filterwarnings("ignore")
    start_method = use_start_method(a.start_method)
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    if a.job == "convert":
        result = convert(peer, ctx)
    elif a.job == "throughput":
        result = throughput(peer, ctx, a.workers, a.world, a.max_s)
    elif a.job == "workers":
        result = worker_counts(peer, ctx, a.counts)
    elif a.job == "layout":
        result = layout_throughput(peer, ctx, a.kind, a.frames, a.workers, a.max_s)
    elif a.job == "cache":
        cache_dir = Path(a.cache_dir)
        result = cache_epochs(peer, ctx, remote=a.remote, endpoint=a.endpoint, cache_dir=cache_dir, epochs=a.epochs)
    else:
        result = guarantees(peer, ctx, a.workers)
    print("PEER-RESULT " + json.dumps(result | {"start_method": start_method}), flush=True)
