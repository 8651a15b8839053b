"""Which dimension holds the samples, for stores and datasets that name their dimensions.

One rule for both directions (``prepare_zarr`` from xarray, and the loader opening a store written by
xarray): the sample dimension is a first dimension that is never an inner one (a static
``(lat, lon, level)`` field must not make ``lat`` the sample axis), shared by the most variables, then
holding the most bytes; ties go to the first name in sorted order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def sample_dimension(dims: Mapping[str, Sequence[str]], nbytes: Mapping[str, int] | None = None) -> str | None:
    """The sample dimension among variables ``name -> dimension names`` (``None`` if none has a dimension)."""
    firsts = {d[0] for d in dims.values() if d}
    if not firsts:
        return None
    inner = {x for d in dims.values() for x in d[1:]}
    pool = sorted(firsts - inner or firsts)
    sizes = nbytes or {}

    def weight(dim: str) -> tuple[int, int]:
        names = [n for n, d in dims.items() if d and d[0] == dim]
        return len(names), sum(int(sizes.get(n, 0)) for n in names)

    return max(pool, key=weight)  # max keeps the first of equal weights: sorted order breaks ties
