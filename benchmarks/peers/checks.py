"""The guarantees, judged from the row numbers a loader handed back (pure functions, no loader needed).

A verdict is a short string: ``yes``, ``no`` (the loader does something else, by design), ``wrong`` (it
claims the feature and breaks it), ``refused`` (it raised instead of resuming), ``no API``. Details follow
a colon, e.g. ``wrong: 64 rows twice, 0 missing``. Kept free of numpy and torch so any peer's environment
and the tests can import it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

Batches = Sequence[Sequence[int]]  # one rank's batches, each the row numbers it holds


def _rows(batches: Batches) -> list[int]:
    return [int(r) for b in batches for r in b]


def coverage(rows: Iterable[int], n_rows: int) -> tuple[int, int]:
    """``(rows seen more than once, rows never seen)`` of ``range(n_rows)``."""
    counts = Counter(rows)
    twice = sum(1 for r, c in counts.items() if c > 1 and 0 <= r < n_rows)
    return twice, sum(1 for r in range(n_rows) if r not in counts)


def every_row_once(per_rank: Sequence[Batches], n_rows: int, may_drop: int = 0) -> str:
    """Every row once in the epoch across the ranks; up to ``may_drop`` rows may be missing (a ``drop_last``
    remainder: fewer than ``world * batch_size`` rows)."""
    twice, missing = coverage((r for batches in per_rank for r in _rows(batches)), n_rows)
    if twice == 0 and missing <= may_drop:
        return "yes" if missing == 0 else f"yes: {missing} dropped (drop_last)"
    return f"wrong: {twice} rows twice, {missing} missing"


def equal_batches(per_rank: Sequence[Batches]) -> str:
    """The same number of batches on every rank (else a DDP job hangs at the longer rank's next collective)."""
    counts = [len(b) for b in per_rank]
    return "yes" if len(set(counts)) == 1 else "wrong: " + " vs ".join(map(str, counts))


def _readers(per_rank: Sequence[Batches]) -> dict[int, set[int]]:
    """``{row: the ranks that read it}`` in one epoch."""
    out: dict[int, set[int]] = {}
    for rank, batches in enumerate(per_rank):
        for r in _rows(batches):
            out.setdefault(r, set()).add(rank)
    return out


def reshuffled_across_ranks(epoch_a: Sequence[Batches], epoch_b: Sequence[Batches]) -> str:
    """Do rows change ranks between two epochs (not only their order inside each rank's fixed share)? A row
    changes rank when the ranks that read it in ``epoch_b`` are all others than those that read it in ``epoch_a``;
    a row read in one epoch only (a ``drop_last`` remainder that differs) moves nowhere."""
    if len(epoch_a) != len(epoch_b):
        raise ValueError(f"{len(epoch_a)} ranks in one epoch, {len(epoch_b)} in the other")
    before, after = _readers(epoch_a), _readers(epoch_b)
    moved = sum(1 for row, ranks in after.items() if row in before and not ranks & before[row])
    if moved:
        return "yes"
    same_order = all(_rows(a) == _rows(b) for a, b in zip(epoch_a, epoch_b, strict=True))
    return "no: same order" if same_order else "no: fixed share per rank"


def resume_exact(uninterrupted: Batches, before: Batches, after: Batches) -> str:
    """A new loader restored from the state after ``before`` yields what the uninterrupted run yielded next."""
    k = len(before)
    want, got = _rows(uninterrupted[k:]), _rows(after)
    if _rows(uninterrupted[:k]) != _rows(before):
        return "wrong: the run before the state differs"  # the same loader, the same seed: should never happen
    if got == want:
        return "yes"
    if sorted(got) == sorted(want):
        return "yes: same rows, other order"
    return f"wrong: {len(set(got) - set(want))} rows not due, {len(set(want) - set(got))} due rows lost"


def resume_elsewhere(before: Sequence[Batches], after: Sequence[Batches], n_rows: int, may_drop: int = 0) -> str:
    """Rows read before the state (on every old rank) plus rows read after it (on every new rank, another
    world size or worker count) make exactly one epoch."""
    twice, missing = coverage([*(r for b in before for r in _rows(b)), *(r for b in after for r in _rows(b))], n_rows)
    if twice == 0 and missing <= may_drop:
        return "yes"
    return f"wrong: {twice} rows twice, {missing} missing"


def same_batches_any_workers(per_workers: dict[int, Batches]) -> str:
    """One rank's epoch, read with each worker count in ``per_workers`` (``{workers: batches}``): ``yes`` when
    every count gives the same batches in the same order (a laptop run with 0 workers debugs the cluster's
    batches), else, for each count that differs from the smallest, the first batch that differs and whether the
    epoch's rows are at least the same."""
    counts = sorted(per_workers)
    first = [list(map(int, b)) for b in per_workers[counts[0]]]
    differ = []
    for w in counts[1:]:
        other = [list(map(int, b)) for b in per_workers[w]]
        if other != first:
            pairs = zip(first, other, strict=False)  # a count may give fewer batches
            k = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(first), len(other)))
            rows = "the same rows" if sorted(_rows(first)) == sorted(_rows(other)) else "other rows"
            differ.append(f"{w} from batch {k + 1} ({rows})")
    return f"no, against {counts[0]} workers: " + "; ".join(differ) if differ else "yes"
