"""zarrtorch: feed PyTorch (and DDP) training from Zarr arrays chunked along the sample axis.

Two layers. The modules at the top are the ones the lessons build and users import: ``prepare`` and
``layout`` (lesson 01), ``plan`` (02), ``buffer``, ``quality`` and ``windows`` (03), ``dataset`` (the data,
described), ``loader``, ``job`` and ``epoch`` (a loader's job and one epoch in one process), ``stream`` and
``window_stream`` (rows and windows gathered into batches), ``options``, ``readplan``, ``budget`` and ``roofline``
(04), ``lightning`` (05), ``resume``, ``position`` and ``audit`` (06), ``mix`` (several stores mixed by weight). The
machinery behind them lives in private subpackages by role: ``_read`` (opening stores, reading and decoding
chunks), ``_workers`` (moving batches and state between the loader's processes and threads) and ``_util``
(small helpers). The core needs numpy, zarr and torch (``zarrtorch.lightning`` also Lightning);
``zarrtorch.course`` holds what exists only for the course, and the core never imports it.
"""

from zarrtorch._read.cache import clear_cache
from zarrtorch._read.fetch import RetryPolicy
from zarrtorch._read.reader import ChunkReadError
from zarrtorch._read.source import open_arrays
from zarrtorch._util.process import available_cpus
from zarrtorch.audit import AuditReport, MixAuditReport, audit, audit_mix
from zarrtorch.budget import MemoryBudget, loader_memory
from zarrtorch.dataset import ZarrIterableDataset
from zarrtorch.layout import FirstAxisLayout, LayoutError, check_first_axis_layout
from zarrtorch.loader import ZarrDataLoader
from zarrtorch.mix import MixedLoader
from zarrtorch.options import ReadOptions
from zarrtorch.plan import EpochSpec, RankPlan, Topology, epoch_plan
from zarrtorch.prepare import prepare_zarr
from zarrtorch.readplan import ReadPlan
from zarrtorch.resume import LoaderCheckpoint
from zarrtorch.windows import Windows

__version__ = "0.1.0"

__all__ = [
    "AuditReport",
    "ChunkReadError",
    "EpochSpec",
    "FirstAxisLayout",
    "LayoutError",
    "LoaderCheckpoint",
    "MemoryBudget",
    "MixAuditReport",
    "MixedLoader",
    "RankPlan",
    "ReadOptions",
    "ReadPlan",
    "RetryPolicy",
    "Topology",
    "Windows",
    "ZarrDataLoader",
    "ZarrIterableDataset",
    "__version__",
    "audit",
    "audit_mix",
    "available_cpus",
    "check_first_axis_layout",
    "clear_cache",
    "epoch_plan",
    "loader_memory",
    "open_arrays",
    "prepare_zarr",
]
