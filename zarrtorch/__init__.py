"""zarrtorch: feed PyTorch (and DDP) training from Zarr arrays chunked along the sample axis.

The core (this package's top-level modules) needs numpy, zarr and torch; ``zarrtorch.lightning`` needs
Lightning; ``zarrtorch.course`` holds what exists only for the course (data generator, demos, studies,
the training entry point) and is never imported by the core.
"""

from zarrtorch.audit import AuditReport, audit
from zarrtorch.budget import MemoryBudget, loader_memory
from zarrtorch.dataset import ZarrIterableDataset
from zarrtorch.layout import FirstAxisLayout, LayoutError, check_first_axis_layout
from zarrtorch.loader import ZarrDataLoader
from zarrtorch.plan import RankPlan, epoch_plan
from zarrtorch.prepare import prepare_zarr
from zarrtorch.reader import ChunkReadError
from zarrtorch.state import LoaderCheckpoint

__version__ = "0.1.0"

__all__ = [
    "AuditReport",
    "ChunkReadError",
    "FirstAxisLayout",
    "LayoutError",
    "LoaderCheckpoint",
    "MemoryBudget",
    "RankPlan",
    "ZarrDataLoader",
    "ZarrIterableDataset",
    "__version__",
    "audit",
    "check_first_axis_layout",
    "epoch_plan",
    "loader_memory",
    "prepare_zarr",
]
