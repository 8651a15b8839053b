"""How each reading process of a loader reads its store: one object, computed once per loader.

The decode threads, the requests kept in flight (fixed, or adapting to latency between a first and a most),
the level a process starts from, the pieces it may hold read ahead and the chunks one reading task decodes:
the worker that reads and :func:`zarrtorch.loader_memory` that bounds what it holds use the same
:class:`ReadPlan`, so the budget cannot count other reads than those made.
"""

from __future__ import annotations

from dataclasses import dataclass

from zarrtorch._read.inflight import HOLD
from zarrtorch._read.reader import reading_threads
from zarrtorch._read.source import all_local
from zarrtorch._util.process import cpu_share
from zarrtorch._util.sizes import SMALL_CHUNK_BYTES, pieces_per_read

REMOTE_IN_FLIGHT = 8  # requests in flight a remote store keeps at least
REMOTE_START = 32  # and starts with (a first epoch at 100 ms spent a third of its time growing from 8)
IN_FLIGHT_BYTES = 256 * 2**20  # decoded chunks the adaptive requests in flight may hold, per process
MOST_IN_FLIGHT = 256  # and never more requests on the wire than this (benchmarks/README.md)


@dataclass(frozen=True, kw_only=True)
class ReadPlan:
    """The reads of one process: ``decode_threads`` threads decoding; between ``first_in_flight`` and
    ``most_in_flight`` requests on the wire (equal: a fixed number), starting at ``start_in_flight``; at most
    ``pieces_ahead`` pieces held read ahead (on the wire, or finished and waiting their turn); ``pieces_per_read``
    consecutive pieces (one chunk each) read by one task of a reading thread."""

    decode_threads: int
    first_in_flight: int
    most_in_flight: int
    start_in_flight: int
    pieces_ahead: int
    pieces_per_read: int

    @property
    def adapts(self) -> bool:
        """Whether the requests in flight adapt to latency (a remote store, no number set)."""
        return self.first_in_flight != self.most_in_flight

    @property
    def chunks_ahead(self) -> int:
        """Chunks one process keeps read ahead at most: what the memory budget counts for its reads."""
        return self.pieces_ahead * self.pieces_per_read

    @property
    def threads(self) -> int:
        """Threads a process reads in (:func:`zarrtorch._read.reader.reading_threads`)."""
        return reading_threads(self.decode_threads, self.most_in_flight)

    @classmethod
    def of(cls, data, num_workers: int, *, decode_threads: int | None = None) -> ReadPlan:
        """The plan of each reading process of a loader over ``data`` (a :class:`~zarrtorch.ZarrIterableDataset`)
        with ``num_workers`` workers (0: the training process reads), decoding in ``decode_threads`` threads
        (default: ``ReadOptions(decode_threads=...)``, else :func:`default_decode_threads`).

        A local store keeps ``decode_threads + 1`` reads in flight, small chunks read several to a task, except
        one of small chunks decoded in one thread (:data:`SMALL_CHUNK_BYTES`), read in the thread that gathers; a remote
        one adapts from ``REMOTE_START`` (at least ``REMOTE_IN_FLIGHT``) up to what ``IN_FLIGHT_BYTES`` of
        decoded chunks hold (at most ``MOST_IN_FLIGHT`` requests), and holds up to ``HOLD`` x that read ahead; a
        number set in ``ReadOptions(requests_in_flight=...)`` stays fixed, one chunk per request."""
        read = data.read
        chunk_bytes = max(1, data.store_chunk_rows * data.row_bytes)
        local = all_local(data.arrays)
        threads = int(decode_threads or read.decode_threads or default_decode_threads(num_workers, chunk_bytes, local))
        if read.requests_in_flight:
            fixed = int(read.requests_in_flight)
            return cls(
                decode_threads=threads,
                first_in_flight=fixed,
                most_in_flight=fixed,
                start_in_flight=fixed,
                pieces_ahead=fixed,
                pieces_per_read=1,
            )
        if local:
            inline = threads == 1 and chunk_bytes <= SMALL_CHUNK_BYTES  # read one at a time where they are gathered
            ahead = 1 if inline else threads + 1
            return cls(
                decode_threads=threads,
                first_in_flight=ahead,
                most_in_flight=ahead,
                start_in_flight=ahead,
                pieces_ahead=ahead,
                pieces_per_read=1 if inline else pieces_per_read(chunk_bytes),
            )
        most = max(REMOTE_IN_FLIGHT, min(MOST_IN_FLIGHT, IN_FLIGHT_BYTES // chunk_bytes))
        return cls(
            decode_threads=threads,
            first_in_flight=REMOTE_IN_FLIGHT,
            most_in_flight=most,
            start_in_flight=min(most, max(REMOTE_IN_FLIGHT, REMOTE_START)),
            pieces_ahead=max(most, min(HOLD * MOST_IN_FLIGHT, IN_FLIGHT_BYTES // chunk_bytes)),
            pieces_per_read=1,
        )


def default_decode_threads(num_workers: int, chunk_bytes: int, local: bool) -> int:
    """Decode threads per reading process when none is set: its share of the CPUs, or one for a local store of
    chunks of at most :data:`SMALL_CHUNK_BYTES` (one thread reads them faster than several: see there)."""
    if local and chunk_bytes <= SMALL_CHUNK_BYTES:
        return 1
    return cpu_share(num_workers)
