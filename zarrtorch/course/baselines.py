"""The usual alternatives zarrtorch is compared with, kept importable so DataLoader workers can use them.

``RowByRowDataset`` is what most first attempts look like: a map-style Dataset whose ``__getitem__``
reads one row from the Zarr store. Every row decodes a whole chunk, so it is slow by design; the course
measures by how much.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.data import Dataset

from zarrtorch import open_arrays


class RowByRowDataset(Dataset):
    """Map-style Dataset reading one row per item (each read decodes the row's whole chunk)."""

    def __init__(self, source, variables: Sequence[str] | None = None):
        self.arrays = open_arrays(source, variables)
        self.rows = int(next(iter(self.arrays.values())).shape[0])

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {name: torch.from_numpy(arr[int(i)]) for name, arr in self.arrays.items()}
