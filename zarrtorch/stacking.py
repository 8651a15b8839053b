"""Stack several columns into one channel axis of the batch.

Analysis-ready stores such as ERA5's keep one array per variable (often chunked by single time steps); a
network wants one ``(batch, channel, ...)`` tensor. Stacking happens inside the worker, after the rows of
all columns were read and shuffled together, so the guarantees (each row once, equal batches) are those of
the columns themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def check_stack(stack: Mapping[str, Sequence[str]] | None, columns: Mapping) -> dict[str, list[str]]:
    """``{output name: [array names]}``, checked against the loaded arrays (``columns``: name -> (row shape,
    dtype) as batches hold them): they must exist, appear in one stack only, and share one row shape and dtype."""
    stack = {str(k): list(v) for k, v in (stack or {}).items()}
    used: list[str] = [n for names in stack.values() for n in names]
    for out, names in stack.items():
        if not names:
            raise ValueError(f"stack {out!r} lists no arrays")
        missing = [n for n in names if n not in columns]
        if missing:
            raise KeyError(f"stack {out!r} names {missing}, which are not loaded: available are {sorted(columns)}")
        kinds = {(tuple(columns[n][0]), np.dtype(columns[n][1])) for n in names}
        if len(kinds) > 1:
            raise ValueError(f"stack {out!r} mixes row shapes/dtypes {sorted(map(str, kinds))}: stack arrays alike")
        if out in columns and out not in names:
            raise ValueError(f"stack name {out!r} is also an array's name: choose another")
    twice = sorted({n for n in used if used.count(n) > 1})
    if twice:
        raise ValueError(f"arrays {twice} appear in more than one stack")
    return stack


def stack_columns(batch: dict[str, np.ndarray], stack: dict[str, list[str]]) -> dict[str, np.ndarray]:
    """The batch with each stack's arrays replaced by one array, the listed order along axis 1."""
    if not stack:
        return batch
    out = {n: a for n, a in batch.items() if not any(n in names for names in stack.values())}
    for name, names in stack.items():
        out[name] = np.stack([batch[n] for n in names], axis=1)
    return out
