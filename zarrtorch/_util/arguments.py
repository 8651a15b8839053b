"""Arguments taken as what they say they are, or refused by name: a value Python would quietly convert (``int(1.7)``,
``bool("no")``, ``list("t2m")``) gives other batches than the user asked for, with no error anywhere."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

INT64_LIMIT = 2**63  # seeds and epochs travel as int64 (shared with workers, kept in checkpoints)


def whole_number(value, what: str, *, least: int | None = None, below: int | None = None) -> int:
    """``value`` as an ``int``: an integer (Python's or NumPy's) or a float with no fraction, within
    ``[least, below)``; anything else (a bool, ``1.7``, ``"3"``, NaN) raises a ValueError naming ``what``."""
    integral = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    whole_float = isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer()
    if not (integral or whole_float):
        raise ValueError(f"{what} must be a whole number{_range(least, below)}, got {value!r}")
    number = int(value)
    if (least is not None and number < least) or (below is not None and number >= below):
        raise ValueError(f"{what} must be a whole number{_range(least, below)}, got {value!r}")
    return number


def _range(least: int | None, below: int | None) -> str:
    if least is not None and below is not None:
        return f" in [{least}, {below})" if below < 2**32 else f" >= {least} (and below 2**63)"
    if least is not None:
        return f" >= {least}"
    return f" below {below}" if below is not None else ""


def flag(value, what: str) -> bool:
    """``value`` as a ``bool``: only ``True`` or ``False`` (Python's or NumPy's); ``"no"`` and ``1`` are refused,
    since ``bool("no")`` is True."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{what} must be True or False, got {value!r}")


def finite_number(value, what: str, *, least: float = 0.0, strictly: bool = False) -> float:
    """``value`` as a finite ``float`` >= ``least`` (> with ``strictly``); NaN, infinities and bools are refused."""
    numeric = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if numeric and math.isfinite(value) and (value > least if strictly else value >= least):
        return float(value)
    bound = f"> {least:g}" if strictly else f">= {least:g}"
    raise ValueError(f"{what} must be a finite number {bound}, got {value!r}")


def names(value, what: str, example: str = "['t2m', 'msl']") -> list[str] | None:
    """A list of array names (``None`` stays ``None``): a single string is refused, since ``list("t2m")`` is
    ``['t', '2', 'm']``."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or isinstance(value, Mapping) or not hasattr(value, "__iter__"):
        raise ValueError(f"{what} must be a list of array names such as {example}, got {value!r}")
    listed = list(value)
    wrong = [v for v in listed if not isinstance(v, str)]
    if wrong:
        raise ValueError(f"{what} must be a list of array names (strings), got {value!r}")
    return listed


def row_range(value, what: str = "row_range") -> tuple[int, int] | None:
    """``(start, stop)`` as two ints (``None`` stays ``None``)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__len__") or len(value) != 2:
        raise ValueError(f"{what} must be (start, stop), two whole numbers of rows, got {value!r}")
    return whole_number(value[0], f"{what}[0]", least=0), whole_number(value[1], f"{what}[1]", least=0)
