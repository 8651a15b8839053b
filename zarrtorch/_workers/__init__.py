"""Moving batches and state between a loader's processes and threads.

What the loader shares with its workers (``shared``: the configuration, and the epoch in shared memory);
batches through preallocated shared-memory slots (``ring``); batches handed over from a thread that works
ahead (``workahead``); every private or implicit part of ``torch.utils.data`` used, each with a test
(``torch_private``).

Imported by the top-level modules; imports only ``zarrtorch._util`` and its own modules (never a lesson's
module, nor ``zarrtorch._read``).
"""
