"""Object-storage stand-ins on 127.0.0.1 for the lesson, the tests and the benchmarks.

``HttpStoreServer`` serves a directory over HTTP (GET, HEAD, byte ranges) the way a static bucket or a web
server does, with two knobs real storage has and a local disk lacks: a fixed delay per request (latency) and
faults (a status for chosen keys, or a server that stops answering). ``S3Server`` runs moto's S3 server.
Both are context managers that start on a free port and stop on exit.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


def stored_file(root: Path, key: str) -> Path | None:
    """The file ``key`` names under ``root``, or ``None`` when there is none (or the key leaves ``root``)."""
    path = (root / key).resolve()
    return path if root in path.parents and path.is_file() else None


def byte_range(header: str, size: int) -> tuple[int, int] | None:
    """``(start, stop)`` of an HTTP ``Range: bytes=a-b`` header (``bytes=-n``: the last n bytes) for an object of
    ``size`` bytes, or ``None`` when there is no such header (the whole object)."""
    match = _RANGE.match(header)
    if not match:
        return None
    first, last = match.groups()
    if first == "":
        return max(0, size - int(last)), size
    return int(first), min(size, int(last) + 1 if last else size)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as object stores do
    # answer at once: with Nagle's algorithm, a reply on a reused connection waits for the client's delayed ack
    # (about 40 ms per request here), which would add latency the lesson did not ask for
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, *args) -> None:  # quiet: the tests and the lesson print what matters
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        owner = self.server.owner
        owner.answering(+1)
        try:
            self._answer(owner, body)
        finally:
            owner.answering(-1)

    def _answer(self, owner: HttpStoreServer, body: bool) -> None:
        key = unquote(urlsplit(self.path).path).lstrip("/")
        owner.count(key)
        if owner.hanging.is_set():
            owner.release.wait()  # a server that stopped answering: the client must give up on its own
            return
        if owner.delay_s:
            time.sleep(owner.delay_s)
        status = next((code for pattern, code in owner.faults.items() if re.search(pattern, key)), None)
        if status is not None and owner.fault_times is not None and owner.requests[key] > owner.fault_times:
            status = None  # this key's faults are spent: answered as stored from now on
        if status == GARBLED:  # not HTTP at all: the client cannot parse it
            self.wfile.write(b"GARBAGE-NOT-HTTP\r\n\r\n")
            self.close_connection = True
            return
        if status == NO_ANSWER:
            owner.release.wait()  # this key's requests are accepted and never answered
            return
        path = stored_file(owner.root, key)
        if status is None and path is None:
            status = 404
        if status is not None and status != CUT_SHORT:
            self.send_response(status)
            if owner.retry_after_s is not None and status in (429, 503):
                self.send_header("Retry-After", f"{owner.retry_after_s:g}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = path.read_bytes()
        if status == CUT_SHORT:  # half the object, with a Content-Length that says half: complete to HTTP
            data = data[: len(data) // 2]
        asked = byte_range(self.headers.get("Range", ""), len(data))
        if asked:
            start, stop = asked
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
            data = data[start:stop]
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if body:
            self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # a burst of new connections (workers starting) is queued, not dropped and retried a second later
    request_queue_size = 1024
    owner: HttpStoreServer

    def handle_error(self, request, client_address) -> None:
        """A client that hangs up mid-answer (a loader stopped early, a timeout) is not the server's error."""
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


NO_ANSWER = -1  # a fault that is no status: the request is accepted and never answered
GARBLED = -2  # a fault that answers bytes that are not HTTP
CUT_SHORT = -3  # a fault that answers the first half of the object as if it were all of it


class HttpStoreServer:
    """Serve ``root`` at ``http://127.0.0.1:PORT/``; ``delay_ms`` per request; ``faults`` maps a regex of
    the key to an HTTP status returned instead of the file (or :data:`NO_ANSWER`, :data:`GARBLED`,
    :data:`CUT_SHORT`), for each key's first ``fault_times`` requests (all when ``None``), with a Retry-After of
    ``retry_after_s`` on a 429 or 503; :meth:`hang` makes it stop answering altogether."""

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        delay_ms: float = 0.0,
        faults: dict[str, int] | None = None,
        fault_times: int | None = None,
        retry_after_s: float | None = None,
    ):
        self.root = Path(root).resolve()
        self.delay_s = delay_ms / 1000
        self.faults = dict(faults or {})
        self.fault_times = fault_times  # each key's first requests that get its fault (None: all of them)
        self.retry_after_s = retry_after_s  # sent with a 429 or 503 fault
        self.hanging = threading.Event()
        self.release = threading.Event()
        self.requests: dict[str, int] = {}
        self.at_once = self.most_at_once = 0  # requests being answered now, and the most there were at a time
        self._lock = threading.Lock()
        self._server: _Server | None = None

    def count(self, key: str) -> None:
        with self._lock:
            self.requests[key] = self.requests.get(key, 0) + 1

    def answering(self, change: int) -> None:
        with self._lock:
            self.at_once += change
            self.most_at_once = max(self.most_at_once, self.at_once)

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the server is not running: use it as `with HttpStoreServer(root) as server:`")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def hang(self) -> None:
        """From now on, accept connections but never answer (a stalled server)."""
        self.hanging.set()

    def start(self) -> HttpStoreServer:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        threading.Thread(target=self._server.serve_forever, name="http-store", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self.release.set()
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> HttpStoreServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class HttpStoreProcess:
    """:class:`HttpStoreServer` in a process of its own, for measurements: a store on another machine costs the
    client's interpreter nothing, while a server in the client's process shares its GIL with the loader (at
    100 ms per request, with 128 requests in flight, 128 of its threads wake and answer inside the process
    measured). Same ``url``; ``requests`` (answers per key) is filled in when it stops. ``asyncio=True``: aiohttp's
    event loop instead of a thread per request; ``bare=True``: an ``asyncio.Protocol`` without a web framework
    (:mod:`zarrtorch.course.bare_http`, the least CPU per request: what latency measurements use)."""

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        delay_ms: float = 0.0,
        asyncio: bool = False,
        bare: bool = False,
        processes: int = 1,
        start_s: float = 60.0,
    ):
        self.root, self.delay_ms, self.start_s = Path(root).resolve(), float(delay_ms), start_s
        self.asyncio, self.bare = asyncio or bare, bare  # the bare server answers from event loops too
        self.processes = max(1, int(processes))  # event loops answering (asyncio only): a store is many servers
        if self.processes > 1 and not self.asyncio:
            raise ValueError("processes > 1 needs asyncio=True or bare=True (the threaded server runs in one process)")
        self.requests: dict[str, int] = {}
        self._proc = None
        self._url: str | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("the server is not running: use it as `with HttpStoreProcess(root) as server:`")
        return self._url

    def start(self) -> HttpStoreProcess:
        import subprocess
        import sys

        cmd = [sys.executable, "-m", "zarrtorch.course.servers", str(self.root), "--delay-ms", str(self.delay_ms)]
        cmd += ["--asyncio", "--processes", str(self.processes)] if self.asyncio else []
        cmd += ["--bare"] if self.bare else []
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = threading.Timer(self.start_s, self._proc.kill)  # a server that never says its address
        ready.start()
        try:
            line = self._proc.stdout.readline().strip()
        finally:
            ready.cancel()
        if not line.startswith("http://"):
            self._proc.kill()
            raise RuntimeError(f"the store server did not start within {self.start_s:g} s (it printed {line!r})")
        self._url = line
        return self

    def stop(self) -> None:
        import json

        if self._proc is None:
            return
        try:
            # a line, not only the end of its input: DataLoader workers forked meanwhile hold the pipe's writing end
            # open, and the server would see no end until they exit
            out, _ = self._proc.communicate(input="stop\n", timeout=30)
            self.requests = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        except Exception:
            self._proc.kill()
            self._proc.wait()
            raise
        finally:
            self._proc, self._url = None, None

    def __enter__(self) -> HttpStoreProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _serve(argv: list[str] | None = None) -> None:
    """``python -m zarrtorch.course.servers ROOT --delay-ms D [--asyncio]``: print the URL, serve until a line or the
    end of the input, then print the answers per key as JSON (:class:`HttpStoreProcess`)."""
    import argparse
    import json
    import sys

    p = argparse.ArgumentParser(description="serve a directory over HTTP on 127.0.0.1 until a line or the end of stdin")
    p.add_argument("root")
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--asyncio", action="store_true", help="event loops (aiohttp) instead of a thread a request")
    p.add_argument("--bare", action="store_true", help="with --asyncio: asyncio.Protocol, no web framework (bare_http)")
    p.add_argument("--processes", type=int, default=1, help="with --asyncio: processes sharing the listening socket")
    args = p.parse_args(argv)
    if args.asyncio:
        root = Path(args.root).resolve()
        requests = _serve_asyncio(root, args.delay_ms / 1000, processes=args.processes, bare=args.bare)
    else:
        with HttpStoreServer(args.root, delay_ms=args.delay_ms) as server:
            print(server.url, flush=True)
            sys.stdin.readline()
            requests = dict(server.requests)
    print(json.dumps(requests), flush=True)


STOP_WAIT_S = 1.0  # how long a stopping aiohttp server lets the answers in flight finish


def _serve_asyncio(root: Path, delay_s: float, processes: int = 1, bare: bool = False) -> dict[str, int]:
    """The same answers as :class:`HttpStoreServer` (GET, HEAD, byte ranges, a delay per request) from aiohttp
    event loops (``bare``: from :mod:`zarrtorch.course.bare_http`, no web framework): a request waiting out its
    delay costs a timer, not a thread, as in an object store that answers thousands at once. ``processes`` loops,
    each in a process forked before any loop starts, accept from one listening socket (``benchmarks/remote.py
    --plain-client`` measures what they answer). Prints the URL, serves until a line or the end of stdin, returns
    the answers per key of all of them."""
    import asyncio
    import json
    import signal
    import sys

    from aiohttp import web

    requests: dict[str, int] = {}

    async def answer(request: web.Request) -> web.Response:
        key = request.path.lstrip("/")  # aiohttp's path is unquoted already
        requests[key] = requests.get(key, 0) + 1
        if delay_s:
            await asyncio.sleep(delay_s)
        path = stored_file(root, key)
        if path is None:
            return web.Response(status=404)
        data = path.read_bytes()
        headers = {"Accept-Ranges": "bytes"}
        asked = byte_range(request.headers.get("Range", ""), len(data))
        if not asked:
            return web.Response(body=data, headers=headers)
        start, stop = asked
        headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(data)}"
        return web.Response(status=206, body=data[start:stop], headers=headers)

    async def serve(sock: socket.socket, until) -> None:
        if bare:
            from zarrtorch.course import bare_http

            server = await bare_http.start(sock, root, delay_s, requests)
            await until()
            server.close()
            return
        app = web.Application()
        app.router.add_get("/{key:.*}", answer)  # HEAD too
        # a stopped server cuts the answers still waiting out their delay instead of waiting for them (a minute by
        # default): a client that holds the server (a loader's persistent workers) must not keep it from stopping
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=STOP_WAIT_S)
        await runner.setup()
        await web.SockSite(runner, sock, backlog=1024).start()
        await until()
        await runner.cleanup()

    async def until_stdin_ends() -> None:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

    async def until_terminated() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    children = []
    for _ in range(max(1, int(processes)) - 1):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # a child: answer until the parent ends it, then hand over its counts
            os.close(read_end)
            code = 0
            try:
                asyncio.run(serve(sock, until_terminated))
                with os.fdopen(write_end, "w") as out:
                    json.dump(requests, out)
            except BaseException:
                code = 1
            os._exit(code)
        os.close(write_end)
        children.append((pid, read_end))
    print(f"http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    try:
        asyncio.run(serve(sock, until_stdin_ends))
    finally:
        for pid, _ in children:
            os.kill(pid, signal.SIGTERM)
        for pid, read_end in children:
            with os.fdopen(read_end) as counts:
                text = counts.read()
            os.waitpid(pid, 0)
            for key, n in (json.loads(text) if text else {}).items():
                requests[key] = requests.get(key, 0) + n
    return requests


class S3Server:
    """moto's S3-compatible server on 127.0.0.1 (needs ``moto[server]``); ``storage_options`` are what
    zarrtorch, s3fs and obstore need to reach it. Credentials are moto's test ones.

    moto keeps its buckets in the process, not in the server: each start empties them, so a server
    never serves what an earlier one in the same process held. One server at a time per process."""

    key, secret, region = "testing", "testing", "us-east-1"

    def __init__(self):
        self._server = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage_options(self) -> dict:
        return {
            "endpoint_url": self.endpoint,
            "key": self.key,
            "secret": self.secret,
            "client_kwargs": {"region_name": self.region},
        }

    def start(self) -> S3Server:
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"), timeout=30)
        return self

    def create_bucket(self, name: str) -> None:
        import boto3  # moto's own dependency

        boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
            region_name=self.region,
        ).create_bucket(Bucket=name)

    def upload(self, local: str | os.PathLike, url: str) -> None:
        """Copy a local store (a directory) to ``s3://bucket/path``: its contents become ``path``'s, even
        where ``path`` already holds objects (fsspec would nest the directory inside an existing one)."""
        import s3fs

        fs = s3fs.S3FileSystem(**self.storage_options)
        fs.put(os.path.join(os.fspath(local), ""), url.removeprefix("s3://").rstrip("/") + "/", recursive=True)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    _serve()
