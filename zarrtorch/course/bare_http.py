"""A delayed object-store stand-in with as little CPU per request as Python allows: HTTP/1.1 straight from an
``asyncio.Protocol``, no web framework.

Why: the stand-in runs on the machine it measures, so every microsecond it spends on a request is taken from the
client a real object store would leave alone. aiohttp's web server (``servers.HttpStoreProcess(asyncio=True)``)
spent 260-320 us of CPU per 59 KiB chunk on the 2-core development machine, and at 100 ms per request a bare
client in a process of its own got about half of what it got from it at 0 ms, its requests reaching the handler
70-150 ms late and the handler's ``asyncio.sleep(0.1)`` ending 160-190 ms after it began
(``benchmarks/README.md``, "What the stand-in server costs"). This one parses a request line and its headers,
notes the time the request was read, and answers it from a timer at that time plus the delay: no task, no
request object, one write per answer.

The rule it keeps, as an object store does: **no request is answered earlier than ``delay_s`` after it was
read**; later only when the process is busy. Answers on one connection leave in the order their requests came
(HTTP/1.1). GET and HEAD of a file under ``root``, a ``Range: bytes=a-b`` header (206), 404 for a missing key, 405
for other methods; each request is counted per key in ``requests`` when it is read.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from pathlib import Path
from urllib.parse import unquote, urlsplit

from zarrtorch.course.servers import byte_range, stored_file

HEAD_END = b"\r\n\r\n"
MOST_HEAD_BYTES = 64 * 2**10  # a request head longer than this is not a store client's: the connection is closed


class DelayedHttp(asyncio.Protocol):
    """One client connection: requests parsed as they arrive, each answered ``delay_s`` after it was read."""

    def __init__(self, root: Path, delay_s: float, requests: dict[str, int]):
        self.root, self.delay_s, self.requests = root, delay_s, requests
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.buffer = b""
        self.body_left = 0  # bytes of a request body still to skip (GET and HEAD have none; a client may send one)
        self.due: deque = deque()  # (when, method, target, headers, close after) in the order the requests came
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        # an answer leaves at once: with Nagle's algorithm it would wait for the client's delayed ack (about 40 ms)
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        now = self.loop.time()  # the time the requests in ``data`` were read: their delays count from here
        self.buffer += data
        while True:
            if self.body_left:
                skipped = min(self.body_left, len(self.buffer))
                self.buffer, self.body_left = self.buffer[skipped:], self.body_left - skipped
                if self.body_left:
                    return
            end = self.buffer.find(HEAD_END)
            if end < 0:
                if len(self.buffer) > MOST_HEAD_BYTES:
                    self.transport.close()
                return
            head, self.buffer = self.buffer[:end].decode("latin-1"), self.buffer[end + len(HEAD_END) :]
            self._read(head, now)

    def _read(self, head: str, now: float) -> None:
        line, *fields = head.split("\r\n")
        parts = line.split(" ")
        if len(parts) != 3:  # not a request line: nothing sensible can be answered on this connection
            self.transport.close()
            return
        method, target, version = parts
        headers = {}
        for field in fields:
            name, _, value = field.partition(":")
            headers[name.strip().lower()] = value.strip()
        try:
            self.body_left = max(0, int(headers.get("content-length", "0") or 0))
        except ValueError:  # a body of unknown length: the next request cannot be found on this connection
            self.transport.close()
            return
        connection = headers.get("connection", "").lower()
        close = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
        key = unquote(urlsplit(target).path).lstrip("/")
        self.requests[key] = self.requests.get(key, 0) + 1
        self.due.append((now + self.delay_s, method, key, headers, close))
        if self.timer is None:
            self.timer = self.loop.call_at(self.due[0][0], self._answer_due)

    def _answer_due(self) -> None:
        """Answer, in order, every request whose time has come; then wait for the next one's."""
        self.timer = None
        now = self.loop.time()
        while self.due and self.due[0][0] <= now and not self.transport.is_closing():
            _, method, key, headers, close = self.due.popleft()
            self.transport.write(self._answer(method, key, headers))
            if close:
                self.due.clear()
                self.transport.close()
        if self.due and not self.transport.is_closing():
            self.timer = self.loop.call_at(self.due[0][0], self._answer_due)

    def _answer(self, method: str, key: str, headers: dict[str, str]) -> bytes:
        if method not in ("GET", "HEAD"):
            return b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nAllow: GET, HEAD\r\n\r\n"
        path = stored_file(self.root, key)
        if path is None:
            return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
        data = path.read_bytes()
        status, extra = "200 OK", ""
        asked = byte_range(headers.get("range", ""), len(data))
        if asked:
            start, stop = asked
            status, extra = "206 Partial Content", f"Content-Range: bytes {start}-{stop - 1}/{len(data)}\r\n"
            data = data[start:stop]
        head = f"HTTP/1.1 {status}\r\nContent-Length: {len(data)}\r\nAccept-Ranges: bytes\r\n{extra}\r\n".encode()
        return head if method == "HEAD" else head + data

    def connection_lost(self, exc) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.due.clear()


async def start(sock: socket.socket, root: Path, delay_s: float, requests: dict[str, int]) -> asyncio.Server:
    """Answer on the listening ``sock`` from the running loop (:class:`DelayedHttp` per connection)."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: DelayedHttp(root, delay_s, requests), sock=sock, backlog=1024)
