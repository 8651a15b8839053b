"""Prototypes: changes to zarrtorch measured by ``run.py --prototypes`` before they go into the package.

A prototype is a patch applied in the fresh process of one zarrtorch run (and so in the DataLoader workers
that run forks); the package's files are not changed and the batches stay bit-identical. It may override
``zarrtorch.buffer.SlotBuffer._gather`` (how a batch's rows leave the shuffle buffer) and returns the
function the main process applies to every batch it receives. ``--prototypes`` also runs the package with
DataLoader's own queue (``transport="queue"``), for comparison with the default ring.

Three earlier prototypes are in the package now: ``direct`` (decode a chunk file straight into the array
the reader returns: ``zarrtorch/fastpath.py``), ``lazyrefill`` (refill the slots a batch freed when the
next batch starts: ``SlotBuffer.apply``) and ``ring`` (batches leave the workers through preallocated
shared-memory slots: ``zarrtorch/ring.py``, the default with workers).
"""

from __future__ import annotations

TRANSPORTS = ("queue", "ring")  # ZarrDataLoader(transport=...) compared by --prototypes

PATCHES: dict = {}  # name -> patch(workers=, batch_size=, row_shape=) -> receive(batch)
