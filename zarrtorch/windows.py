"""Samples that are windows of consecutive time steps, for forecast models.

A forecast model learns from ``history`` input steps and the ``lead`` steps that follow them (a multi-step
"rollout" target), often at a ``stride`` (6-hourly samples from hourly data). A window is named by its first
row, its *start*; the valid starts are those whose every step lies inside one stretch of rows that has no
gap (``segments``: missing dates, the boundary between two periods) and inside the rows read (``row_range``:
a training period, so that no training target falls in the validation period).

The loader does not partition rows then: it partitions **window starts**, numbered ``0 .. n-1`` in time order
(a window *id*), exactly as it partitions rows otherwise: the same plan, buffer, resume and audit, each
guarantee now about window starts. The plan's "chunks" are *blocks* of ``block_rows`` consecutive ids, about
``block_chunks`` of the store's chunks: a worker reads a block's chunks once and cuts every window of the block
from them; only the chunks holding the few rows a block's last windows reach past its end (the *halo*,
``span - 1`` rows) are read a second time, by the worker holding the next block, and each of them whole: a 5-row
halo into a 16-row chunk reads all 16 rows again. So the default block is counted in those chunks. Longer blocks
read less twice; shorter ones mix windows from more places in a buffer of the same memory
(``benchmarks/windows.py`` measures both).
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from zarrtorch._util.arguments import whole_number
from zarrtorch._util.sizes import ceil_div

# the default block holds this many times the chunks its halo reaches into (Windows.halo_chunks), so a block's
# end reads at most 1/20 of its chunks again: about 1.05 reads per chunk per epoch (docs/windows.md, "Blocks")
HALO_PARTS = 20
# and a period has at least this many default blocks: a short period in one block was split the same way every
# epoch (each rank always the same windows, and with drop_last the same last windows never trained)
MIN_BLOCKS = 4


@dataclass(frozen=True, kw_only=True)
class Windows:
    """What one sample is: ``history`` input steps and the ``lead`` target steps after them, ``stride`` rows apart.

    Args:
        history: input steps per sample (at least 1).
        lead: target steps after the inputs (0: inputs only).
        stride: rows between two steps (6 for 6-hourly samples of hourly data).
        inputs: arrays the input steps come from (default: every array with a time axis).
        targets: arrays the target steps come from (default: ``inputs``). An array may be in both.
        static: arrays without the time axis (orography, a land-sea mask): read once per process and returned
            with every sample.
        segments: ``[(start, stop), ...]`` rows with no gap inside; a window never straddles two. Default: all
            rows form one segment. ``from_mask`` makes them from a bool per row (False: missing).
        block_chunks: store chunks per block (the plan's unit, see the module's docstring). Default:
            ``HALO_PARTS`` times the chunks the halo reaches into (:meth:`halo_chunks`), and at most a
            ``MIN_BLOCKS``-th of the period.

    A batch holds ``name`` ``(batch, history, *row shape)`` for each input array, ``name + "_target"``
    ``(batch, lead, *row shape)`` for each target array, ``name`` ``(batch, *shape)`` for each static array, and
    with ``return_index`` the ``"index"``: each window's start row in the store.
    """

    history: int = 1
    lead: int = 1
    stride: int = 1
    inputs: tuple[str, ...] | None = None
    targets: tuple[str, ...] | None = None
    static: tuple[str, ...] = ()
    segments: tuple[tuple[int, int], ...] | None = None
    block_chunks: int | None = None
    # from_mask's: the mask's length, checked against the store's rows (check_rows); not a setting of its own
    _mask_rows: int | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        for name in ("history", "lead", "stride", "block_chunks"):  # stride=1.9 ran as 1 while it said 1.9
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, whole_number(value, f"Windows({name}=...)"))
        for name in ("inputs", "targets", "static"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise TypeError(f"Windows({name}=...) takes a list of array names, not the string {value!r}")
            if value is not None:
                object.__setattr__(self, name, tuple(str(v) for v in value))
        if self.segments is not None:
            segs = tuple(
                sorted(
                    (whole_number(a, "a segment's start"), whole_number(b, "a segment's stop"))
                    for a, b in self.segments
                )
            )
            for (a, b), (c, _) in zip(segs, segs[1:] + ((None, None),), strict=False):  # none: an all-False mask
                if not 0 <= a < b:
                    raise ValueError(f"segment ({a}, {b}) must satisfy 0 <= start < stop")
                if c is not None and c < b:
                    raise ValueError(f"segments ({a}, {b}) and one starting at {c} overlap: give disjoint row ranges")
            object.__setattr__(self, "segments", segs)
        if int(self.history) < 1 or int(self.lead) < 0 or int(self.stride) < 1:
            raise ValueError(
                f"Windows(history={self.history}, lead={self.lead}, stride={self.stride}): "
                "history >= 1, lead >= 0 and stride >= 1 are needed"
            )
        if self.block_chunks is not None and int(self.block_chunks) < 1:
            raise ValueError(f"block_chunks={self.block_chunks}: a block holds at least one chunk")
        if self.lead and self.targets == ():
            raise ValueError(
                f"Windows(lead={self.lead}, targets=()) returns no target steps: name target arrays, or lead=0"
            )
        if not self.lead and self.targets:
            raise ValueError(f"Windows(lead=0, targets={list(self.targets)}) has no target steps: give lead >= 1")

    @classmethod
    def from_mask(cls, valid_rows, **kwargs) -> Windows:
        """Windows whose steps all fall on rows where ``valid_rows`` (a bool per row) is True and no False row
        lies between them: each run of True rows is one segment."""
        given = np.asarray(valid_rows)
        if (
            given.ndim != 1
            or given.dtype.kind not in "biu"
            or (given.dtype.kind != "b" and not np.isin(given, (0, 1)).all())
        ):
            raise ValueError(
                f"Windows.from_mask takes one bool per store row (a 1-D array of True/False), got {given.dtype} of "
                f"shape {given.shape}: a float mask's NaN would count as True"
            )
        valid = given.astype(bool)
        edges = np.flatnonzero(np.diff(np.concatenate([[False], valid, [False]]).astype(np.int8)))
        segments = tuple(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))
        windows = cls(segments=segments, **kwargs)
        object.__setattr__(windows, "_mask_rows", len(valid))
        return windows

    @property
    def steps(self) -> int:
        return int(self.history) + int(self.lead)

    @property
    def span(self) -> int:
        """Rows from a window's first step to its last, both included."""
        return (self.steps - 1) * int(self.stride) + 1

    @property
    def offsets(self) -> np.ndarray:
        """Each step's row, counted from the window's start."""
        return np.arange(self.steps, dtype=np.int64) * int(self.stride)

    def roles(self, time_arrays: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(input arrays, target arrays) among ``time_arrays``, checked."""
        inputs = self.inputs if self.inputs is not None else tuple(time_arrays)
        targets = self.targets if self.targets is not None else inputs
        if not self.lead:
            targets = ()
        for role, names in (("inputs", inputs), ("targets", targets)):
            missing = [n for n in names if n not in time_arrays]
            if missing:
                raise KeyError(
                    f"Windows({role}=...) names {missing}, not arrays with a time axis here: {list(time_arrays)}"
                )
        if not inputs:
            raise ValueError("Windows(inputs=()) gives samples without inputs: name at least one array")
        return tuple(inputs), tuple(targets)

    def halo_chunks(self, chunk_rows: int) -> int:
        """Store chunks of ``chunk_rows`` rows that a block's last windows reach past its end (the halo,
        ``span - 1`` rows), when the block ends at a chunk's end (one more can be shared when it ends inside
        one: a period starting inside a chunk). Each is read a second time, whole, by the worker holding the
        block, unless it holds the next block at the same time."""
        return ceil_div(self.span - 1, int(chunk_rows))

    def block_rows(self, chunk_rows: int, starts: int | None = None) -> int:
        """Window ids per block: ``block_chunks`` chunks, by default ``HALO_PARTS`` times the chunks the halo
        reaches into (:meth:`halo_chunks`: a halo re-reads whole chunks, so its rows would undercount it), but
        no more than leave ``MIN_BLOCKS`` blocks in a period of ``starts`` window starts (when given)."""
        chunks = self.block_chunks or max(1, self.halo_chunks(chunk_rows) * HALO_PARTS)
        if self.block_chunks is None and starts is not None:
            chunks = min(chunks, max(1, int(starts) // (MIN_BLOCKS * int(chunk_rows))))
        return int(chunks) * int(chunk_rows)

    def check_rows(self, rows: int) -> None:
        """Refuse a mask or segments that do not fit a store of ``rows`` rows: a shorter mask would make the rows
        past it missing, and a segment past the end would be dropped or clipped, silently."""
        if self._mask_rows is not None and self._mask_rows != rows:
            raise ValueError(
                f"the mask given to Windows.from_mask has {self._mask_rows} rows, the store {rows}: one bool per "
                "store row (a mask made for another store or period?)"
            )
        past = [seg for seg in self.segments or () if seg[1] > rows]
        if past:
            raise ValueError(f"segments {past} reach past the store's {rows} rows: give rows of this store")

    def describe(self) -> str:
        """The settings that change which windows there are and how they are grouped (in the plan's fingerprint)."""
        return repr((self.history, self.lead, self.stride, self.segments, self.block_chunks))

    @classmethod
    def from_description(cls, described: str) -> Windows:
        """The windows :meth:`describe` gave ``described`` (what a loader's state records): the same window starts
        and blocks, so the same plan. The arrays' roles are not in it: every array with a time axis is an input
        and a target."""
        try:
            history, lead, stride, segments, block_chunks = ast.literal_eval(described)
        except (ValueError, SyntaxError, TypeError):
            raise ValueError(f"{described!r} is not what Windows.describe() gives") from None
        return cls(history=history, lead=lead, stride=stride, segments=segments, block_chunks=block_chunks)


@dataclass(frozen=True)
class WindowStarts:
    """The valid window starts of one row range, numbered in time order: id ``i`` <-> start row.

    Stored as runs (first start, count), so it costs the number of segments, not of windows."""

    first: np.ndarray  # first start of each run
    counts: np.ndarray  # starts in each run
    _ends: np.ndarray = field(repr=False)  # cumulative counts: run k holds ids [ends[k] - counts[k], ends[k])

    @classmethod
    def of(cls, windows: Windows, rows: int, row_range: tuple[int, int] | None = None) -> WindowStarts:
        lo, hi = (0, int(rows)) if row_range is None else (int(row_range[0]), int(row_range[1]))
        if not 0 <= lo < hi <= rows:
            raise ValueError(f"row_range {row_range} must satisfy 0 <= start < stop <= {rows} (the rows)")
        segments = windows.segments if windows.segments is not None else ((0, int(rows)),)
        first, counts = [], []
        for a, b in segments:
            a, b = max(a, lo), min(b, hi)
            n = b - a - windows.span + 1
            if n > 0:
                first.append(a)
                counts.append(n)
        first_arr, counts_arr = np.array(first, dtype=np.int64), np.array(counts, dtype=np.int64)
        return cls(first_arr, counts_arr, np.cumsum(counts_arr))

    @property
    def n(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def chunks_reached(self, span: int, chunk_rows: int) -> int:
        """Store chunks of ``chunk_rows`` rows that the windows (``span`` rows each) reach, first to last: no
        worker holds more of them at once."""
        if self.n == 0:
            return 0
        first, last = (int(v) for v in self.start([0, self.n - 1]))
        return (last + int(span) - 1) // int(chunk_rows) - first // int(chunk_rows) + 1

    def most_runs(self, block_rows: int) -> int:
        """The most runs (stretches of consecutive starts) one block of ``block_rows`` ids touches."""
        if len(self._ends) <= 1:
            return 1
        new_run = self._ends[:-1]  # ids where a run after a gap begins
        return 1 + int(np.bincount(new_run // int(block_rows)).max())

    def start(self, ids) -> np.ndarray:
        """The start row of each window id."""
        ids = np.asarray(ids, dtype=np.int64)
        run = np.searchsorted(self._ends, ids, side="right")
        return self.first[run] + ids - (self._ends[run] - self.counts[run])


def no_windows_message(windows: Windows, rows: int, row_range) -> str:
    return (
        f"no window of {windows.span} rows ({windows.history} input + {windows.lead} target steps, stride "
        f"{windows.stride}) fits in the rows {row_range or (0, rows)} and segments given: use fewer steps, a smaller "
        "stride or a longer period"
    )
