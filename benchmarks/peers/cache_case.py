"""The cache case's stand-in server: ``zarrtorch.course.servers.HttpStoreServer`` (a static bucket with a delay
per request) that also counts each epoch's requests and bytes, the epochs told by the peer job
(``common.mark_epoch``: a request for ``_epoch/<label>``). One server answers zarrtorch over HTTP and MosaicML
Streaming and LitData over S3: a path-style S3 GET or HEAD of ``/<bucket>/<key>`` is a static file's, so the
folder served (``root``) holds the bucket as its first folder. Runs in ``run.py``'s process (threads): the
loaders measured run in processes of their own.
"""

from __future__ import annotations

import threading
import time
from urllib.parse import unquote, urlsplit

from zarrtorch.course.servers import HttpStoreServer, _Handler, _Server, byte_range, stored_file

EPOCH_MARK = "_epoch/"


class _CountingHandler(_Handler):
    """The stand-in's answers: a file, or the byte range asked for read alone (an S3 client fetches a 64 MiB shard
    in 8 MiB ranges: reading the whole file for each would slow the server, not the loader), after the delay;
    each body's length is added to the epoch's bytes."""

    def _answer(self, owner: EpochCountingServer, body: bool) -> None:
        key = unquote(urlsplit(self.path).path).lstrip("/")
        owner.count(key)
        time.sleep(owner.delay_s)
        path = stored_file(owner.root, key)
        if path is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        size = path.stat().st_size
        start, stop = byte_range(self.headers.get("Range", ""), size) or (0, size)
        if self.headers.get("Range"):
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(stop - start))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if body:
            with path.open("rb") as f:
                f.seek(start)
                self.wfile.write(f.read(stop - start))
            owner.add_bytes(stop - start)


class EpochCountingServer(HttpStoreServer):
    """:class:`HttpStoreServer` whose ``per_epoch`` maps an epoch's label (``"before"`` until the first mark) to
    its ``requests`` (S3 listings and metadata included, the marks not) and ``bytes`` (bodies sent)."""

    def __init__(self, root, *, delay_ms: float = 0.0):
        super().__init__(root, delay_ms=delay_ms)
        self.epoch = "before"
        self.per_epoch: dict[str, dict[str, int]] = {}

    def _current(self) -> dict[str, int]:
        return self.per_epoch.setdefault(self.epoch, {"requests": 0, "bytes": 0})

    def count(self, key: str) -> None:
        super().count(key)
        with self._lock:
            if key.startswith(EPOCH_MARK):
                self.epoch = key[len(EPOCH_MARK) :]
            else:
                self._current()["requests"] += 1

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self._current()["bytes"] += n

    def start(self) -> EpochCountingServer:
        self._server = _Server(("127.0.0.1", 0), _CountingHandler)
        self._server.owner = self
        threading.Thread(target=self._server.serve_forever, name="cache-case-store", daemon=True).start()
        return self


def s3_address(root, folder) -> str:
    """``folder`` (under ``root``, the folder served) as the S3 URL the stand-in answers: its first part is the
    bucket."""
    return "s3://" + folder.resolve().relative_to(root.resolve()).as_posix()


def http_address(url: str, root, folder) -> str:
    """``folder`` (under ``root``) as a plain URL of the stand-in at ``url``."""
    return f"{url}/{folder.resolve().relative_to(root.resolve()).as_posix()}"
