"""Reading and decoding: what a dataset's processes do with a store.

Opening what the user passes (a path, a URL, a group) as named zarr arrays, reopened in every process
(``source``); one request with a deadline and retries per object (``fetch``); whole chunks decoded directly
(``fastpath``) or through zarr's codecs with every damage caught (``chunks``); pieces read ahead in threads,
with errors that name the chunk (``reader``); how many reads are kept in flight, fixed or adapting to the
store's latency (``inflight``); the next epoch's first reads started early (``early``); CF packing and
stacked channels (``columns``).

Imported by the top-level modules; imports only ``zarrtorch._util``, ``zarrtorch._compat`` and its own
modules (never a lesson's module, nor ``zarrtorch._workers``).
"""
