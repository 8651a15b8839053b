"""Check the dataset's numeric settings up front, with messages that say what is allowed: a bad value
found later, inside a worker, would surface as a less readable error in every process at once."""

from __future__ import annotations

import numpy as np


def check_settings(*, seed, buffer_chunks, **at_least_one) -> None:
    """``seed`` an int, ``buffer_chunks`` an integer >= 0, every other keyword ``None`` or >= 1."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int shared by every process, got {seed!r}")
    if isinstance(buffer_chunks, bool) or int(buffer_chunks) != buffer_chunks or buffer_chunks < 0:
        raise ValueError(
            f"buffer_chunks must be an integer >= 0 (0: chunk order only, no row buffer), got {buffer_chunks!r}"
        )
    for name, value in at_least_one.items():
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
