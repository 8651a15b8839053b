"""zarrtorch: feed PyTorch (and DDP) training from Zarr arrays chunked along the sample axis."""

import warnings as _warnings

# Text coordinate labels (variable names) use a Zarr v3 data type whose spec is not frozen yet; the warning
# would appear on every open of the course's stores and teaches nothing here.
_warnings.filterwarnings("ignore", message=r"The data type \(FixedLengthUTF32.*does not have a Zarr V3 specification")
_warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")

__version__ = "0.1.0"

from zarrtorch import paths, plan, quality, synthetic  # noqa: E402  (zt.synthetic.ensure_data() in notebooks)
from zarrtorch.dataset import ZarrIterableDataset  # noqa: E402
from zarrtorch.layout import FirstAxisLayout, LayoutError, check_first_axis_layout  # noqa: E402
from zarrtorch.loader import ZarrDataLoader  # noqa: E402
from zarrtorch.plan import epoch_plan  # noqa: E402
from zarrtorch.prepare import prepare_zarr  # noqa: E402
from zarrtorch.reader import ChunkReadError  # noqa: E402

__all__ = [
    "ZarrIterableDataset", "ZarrDataLoader", "prepare_zarr", "check_first_axis_layout", "epoch_plan",
    "FirstAxisLayout", "LayoutError", "ChunkReadError",
]
