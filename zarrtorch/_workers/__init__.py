"""Moving batches and state between a loader's processes and threads.

What the loader shares with its workers (``shared``: the configuration, and the epoch in shared memory);
batches through preallocated shared-memory slots (``ring``); batches handed over from a thread that works
ahead (``workahead``). DataLoader's private parts it relies on are reached through
:mod:`zarrtorch._compat.torch`.

Imported by the top-level modules; imports only ``zarrtorch._util``, ``zarrtorch._compat`` and its own
modules (never a lesson's module, nor ``zarrtorch._read``).
"""
