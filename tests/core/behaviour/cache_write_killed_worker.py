"""A process of test_cache_interrupted.py: one epoch of a remote store read through a chunk cache, whose first
chunk file stops half written (its ``os.write`` or ``os.writev``, whichever the cache calls, writes half the
bytes, prints ``MID-WRITE`` and waits for good): the test kills it there."""

from __future__ import annotations

import os
import sys
import threading
import types

import zarrtorch._read.cache as cache_module
from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset
from zarrtorch._read.cache import wait_for_writes

stopped = threading.Event()  # the first chunk's write stopped once


def half_then_wait(fd: int, data) -> int:
    if stopped.is_set():
        return os.write(fd, data)
    stopped.set()
    written = os.write(fd, memoryview(data)[: len(data) // 2])
    print("MID-WRITE", flush=True)
    threading.Event().wait()  # until killed
    return written


def half_of_buffers_then_wait(fd: int, buffers) -> int:
    if stopped.is_set():
        return os.writev(fd, buffers)
    return half_then_wait(fd, b"".join(bytes(b) for b in buffers))


def main() -> None:
    url, cache_dir = sys.argv[1:3]
    ds = ZarrIterableDataset(url, seed=5, read=ReadOptions(cache_dir=cache_dir))
    stalled = {"write": half_then_wait, "writev": half_of_buffers_then_wait}
    cache_module.os = types.SimpleNamespace(**{**vars(os), **stalled})  # after the marker's write
    for _ in ZarrDataLoader(ds, batch_size=8, rank=0, world_size=1):
        pass
    wait_for_writes()


if __name__ == "__main__":
    main()
