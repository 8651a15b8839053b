"""The mixing case of issue 44, inside one peer's environment: several small stores read by one loader with weights.

A peer's mix script (``<peer>_mix.py``) defines a :class:`Mixer`: how its library converts each store (the peer's
own ``convert``, reused), and how it opens a loader that draws from every store with the weights given (written
from that library's documentation). :func:`main` then runs one job: ``convert`` (each store once) or ``mix`` (the
variants the script names, 2 simulated ranks in turn, epochs 1 and 2 each) and prints one ``PEER-RESULT {json}``
line. What the rows say is judged by :func:`mix_verdicts` (pure, stdlib only, so the tests import it).

The stores are written by ``run.py`` (``mix_stores``) with ``idx = source * SOURCE_OFFSET + row``, so a row
handed back names its source and its row by what the loader read from the store, not by what it was told.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common import Ctx, convert, use_start_method

SOURCE_OFFSET = 1_000_000  # a row's idx in the mixing stores: source * SOURCE_OFFSET + its row in that store

Epoch = Sequence[Sequence[Sequence[int]]]  # per rank, its batches, each the idx values it holds


@dataclass
class MixCtx:
    """The mixing stores and what a loader is asked for: ``weights`` of ``epoch_rows`` rows per epoch."""

    stores: list[str]
    work: Path
    rows: list[int]
    chunk_rows: int
    batch_size: int
    weights: list[float]
    epoch_rows: int
    workers: int = 0
    seed: int = 0
    sources: list[Ctx] = field(init=False)

    def __post_init__(self):
        self.sources = [
            Ctx(store, self.work / f"source{k}", rows, self.chunk_rows, self.batch_size, self.seed)
            for k, (store, rows) in enumerate(zip(self.stores, self.rows, strict=True))
        ]

    def targets(self) -> list[int]:
        """The rows per epoch each source is asked for: its weight's share of ``epoch_rows`` (weights normalised)."""
        total = sum(self.weights)
        return [round(self.epoch_rows * w / total) for w in self.weights]


class Mixer:
    """One library's way of mixing stores. ``variants``: ``{name: what it means}``, one run each."""

    name = "?"
    recipe = "?"
    peer = None  # the peer's own class (``<peer>_peer.py``): its conversion is reused
    variants: dict[str, str] = {}

    def open(self, ctx: MixCtx, variant: str, *, rank: int, world: int):
        raise NotImplementedError

    def epoch(self, loader, epoch: int):
        return iter(loader)

    def rows_of(self, batch) -> list[int]:
        return [int(i) for i in batch["idx"]]

    def targets(self, ctx: MixCtx, variant: str) -> list[int]:
        """What this variant asks of each source per epoch (by default the weights' share of the epoch)."""
        return ctx.targets()


def source_of(row: int) -> int:
    return int(row) // SOURCE_OFFSET


def _within_quota(rows: list[int], size: int) -> tuple[int, int]:
    """``(draws over their row's share, rows under their share)`` of one source's ``rows`` (one epoch's, or two
    epochs' together): drawn ``c`` times from ``size`` rows, every row is due ``c // size`` or one more times
    (once each when ``c <= size``)."""
    counts = Counter(r % SOURCE_OFFSET for r in rows)
    low, high = len(rows) // size, -(-len(rows) // size)
    over = sum(n - high for n in counts.values() if n > high)
    under = sum(1 for r in range(size) if counts.get(r, 0) < low)
    return over, under


def _spread(per_source: Sequence[tuple[int, int]]) -> str:
    """The verdict on :func:`_within_quota`'s pairs, one per source: ``yes``, or for each source that is off, its
    draws over their row's share and its rows under theirs."""
    if not any(over or under for over, under in per_source):
        return "yes"
    off = [f"source {k}: {o} draws over, {u} rows under" for k, (o, u) in enumerate(per_source) if o or u]
    return "no: " + "; ".join(off)


def _rows_of_source(epochs: Sequence[Epoch], k: int) -> list[int]:
    return [int(r) for e in epochs for batches in e for b in batches for r in b if source_of(r) == k]


def _steps_that_differ(epoch: Epoch) -> int | None:
    """Steps at which the ranks' batches come from different sources (``None``: a batch holds several)."""
    per_rank = []
    for batches in epoch:
        sources = [{source_of(r) for r in b} for b in batches]
        if any(len(s) != 1 for s in sources):
            return None
        per_rank.append([s.pop() for s in sources])
    steps = min(len(s) for s in per_rank)
    return sum(1 for i in range(steps) if len({s[i] for s in per_rank}) > 1)


def epoch_verdicts(epoch: Epoch, sizes: list[int], targets: list[int], batch_size: int) -> dict:
    """One epoch over every rank: per source its rows against its target (within one global batch or not) and
    the spread of its draws (:func:`_within_quota`); rows of no source; batches per rank; homogeneous batches; the
    steps at which the ranks draw different sources."""
    global_batch = len(epoch) * batch_size
    per_source = []
    for k, (size, target) in enumerate(zip(sizes, targets, strict=True)):
        mine = _rows_of_source([epoch], k)
        over, under = _within_quota(mine, size)
        per_source.append(
            {"rows": len(mine), "target": target, "within_global_batch": abs(len(mine) - target) <= global_batch}
            | {"over_share": over, "under_share": under}
        )
    rows = [int(r) for batches in epoch for b in batches for r in b]
    batches = [b for batches in epoch for b in batches]
    homogeneous = sum(1 for b in batches if len({source_of(r) for r in b}) == 1)
    return {
        "sources": per_source,
        "foreign_rows": sum(1 for r in rows if not 0 <= source_of(r) < len(sizes)),
        "batches_per_rank": [len(b) for b in epoch],
        "sources_per_rank": [sorted({source_of(r) for b in batches for r in b}) for batches in epoch],
        "homogeneous_batches": f"{homogeneous}/{len(batches)}",
        "steps_ranks_differ": _steps_that_differ(epoch),
    }


def _summed(per_epoch: list[dict], k: int) -> tuple[int, int]:
    """Source ``k``'s draws over and rows under their share, each epoch judged alone, summed over the epochs."""
    return tuple(sum(e["sources"][k][key] for e in per_epoch) for key in ("over_share", "under_share"))


def _every_rank_every_source(per_epoch: list[dict], asked: list[int]) -> str:
    """Does every rank draw from every source asked for, in every epoch? A rank that trains on one store only
    while the mix's counts over all ranks look right is what a shard of an interleaved order can give."""
    missed: dict[tuple[int, int], list[int]] = {}  # (rank, source): the epochs (1-based) it drew none of it
    for e, epoch in enumerate(per_epoch):
        for rank, drawn in enumerate(epoch["sources_per_rank"]):
            for k in asked:
                if k not in drawn:
                    missed.setdefault((rank, k), []).append(e + 1)
    said = [f"rank {r} none of source {k} (epoch {', '.join(map(str, es))})" for (r, k), es in missed.items()]
    return "yes" if not said else "no: " + "; ".join(said)


def mix_verdicts(epochs: Sequence[Epoch], sizes: list[int], targets: list[int], batch_size: int) -> dict:
    """The mixing case's verdicts over epochs 1 and 2 (``epochs[e][rank]``: that rank's batches), each a short
    string as ``checks.py`` writes them, with the per-epoch figures under ``epochs``. ``two_epochs_once`` judges
    both epochs' draws together: a source asked for less than it holds that goes on where it stopped draws
    every row once before any twice; one that starts a new shuffle every epoch draws some twice, others never."""
    per_epoch = [epoch_verdicts(e, sizes, targets, batch_size) for e in epochs]
    drawn = [" + ".join(str(s["rows"]) for s in e["sources"]) for e in per_epoch]
    off = sum(1 for e in per_epoch for s in e["sources"] if not s["within_global_batch"])
    differ = [e["steps_ranks_differ"] for e in per_epoch]
    batch_counts = [e["batches_per_rank"] for e in per_epoch]
    rank0 = [[int(r) for b in e[0] for r in b] for e in epochs]
    return {
        "rows_per_source": "; ".join(drawn) + f" ({' + '.join(map(str, targets))})",
        "on_target": "yes" if not off else f"no: {off} of {len(sizes) * len(epochs)} off by more than a global batch",
        "quota_once": _spread([_summed(per_epoch, k) for k in range(len(sizes))]),
        "two_epochs_once": _spread([_within_quota(_rows_of_source(epochs, k), n) for k, n in enumerate(sizes)]),
        "foreign_rows": sum(e["foreign_rows"] for e in per_epoch),
        "homogeneous_batches": ", ".join(e["homogeneous_batches"] for e in per_epoch),
        "same_source_per_step": "no: mixed batches"
        if None in differ
        else ("yes" if not any(differ) else f"no: {' and '.join(map(str, differ))} steps differ"),
        "equal_batches": "yes"
        if all(len(set(c)) == 1 for c in batch_counts)
        else "wrong: " + "; ".join(" vs ".join(map(str, c)) for c in batch_counts),
        "epoch2_order": "other" if rank0[0] != rank0[-1] else "same",
        "every_rank_every_source": _every_rank_every_source(per_epoch, [k for k, t in enumerate(targets) if t > 0]),
        "epochs": per_epoch,
    }


def run_variant(mixer: Mixer, ctx: MixCtx, variant: str, world: int) -> dict:
    """``world`` simulated ranks in turn, epochs 1 and 2 each on one loader; rows/s over everything read."""
    epochs: list[list] = [[], []]
    rows = 0
    t0 = time.perf_counter()
    for rank in range(world):
        loader = mixer.open(ctx, variant, rank=rank, world=world)
        for e in range(2):
            batches = [mixer.rows_of(b) for b in mixer.epoch(loader, e)]
            epochs[e].append(batches)
            rows += sum(len(b) for b in batches)
        del loader
    seconds = time.perf_counter() - t0
    verdicts = mix_verdicts(epochs, ctx.rows, mixer.targets(ctx, variant), ctx.batch_size)
    return verdicts | {"rows_read": rows, "seconds": seconds, "rows_per_s": rows / seconds if seconds else None}


def parser(name: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=f"the mixing case of the peer benchmark for {name}")
    p.add_argument("job", choices=["convert", "mix"])
    p.add_argument("--stores", required=True, help="comma-separated stores")
    p.add_argument("--rows", required=True, help="comma-separated rows per store")
    p.add_argument("--work", required=True)
    p.add_argument("--chunk-rows", type=int, required=True)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--weights", default="", help="comma-separated, one per store")
    p.add_argument("--epoch-rows", type=int, default=0)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--variants", default="", help="comma-separated (default: every variant of the script)")
    p.add_argument("--start-method", choices=["fork", "spawn"], default="fork")
    return p


def main(mixer: Mixer) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    a = parser(mixer.name).parse_args()
    rows = [int(r) for r in a.rows.split(",")]
    weights = [float(w) for w in a.weights.split(",")] if a.weights else [1.0] * len(rows)
    ctx = MixCtx(a.stores.split(","), Path(a.work), rows, a.chunk_rows, a.batch_size, weights, a.epoch_rows, a.workers)
    start_method = use_start_method(a.start_method)
    if a.job == "convert":
        result = {"sources": [convert(mixer.peer, source) for source in ctx.sources]} if mixer.peer else {}
    else:
        chosen = [v for v in a.variants.split(",") if v] or list(mixer.variants)
        result = {"variants": {}}
        for variant in chosen:
            try:
                result["variants"][variant] = run_variant(mixer, ctx, variant, a.world)
            except Exception as e:  # the library refused this request: say what it said
                result["variants"][variant] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    print("PEER-RESULT " + json.dumps(result | {"start_method": start_method}), flush=True)
