"""Check an epoch before running it: what every rank will get, computed from the plan without reading data.

``audit(store, world_size=..., batch_size=...)`` (or ``python -m zarrtorch audit STORE ...``) reports the
batches per rank, the rows left out and repeated as padding, duplicates (must be 0) and the shuffle
quality, for a fresh epoch or for the rest of an epoch resumed from a saved loader state (on the same or
another topology), the chunks missing from the store, and how each array's chunks are decoded (directly from
their stored bytes, or through zarr's codecs and why). It is what to run before a long DDP job: a rank
with more batches than another would make DDP hang in its next collective.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field

import numpy as np

from zarrtorch._read.checksum import chunk_checksum
from zarrtorch._read.fastpath import read_path_text
from zarrtorch._read.listing import missing_chunks, shown
from zarrtorch._util.sizes import ceil_div
from zarrtorch.budget import memory_limit_lines
from zarrtorch.options import MISSING_CHUNKS, ReadOptions
from zarrtorch.plan import Segment, Topology
from zarrtorch.quality import chunk_diversity, order_correlation
from zarrtorch.resume import LoaderCheckpoint, batches_of, describe_windows, resumed_plan
from zarrtorch.windows import Windows


@dataclass(frozen=True)
class AuditReport:
    """One epoch (or its resumed rest) on one topology; ``ok`` when every guarantee holds."""

    epoch: int
    world_size: int
    num_workers: int
    batch_size: int
    drop_last: bool
    rows: int  # rows of the epoch (the store, or its row window)
    batches_per_rank: list[int]
    rows_consumed_before: int  # rows read before the resume (0 for a fresh epoch)
    rows_read: int  # rows the ranks read from here on, repeats included
    rows_left_out: int  # rows of the epoch never read (drop_last=True)
    padding_rows: int  # rows read a second time to even out the ranks (drop_last=False)
    duplicates: int  # rows read twice beyond the padding: must be 0
    chunk_diversity: float  # rank 0's batches, 1.0 = as mixed as a perfect shuffle
    order_correlation: float  # rank 0's stream, 1.0 = in row order, ~0 = shuffled
    loader_bytes_per_rank: int = 0  # zarrtorch.loader_memory(...).total: one rank's loader, workers included
    ranks_per_node: int = 0  # 0: not asked
    node_memory_bytes: int = 0  # 0: not given
    memory_limit_bytes: int = 0  # the cgroup memory limit of the process that audited (0: none)
    missing_chunks: dict[str, list[int]] | None = None  # array -> chunks with no stored object; None: not listed
    missing_chunks_read_as: str = "error"  # ReadOptions(missing_chunks=...): "error" stops the loader at the first
    read_paths: dict[str, str] = field(default_factory=dict)  # array -> how its chunks are decoded (and why)
    batch_order: str = "worker"  # ZarrDataLoader(batch_order=...): "rank", the batches are those of 0 workers
    read_unit: str = ""  # what is read, distributed and shuffled at once, the chunk or the shard (read_unit_text)
    checksums: dict[str, str] = field(default_factory=dict)  # array -> what checks its chunks' bytes, or "none"

    @property
    def loader_bytes_per_node(self) -> int:
        return self.loader_bytes_per_rank * self.ranks_per_node

    @property
    def fits(self) -> bool:
        """The loaders of one node's ranks fit in its memory (true when no node memory was given)."""
        return not self.node_memory_bytes or self.loader_bytes_per_node < self.node_memory_bytes

    @property
    def ok(self) -> bool:
        limit = self.world_size * self.batch_size if self.drop_last else 1
        rows_ok = len(set(self.batches_per_rank)) == 1 and self.duplicates == 0 and self.rows_left_out < limit
        chunks_ok = self.missing_chunks_read_as == "fill" or not self.missing_chunks
        return rows_ok and self.fits and chunks_ok

    def summary(self) -> str:
        counts = sorted(set(self.batches_per_rank))
        per_rank = f"{counts[0]}" if len(counts) == 1 else f"UNEQUAL {self.batches_per_rank}"
        lines = [
            f"epoch {self.epoch}: {self.world_size} rank(s) x {self.num_workers} worker(s)"
            + (", batch_order='rank'" if self.batch_order == "rank" else "")
            + f", batch {self.batch_size}, drop_last={self.drop_last}, {self.rows} rows",
            f"  batches per rank     {per_rank}",
            f"  rows read            {self.rows_read}"
            + (f" (after {self.rows_consumed_before} consumed before the resume)" if self.rows_consumed_before else ""),
            f"  rows left out        {self.rows_left_out}",
            f"  padding rows         {self.padding_rows}",
            f"  duplicates           {self.duplicates}",
            f"  shuffle (rank 0)     chunk diversity {self.chunk_diversity:.2f}, order correlation "
            f"{self.order_correlation:.2f}",
        ]
        lines += self._memory_lines()
        lines += [f"  read unit            {self.read_unit}"] if self.read_unit else []
        lines += [f"  read path            {name!r}: {path}" for name, path in self.read_paths.items()]
        lines += [f"  checksum             {name!r}: {checksum_text(kind)}" for name, kind in self.checksums.items()]
        lines += self._missing_lines()
        lines.append("  OK: every rank gets the same batches, no row twice" if self.ok else "  PROBLEM: see above")
        return "\n".join(lines)

    def _missing_lines(self) -> list[str]:
        """Chunks the epoch reads that the store lacks (nothing when it lacks none)."""
        if self.missing_chunks is None:
            return [
                "  missing chunks       not listed: the store cannot list its keys (HTTP, or no permission to list); "
                "the loader checks each chunk as it reads it"
            ]
        if not self.missing_chunks:
            return []
        out = [f"  missing chunks       {len(c)} of array {n!r}: {shown(c)}" for n, c in self.missing_chunks.items()]
        if self.missing_chunks_read_as == "fill":
            return out + ["                       read as the fill value (missing_chunks='fill')"]
        return out + [
            "                       the loader stops at the first: if the store was written with "
            "write_empty_chunks=False (zarr's default), pass ReadOptions(missing_chunks='fill') (here: "
            "--missing-chunks fill); else rewrite it"
        ]

    def _memory_lines(self) -> list[str]:
        gib = 2**30
        out = [f"  loader memory        {self.loader_bytes_per_rank / 2**20:,.0f} MiB per rank at most (loader_memory)"]
        if self.ranks_per_node:
            out.append(
                f"  per node             {self.loader_bytes_per_node / gib:,.2f} GiB for {self.ranks_per_node} rank(s)"
            )
        if self.ranks_per_node and self.node_memory_bytes:
            left = self.node_memory_bytes - self.loader_bytes_per_node
            if self.fits:
                out.append(
                    f"  left on the node     {left / gib:,.2f} GiB of {self.node_memory_bytes / gib:,.2f} GiB for the "
                    "model, PyTorch and everything else in those processes"
                )
            else:
                out.append(
                    f"  DOES NOT FIT         the loaders alone need {-left / gib:,.2f} GiB more than the node's "
                    f"{self.node_memory_bytes / gib:,.2f} GiB: fewer workers, a smaller buffer_chunks or "
                    "requests_in_flight, fewer ranks per node, or shorter chunks"
                )
        return out + memory_limit_lines(
            self.loader_bytes_per_rank * max(1, self.ranks_per_node), self.memory_limit_bytes
        )


def audit(
    source,
    *,
    world_size: int,
    batch_size: int,
    num_workers: int = 0,
    drop_last: bool = True,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    buffer_chunks: int = 8,
    row_range: tuple[int, int] | None = None,
    state: dict | None = None,
    variables=None,
    read: ReadOptions | None = None,
    ranks_per_node: int = 0,
    node_memory_gib: float = 0.0,
    windows=None,
    batch_order: str = "worker",
) -> AuditReport:
    """Audit one epoch of ``source`` (anything :class:`zarrtorch.ZarrIterableDataset` opens; only metadata is
    read). With ``state`` (a ``ZarrDataLoader.state_dict()``), audit the rest of the saved epoch on this
    topology: its epoch, batch size, seed and settings are taken from the state. ``ranks_per_node`` and
    ``node_memory_gib``: also the loader memory of one node's ranks (every rank's main process and workers,
    :func:`zarrtorch.loader_memory`) against the node's memory; not fitting makes the report a problem. The
    report also says this process's cgroup memory limit (a container's, a pod's) and warns where one node's
    loaders would take more than :data:`zarrtorch.budget.MEMORY_LIMIT_SHARE` of it; a warning only, since the
    audit may run elsewhere than the training (a login node), whose limit is not the job's.
    ``windows`` (:class:`zarrtorch.windows.Windows`): samples are windows; "rows" then counts window starts; a
    windows loader's ``state`` says its windows. ``batch_order="rank"``: the loader's
    (:class:`~zarrtorch.ZarrDataLoader`): the batches are those of no worker, whatever ``num_workers``. The chunks
    the epoch reads with no stored object are listed (where the store can list), and make the report a problem
    unless ``read`` has ``missing_chunks='fill'``."""
    from zarrtorch._util.cgroup import cgroup_memory_limit
    from zarrtorch.budget import loader_memory
    from zarrtorch.dataset import ZarrIterableDataset
    from zarrtorch.loader import ZarrDataLoader

    read = read or ReadOptions()
    saved = LoaderCheckpoint.from_dict(state) if state is not None else None
    if saved is not None:  # the state's settings, its own windows
        windows = windows_of(saved, windows)
        seed, shuffle, buffer_chunks = saved.spec.seed, saved.spec.shuffle, saved.spec.buffer_chunks
    ds = ZarrIterableDataset(
        source,
        variables=variables,
        seed=seed,
        shuffle=shuffle,
        buffer_chunks=buffer_chunks,
        row_range=row_range,
        read=dataclasses.replace(read, missing_chunks="fill"),  # listed below, for the report
        windows=windows,
    )
    history: tuple[Segment, ...] = ()
    if saved is None:
        spec = ds.spec(batch_size, drop_last)
    else:
        spec = saved.spec
        here = ds.spec(spec.batch_size, spec.drop_last)
        if (spec.rows, spec.chunk_rows, spec.row_offset) != (here.rows, here.chunk_rows, here.row_offset):
            raise ValueError(
                f"the state was saved on {spec.rows} rows in chunks of {spec.chunk_rows} from row "
                f"{spec.row_offset}; this store has {here.rows} in chunks of {here.chunk_rows} from row "
                f"{here.row_offset}: audit the store (and row_range) the state belongs to"
            )
        epoch, batch_size, drop_last = saved.epoch, spec.batch_size, spec.drop_last
        history = saved.segments + (Segment(saved.world_size, saved.num_workers, saved.segment_batches),)
    consumed = []
    for i, past in enumerate(history):
        for rank in range(past.world_size):
            plan = resumed_plan(spec, epoch, history[:i], Topology(rank, past.world_size, past.num_workers))
            consumed += batches_of(spec, plan)[: past.batches]
    loader = ZarrDataLoader(
        ds, batch_size=batch_size, drop_last=drop_last, num_workers=num_workers, batch_order=batch_order
    )
    ranks = []
    padding = 0
    for rank in range(world_size):
        plan = resumed_plan(spec, epoch, history, Topology(rank, world_size, loader.job.plan_workers))
        ranks.append(batches_of(spec, plan))
        padding = plan.budget.padding_rows
    old = np.concatenate(consumed) if consumed else np.zeros(0, np.int64)
    new = np.concatenate([b for r in ranks for b in r]) if any(ranks) else np.zeros(0, np.int64)
    seen = np.union1d(old, new)
    first = ranks[0]
    return AuditReport(
        epoch=epoch,
        world_size=world_size,
        num_workers=num_workers,
        batch_size=batch_size,
        drop_last=drop_last,
        rows=ds.rows,
        batches_per_rank=[len(r) for r in ranks],
        rows_consumed_before=len(np.unique(old)),
        rows_read=len(new),
        rows_left_out=ds.rows - len(seen),
        padding_rows=padding,
        duplicates=len(new) - len(np.unique(new)) - padding + int(np.isin(new, old).sum()),
        chunk_diversity=chunk_diversity(first, ds.rows, ds.chunk_rows) if len(first) else float("nan"),
        order_correlation=order_correlation(first) if len(first) else float("nan"),
        loader_bytes_per_rank=loader_memory(loader).total,
        ranks_per_node=int(ranks_per_node),
        node_memory_bytes=int(node_memory_gib * 2**30),
        memory_limit_bytes=cgroup_memory_limit() or 0,
        missing_chunks=listed_missing_chunks(ds),
        missing_chunks_read_as=read.missing_chunks,
        read_paths={name: read_path_text(arr) for name, arr in ds.arrays.items()},
        batch_order=batch_order,
        read_unit=read_unit_text(ds),
        checksums={name: chunk_checksum(arr) or "none" for name, arr in ds.arrays.items()},
    )


def checksum_text(kind: str) -> str:
    """What the audit says of an array's chunk checksum: its kind, or what having none means and the remedy."""
    if kind != "none":
        return kind
    return (
        "none: a byte flipped inside compressed data is not detected (it may decode to other values, silently); "
        "write the store again with prepare_zarr, whose every codec stores a checksum with each chunk"
    )


def read_unit_text(ds) -> str:
    """The block ``ds`` reads, distributes and shuffles at once, and what it costs. A sharded store is read by
    whole shards: its user chose inner chunks, but each read brings a whole shard, the shuffle mixes shards, and
    the memory held (``loader_memory``) is counted in shards, which the report says so that nobody tunes the
    inner chunks for what the shards decide."""
    rows = ds.store_chunk_rows
    size = f"{size_text(rows * ds.row_bytes)} decoded"
    if not ds.layout.sharded:
        return f"the chunk: {rows} rows, {size}"
    inner = int(next(iter(ds.arrays.values())).chunks[0])
    return (
        f"the shard: {rows} rows, {ceil_div(rows, inner)} inner chunks of {inner} row{'s' * (inner != 1)}, {size}; "
        "each read brings "
        "a whole shard, the shuffle mixes whole shards (not inner chunks), loader memory counts a shard per unit held"
    )


def size_text(nbytes: int) -> str:
    """Bytes, KiB or MiB, whichever reads best: a unit's size whether its rows are a few numbers or whole fields."""
    if nbytes < 2**10:
        return f"{nbytes} bytes"
    return f"{nbytes / 2**10:,.0f} KiB" if nbytes < 2**20 else f"{nbytes / 2**20:,.1f} MiB"


@dataclass(frozen=True)
class SourceShare:
    """One source of a :class:`zarrtorch.MixedLoader` in one mix epoch, over all ranks: its target and what it gets
    (``rows``, from its own epochs ``own_epochs[0]`` to ``own_epochs[1]``), rows drawn twice within one of its own
    epochs beyond the padding (``duplicates``, must be 0) and its loader's memory per rank."""

    name: str
    target_rows: int
    global_batch: int  # rows of one of its global batches (world_size x its batch size)
    batches_per_rank: int
    rows: int
    own_epochs: tuple[int, int]
    padding_rows: int
    duplicates: int
    loader_bytes_per_rank: int

    @property
    def on_target(self) -> bool:
        """Within one global batch of its target."""
        return abs(self.rows - self.target_rows) <= self.global_batch


@dataclass(frozen=True)
class MixAuditReport:
    """The mix epoch the next ``iter()`` of a :class:`zarrtorch.MixedLoader` runs, computed from the plans without
    reading data: each source's share, its own epochs, duplicates and memory; ``ok`` when every guarantee holds."""

    epoch: int
    world_size: int
    steps_per_rank: int
    sources: tuple[SourceShare, ...]

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.sources)

    @property
    def loader_bytes_per_rank(self) -> int:
        return sum(s.loader_bytes_per_rank for s in self.sources)

    @property
    def ok(self) -> bool:
        return all(s.on_target and s.duplicates == 0 for s in self.sources)

    def summary(self) -> str:
        lines = [f"mix epoch {self.epoch}: {self.world_size} rank(s), {self.steps_per_rank} steps per rank"]
        for s in self.sources:
            share = s.rows / self.rows if self.rows else 0.0
            target = s.target_rows / max(1, sum(x.target_rows for x in self.sources))
            epochs = f"{s.own_epochs[0]}" if s.own_epochs[0] == s.own_epochs[1] else "{}-{}".format(*s.own_epochs)
            lines.append(
                f"  {s.name!r:14} {s.rows:>9,} rows ({share:6.1%}, target {s.target_rows:,} = {target:.1%}), "
                f"{s.batches_per_rank} batches per rank, own epoch {epochs}, duplicates {s.duplicates}, "
                f"padding {s.padding_rows}, loader {s.loader_bytes_per_rank / 2**20:,.0f} MiB per rank"
            )
        lines.append(f"  loader memory        {self.loader_bytes_per_rank / 2**20:,.0f} MiB per rank, every source")
        lines.append(
            "  OK: every source within one global batch of its target, no row twice within its own epoch"
            if self.ok
            else "  PROBLEM: see above"
        )
        return "\n".join(lines)


def audit_mix(mix, *, world_size: int | None = None) -> MixAuditReport:
    """Audit the mix epoch the next ``iter()`` of ``mix`` (a :class:`zarrtorch.MixedLoader`) runs, on ``world_size``
    ranks (default: the sources' own): each source's rows against its target, the own epochs they come from (each
    source continues where it stands now), duplicates and memory. Only plans are computed: no data is read."""
    from zarrtorch.budget import loader_memory

    world = int(world_size) if world_size is not None else mix.topology()[1]
    point = mix.start_point(world)
    quotas = mix.quotas(point)
    global_batches = mix.global_batches(world)
    shares = []
    for (name, loader), quota, target, done, batch in zip(
        mix.sources.items(), quotas, mix.targets, point.drawn_before, global_batches, strict=True
    ):
        rows, epochs, padding, duplicates = source_draw(loader, quota, world)
        memory = loader_memory(loader).total
        shares.append(SourceShare(name, target - done, batch, quota, rows, epochs, padding, duplicates, memory))
    return MixAuditReport(point.epoch, world, len(mix.order(point)), tuple(shares))


def source_draw(loader, quota: int, world: int) -> tuple[int, tuple[int, int], int, int]:
    """(rows, (first, last own epoch), padding rows, duplicates) of ``quota`` batches per rank of ``loader`` on
    ``world`` ranks, from where it stands (its state), into its next own epochs as the mix runs it."""
    from zarrtorch.position import resumed_history

    saved = LoaderCheckpoint.from_dict(loader.state_dict())
    spec, workers, epoch = saved.spec, loader.num_workers, saved.epoch
    history = resumed_history(saved, world, workers)
    skip = saved.batches_seen - sum(seg.batches for seg in history)
    rows = padding = duplicates = 0
    first, left = epoch, quota
    while left > 0:
        plans = [resumed_plan(spec, epoch, history, Topology(r, world, workers)) for r in range(world)]
        drawn = [batches_of(spec, plan)[skip : skip + left] for plan in plans]
        taken = len(drawn[0])
        if taken == 0:
            raise ValueError(f"{loader!r} yields no batch in its epoch {epoch} on {world} ranks")
        ids = np.concatenate([b for rank in drawn for b in rank])
        ended = skip + taken == plans[0].batches
        epoch_padding = plans[0].budget.padding_rows if ended else 0
        rows, padding = rows + len(ids), padding + epoch_padding
        duplicates += max(0, len(ids) - len(np.unique(ids)) - epoch_padding)
        left -= taken
        if left:
            epoch, history, skip = epoch + 1, (), 0
    return rows, (first, epoch), padding, duplicates


def windows_of(saved: LoaderCheckpoint, given: Windows | None) -> Windows | None:
    """The windows a state was saved with, rebuilt from its description (:meth:`Windows.describe`), or ``given``
    where they agree."""
    described = saved.spec.windows
    if not described:
        if given is not None:
            raise ValueError("the state was saved by a loader of rows, not of windows: audit it without windows")
        return None
    if given is not None and given.describe() != described:
        raise ValueError(
            f"the state was saved with {describe_windows(described)}, not {describe_windows(given.describe())}: "
            "audit it without windows (they are read from the state) or with those it was saved with"
        )
    return given or Windows.from_description(described)


def listed_missing_chunks(ds) -> dict[str, list[int]] | None:
    """The chunks of the rows ``ds`` reads with no stored object, by array (one listing each, even of a store that
    says it holds every chunk: one removed since is found here, before the job); ``None`` where the store cannot
    list."""
    spans, found = ds.store_row_spans(), {}
    for name, arr in ds.arrays.items():
        listed = missing_chunks(arr, spans, ds.read.retry)
        if listed is None:
            return None
        if listed[0]:
            found[name] = listed[0]
    return found


def load_state(path) -> dict:
    """A loader state from a JSON file (``loader.state_dict()``) or a Lightning checkpoint (``.ckpt``)."""
    path = os.fspath(path)
    if path.lower().endswith(".json"):
        try:
            with open(path) as f:
                state = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON ({exc}): the state file is cut short or damaged") from None
        if not isinstance(state, dict):
            raise ValueError(f"{path} holds a JSON {type(state).__name__}, not a loader state (a dict)")
        return state
    import pickle

    import torch

    found = []

    def walk(obj):
        if isinstance(obj, dict):
            if {"batches_seen", "world_size", "spec", "history"} <= set(obj):
                found.append(obj)
            for value in obj.values():
                walk(value)
        elif isinstance(obj, (list, tuple)):
            for value in obj:
                walk(value)

    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except (pickle.UnpicklingError, EOFError, RuntimeError) as exc:
        raise ValueError(
            f"{path} is neither a JSON state (.json) nor a readable PyTorch/Lightning checkpoint ({exc})"
        ) from None
    walk(checkpoint)
    if not found:
        raise ValueError(f"{path} holds no ZarrDataLoader state (was the training loader a ZarrDataLoader?)")
    return found[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zarrtorch audit", description=__doc__.split("\n\n")[0])
    p.add_argument("store", help="path or URL of the training store")
    p.add_argument("--world-size", type=int, required=True, help="ranks (GPUs) of the run")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader workers per rank")
    p.add_argument("--batch-size", type=int, default=None, help="batch size per rank (required without --state)")
    p.add_argument("--drop-last", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--buffer-chunks", type=int, default=8)
    p.add_argument("--no-shuffle", action="store_true")
    p.add_argument("--row-range", type=int, nargs=2, default=None, metavar=("START", "STOP"))
    p.add_argument("--state", default=None, help="a saved loader state (.json) or Lightning checkpoint (.ckpt)")
    p.add_argument("--ranks-per-node", type=int, default=0, help="also the loaders' memory of one node's ranks")
    p.add_argument("--node-memory-gib", type=float, default=0.0, help="and against the node's memory (GiB)")
    p.add_argument(
        "--windows",
        type=int,
        nargs=3,
        default=None,
        metavar=("HISTORY", "LEAD", "STRIDE"),
        help="samples are windows (zarrtorch.Windows); a windows loader's --state says its own",
    )
    p.add_argument(
        "--missing-chunks",
        choices=MISSING_CHUNKS,
        default="error",
        help="what the job reads a chunk with no stored object as: ReadOptions(missing_chunks=...)",
    )
    p.add_argument(
        "--batch-order",
        choices=("worker", "rank"),
        default="worker",
        help="ZarrDataLoader(batch_order=...): 'rank', each rank's batches are the same for any --num-workers",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    a = p.parse_args(argv)
    if a.batch_size is None and a.state is None:
        p.error("--batch-size is required (or --state, which holds it)")
    for name, least in (("world_size", 1), ("batch_size", 1), ("num_workers", 0), ("ranks_per_node", 0)):
        value = getattr(a, name)
        if value is not None and value < least:
            p.error(f"--{name.replace('_', '-')} must be >= {least}, got {value}")
    if not (a.node_memory_gib >= 0 and math.isfinite(a.node_memory_gib)):
        p.error(f"--node-memory-gib must be a number >= 0, got {a.node_memory_gib}")
    if a.state is not None and a.batch_size is not None:
        p.error("--batch-size comes from --state (the saved run's): give one or the other")
    try:
        report = audit(
            a.store,
            world_size=a.world_size,
            num_workers=a.num_workers,
            batch_size=a.batch_size or 1,
            drop_last=a.drop_last,
            seed=a.seed,
            epoch=a.epoch,
            shuffle=not a.no_shuffle,
            buffer_chunks=a.buffer_chunks,
            row_range=tuple(a.row_range) if a.row_range else None,
            state=load_state(a.state) if a.state else None,
            ranks_per_node=a.ranks_per_node,
            node_memory_gib=a.node_memory_gib,
            read=ReadOptions(missing_chunks=a.missing_chunks),
            windows=Windows(history=a.windows[0], lead=a.windows[1], stride=a.windows[2]) if a.windows else None,
            batch_order=a.batch_order,
        )
    except (ValueError, OSError, LookupError, TypeError) as exc:  # OSError: a missing path, an unreachable server
        print(f"audit: {exc}", file=sys.stderr)
        return 2
    extra = {"loader_bytes_per_node": report.loader_bytes_per_node, "fits": report.fits, "ok": report.ok}
    print(json.dumps({**asdict(report), **extra}, indent=1) if a.json else report.summary())
    return 0 if report.ok else 1
