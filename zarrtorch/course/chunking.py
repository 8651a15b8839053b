"""The course's one rule for the chunk length of a training store (lessons 01 and 08, ``docs/chunk-size.md``).

A training store is chunked along the sample axis only; what is left to choose is how many rows a chunk holds.
Four things pull on that number, and :func:`suggest_chunk_rows` weighs them the same way for every lesson:

1. **Enough pieces for every reader.** The loader deals whole chunks (with windows: whole *blocks* of chunks)
   to ranks x DataLoader workers and shuffles within what each reader owns. Every reader should own at least
   ``buffer_chunks`` pieces per epoch: its shuffle buffer then fills from its own pieces, and a reader's share
   ends inside a piece at most twice (a piece decoded by two readers), a small part of several.
2. **A chunk large enough to pay for its read.** Each chunk read has a fixed cost besides moving its bytes:
   opening a file and starting a decoder on a file system, a request with its round trip and its client CPU on
   object storage. A chunk of at least :data:`MIN_CHUNK_BYTES` (decoded) keeps that cost a small part of the
   read: 1 MiB on a file system, 8 MiB on object storage.
3. **A buffer that fits the memory.** A reader holds ``buffer_chunks`` pieces decoded at once (its shuffle
   buffer): ``buffer_chunks x piece bytes`` must fit the memory given to each reader.
4. **With windows, the halo over the block.** A window reaches ``span - 1`` rows (the halo) past its start, so
   the last windows of a block read into the next block's first chunk: those chunks are decoded twice. The halo's
   chunks should be at most :data:`MAX_REREAD` of a block.

The rule: **the shortest chunk that holds the floor's bytes (2) and passes the ceilings (1, 3, 4)**; shorter is
better above the floor (more pieces to mix and share, less memory held), and no shorter than the floor because
below it the fixed cost of a read starts to weigh. When the floor and a ceiling disagree, the ceiling wins: the
longest length that passes them all, below the floor (reads then cost a little more per byte; a length over a
ceiling costs memory, mixing or reads twice). When no length passes, :func:`suggest_chunk_rows` raises and says
what to change: fewer readers, a smaller buffer, more rows, more memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

MiB = 2**20
GiB = 2**30
# Decoded bytes a chunk should hold at least, by where the store lives. A file system (a local disk, NFS, a
# parallel file system): a chunk read through the loader cost about 0.1 ms besides its bytes on a 2-core VM's
# page cache, where decoding ran at 0.4-0.7 GB/s, so 1 MiB keeps the fixed part near a tenth; a parallel file
# system's file open costs more (measure it: docs/chunk-size.md). Object storage: every request cost about
# 0.7 ms of client CPU on the same machine (benchmarks/README.md, "Reading over HTTP") and a round trip of
# 10-100 ms that only requests in flight hide, each holding a chunk: 8 MiB keeps the CPU part near a tenth.
MIN_CHUNK_BYTES = {"local": 1 * MiB, "object": 8 * MiB}
MAX_REREAD = 0.25  # with windows: the chunks a block's halo reaches into, at most this share of the block
LIMITS = ("readers", "memory", "reread")  # the ceilings, in the order they win over one another


@dataclass(frozen=True)
class ChunkAdvice:
    """A chunk length (``rows``) for one store and one job, with ``reason``, a sentence saying why.

    The job's settings are kept, so that :meth:`measures` and :meth:`fails` tell the same about any other
    length (e.g. the one a store already has)."""

    rows: int
    reason: str
    row_bytes: int
    samples: int  # rows one epoch reads, or with windows the window starts among them
    readers: int  # ranks x workers (a rank without workers reads in its main process: one reader)
    buffer_chunks: int
    memory_bytes: int
    storage: str
    floor_rows: int  # the shortest length that holds MIN_CHUNK_BYTES[storage]
    windows: object | None = field(default=None, repr=False)

    @property
    def chunk_bytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def pieces_per_reader_at_least(self) -> int:
        return max(1, self.buffer_chunks)

    def piece_rows(self, chunk_rows: int) -> int:
        """Rows of the unit the loader deals and shuffles: the chunk, or with windows the block of chunks the
        package forms (:meth:`zarrtorch.Windows.block_rows`)."""
        if self.windows is None:
            return int(chunk_rows)
        return int(self.windows.block_rows(int(chunk_rows), starts=self.samples))

    def measures(self, chunk_rows: int | None = None) -> dict:
        """What the rule looks at, for ``chunk_rows`` (default: the advised length)."""
        c = self.rows if chunk_rows is None else int(chunk_rows)
        if c < 1:
            raise ValueError(f"chunk_rows must be at least 1, got {chunk_rows}")
        piece = self.piece_rows(c)
        halo = 0 if self.windows is None else self.windows.span - 1
        return {
            "chunk_rows": c,
            "chunk_MiB": c * self.row_bytes / MiB,
            "piece_rows": piece,
            "whole_pieces": self.samples // piece,  # what the readers' ceiling counts: a partial last piece not
            "pieces_per_reader": self.samples / piece / self.readers,
            "buffer_MiB": self.buffer_chunks * piece * self.row_bytes / MiB,
            "reread": (math.ceil(halo / c) * c / piece) if halo else 0.0,
        }

    def fails(self, chunk_rows: int | None = None) -> list[str]:
        """The ceilings ``chunk_rows`` breaks (names from :data:`LIMITS`); ``[]``: it passes them all."""
        m = self.measures(chunk_rows)
        broken = {
            "readers": m["whole_pieces"] < self.readers * self.pieces_per_reader_at_least,
            "memory": m["buffer_MiB"] * MiB > self.memory_bytes,
            "reread": m["reread"] > MAX_REREAD,
        }
        return [name for name in LIMITS if broken[name]]

    def explain(self, limit: str) -> str:
        """What breaking ``limit`` means, in words."""
        piece = "blocks" if self.windows is not None else "chunks"
        return {
            "readers": f"leave some of the {self.readers} readers fewer than {self.pieces_per_reader_at_least} "
            f"{piece} per epoch",
            "memory": f"make a buffer of {self.buffer_chunks} {piece} hold more than {_mib(self.memory_bytes)}",
            "reread": f"make a block's halo reach into more than {MAX_REREAD:.0%} of the block (read twice)",
        }[limit]


def suggest_chunk_rows(
    row_bytes: int,
    rows: int,
    *,
    ranks: int = 1,
    workers: int = 0,
    buffer_chunks: int = 8,
    memory_bytes: int = 1 * GiB,
    storage: str = "local",
    windows=None,
) -> ChunkAdvice:
    """The chunk length for a store of ``rows`` samples of ``row_bytes`` (decoded, one row of every array
    together) read by ``ranks`` x ``workers`` readers, each with a shuffle buffer of ``buffer_chunks`` pieces in
    at most ``memory_bytes``; ``storage``: ``"local"`` (a file system) or ``"object"`` (S3, GCS, HTTP).

    ``rows`` are those one epoch reads: the training period's. With ``windows`` (a :class:`zarrtorch.Windows`,
    one period without gaps), the pieces are the package's blocks of window starts, and the halo counts.

    Returns the shortest length that holds ``MIN_CHUNK_BYTES[storage]`` and passes every ceiling, else the
    longest that passes them below that floor; raises ``ValueError`` saying what to change when none does.
    """
    if storage not in MIN_CHUNK_BYTES:
        raise ValueError(f"storage={storage!r}: one of {sorted(MIN_CHUNK_BYTES)} (a file system, or object storage)")
    for name, value, least in (
        ("row_bytes", row_bytes, 1),
        ("rows", rows, 1),
        ("ranks", ranks, 1),
        ("workers", workers, 0),
        ("buffer_chunks", buffer_chunks, 0),
        ("memory_bytes", memory_bytes, 1),
    ):
        if int(value) != value or value < least:
            raise ValueError(f"{name}={value!r}: a whole number of at least {least} is needed")
    samples = int(rows)
    if windows is not None:
        samples = int(rows) - (windows.span - 1)
        if samples < 1:
            raise ValueError(f"{rows} rows hold no window of {windows.span} rows: give the rows of the whole period")
    floor_rows = min(math.ceil(MIN_CHUNK_BYTES[storage] / row_bytes), samples)
    advice = ChunkAdvice(
        rows=floor_rows,
        reason="",
        row_bytes=int(row_bytes),
        samples=samples,
        readers=int(ranks) * max(1, int(workers)),
        buffer_chunks=int(buffer_chunks),
        memory_bytes=int(memory_bytes),
        storage=storage,
        floor_rows=floor_rows,
        windows=windows,
    )
    longest = _longest_worth_trying(advice)
    chosen = _shortest_passing(advice, range(floor_rows, longest + 1))
    if chosen is None:  # the longest below the floor
        chosen = _shortest_passing(advice, range(min(floor_rows - 1, longest), 0, -1))
    if chosen is None:
        broken = advice.fails(floor_rows)
        raise ValueError(
            f"no chunk length fits: at {floor_rows} rows ({_mib(floor_rows * row_bytes)}) chunks would "
            + " and ".join(advice.explain(limit) for limit in broken)
            + ", and no other length passes them all. Use fewer readers (ranks x workers), a smaller buffer_chunks, "
            "more rows (a longer period)"
            + (", shorter blocks (Windows(block_chunks=...))" if windows is not None else "")
            + " or more memory_bytes per reader"
        )
    return _with_reason(advice, chosen)


def _longest_worth_trying(advice: ChunkAdvice) -> int:
    """No length past this passes the readers' or the memory's ceiling (a piece holds at least one chunk)."""
    longest = advice.samples // (advice.readers * advice.pieces_per_reader_at_least)
    if advice.buffer_chunks:
        longest = min(longest, advice.memory_bytes // (advice.buffer_chunks * advice.row_bytes))
    return max(0, longest)


def _shortest_passing(advice: ChunkAdvice, lengths) -> int | None:
    for c in lengths:
        if not advice.fails(c):
            return c
    return None


def _with_reason(advice: ChunkAdvice, c: int) -> ChunkAdvice:
    m = advice.measures(c)
    floor = _mib(MIN_CHUNK_BYTES[advice.storage])
    where = {"local": "a file system", "object": "object storage"}[advice.storage]
    piece = "blocks" if advice.windows is not None else "chunks"
    if c >= advice.floor_rows:
        why = (
            f"the shortest chunk of at least {floor} (the least a read from {where} should move)"
            if c == advice.floor_rows
            else f"the shortest chunk of at least {floor} (for {where}) that passes every ceiling"
        )
        if c == advice.samples and c * advice.row_bytes < MIN_CHUNK_BYTES[advice.storage]:
            why = f"every row in one chunk: all the rows hold less than {floor}"
    else:
        why = f"below the {floor} a read from {where} should move, because longer chunks would " + " or ".join(
            advice.explain(limit) for limit in advice.fails(advice.floor_rows)
        )
    checks = (
        f"each of the {advice.readers} readers gets {m['pieces_per_reader']:.1f} {piece} per epoch "
        f"(at least {advice.pieces_per_reader_at_least}), a buffer of {advice.buffer_chunks} {piece} holds "
        f"{m['buffer_MiB']:.1f} MiB (at most {_mib(advice.memory_bytes)})"
    )
    if advice.windows is not None:
        checks += f", blocks of {m['piece_rows']} rows with {m['reread']:.0%} read twice (at most {MAX_REREAD:.0%})"
    reason = f"{c} rows ({m['chunk_MiB']:.2f} MiB): {why}; {checks}"
    return replace(advice, rows=c, reason=reason)


def _mib(nbytes: float) -> str:
    value = nbytes / MiB
    return f"{value:.0f} MiB" if value == int(value) else f"{value:.2f} MiB"
