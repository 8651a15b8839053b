"""Every use of an upstream library's private or undocumented API, in one module per library, each with its reason.

zarrtorch needs a few things its dependencies do not offer publicly: DataLoader's workers and its persistent
iterator (``torch``), the process group's timeout (``torch_distributed``), zarr's event loop, codec pipeline
and shard index (``zarr``), Blosc's C decoder inside numcodecs' extension (``numcodecs``), an async file
system's coroutines (``fsspec``), a connector that closes only its own process's connections (``aiohttp``), and
the lazy wrappers an xarray or dask object keeps its source in (``xarray``, ``dask``). Each function here says
why it reaches inside; ``tests/core/_compat/`` holds a guard test per use that fails, naming the function to
update, when an upgrade changes what it relies on.

Imported by every other layer (``_util``, ``_read``, ``_workers`` and the top-level modules); imports nothing of
zarrtorch but its own modules. The upstream libraries other than torch, numpy and zarr are imported where a
function needs them, never at import time (they are optional).
"""
