"""Would obstore make the remote client stop being the limit? Today's client (zarr's ``FsspecStore``: aiohttp for
HTTP, s3fs for S3, driven by zarrtorch's fetcher) against obstore's (zarr's ``ObjectStore``: Rust, its requests
outside the GIL), on the same store and the same servers, at each delay per request (issue 43, item 3).

    .venv/bin/python benchmarks/obstore_eval.py                       # 100,000 rows, HTTP and S3, 0/20/100 ms
    .venv/bin/python benchmarks/obstore_eval.py --protocols http --parts raw fork --repeats 1

Parts (``--parts``; each repeat measures every part in turn, so a machine that slows for a while slows each alike):

- ``loader``: rows/s of ``ZarrDataLoader`` (batch 64, default settings, median of ``--epochs`` epochs), given the
  URL as today (fsspec) or a group opened on obstore's store. A forked worker cannot use obstore once its parent
  has (the ``fork`` part), so obstore's 2-worker row uses ``forkserver`` workers, kept across epochs; today's client
  is also run that way, so that the start method is not what differs.
- ``raw``: chunk bytes fetched per second, no decoding, for ``--seconds`` with N requests kept in flight (after one
  untimed round that opens the connections): today's store through zarrtorch's fetcher (``fetch._get`` on zarr's
  event loop, as the loader reads), obstore's through the same fetcher, and obstore's synchronous ``get`` from N
  threads (no event loop in Python at all). Beside it the CPU the client process spent per chunk, and the cost of
  decoding those chunks (zarrtorch's direct decoder, 1 and 2 threads).
- ``gil``: the share of the GIL a Python thread that only counts keeps while each client fetches at full speed
  (0 ms, 16 in flight): what is left for the loader's own Python (batches, decoding's Python parts).
- ``zarr``: ``array[:rows]`` through zarr's own API (its default concurrency) on ``FsspecStore`` and on
  ``ObjectStore``, for the first ``--zarr-chunks`` chunks.
- ``fork``: what obstore does in a child process (each case with a deadline, so nothing hangs): a store used before
  a fork and used after it, a copy unpickled in the child, one built in the child, spawn and forkserver children,
  and ``ZarrDataLoader`` with 2 workers over an obstore group, forked and from a forkserver.

Rates at a delay are also given as a ratio to the same setting without delay, taken within each repeat, as
``remote.py`` does. The HTTP server is ``remote.py``'s (``servers.HttpStoreProcess``, one event loop in a process of
its own); S3 is moto's server in a process of its own, a thread per request, with the same delay before each answer.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import os
import pickle
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import zarr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# zarrtorch (torch with it, about 2 s) and remote.py, which imports it, are imported where they are used: the fork
# part's fresh processes and spawned children need only obstore and zarr.

BUCKET = "bench"
PARTS = ("loader", "raw", "gil", "zarr", "fork")


# -- storage_options as users write them today, mapped onto obstore ------------------------------------------
S3_OPTIONS = {
    "endpoint_url": "endpoint",
    "key": "access_key_id",
    "secret": "secret_access_key",
    "token": "session_token",
}
S3_CLIENT_KWARGS = {"region_name": "region", "endpoint_url": "endpoint"}
IGNORED = ("get_client", "config_kwargs")  # zarrtorch's own pool settings: obstore keeps its own pool


def obstore_store(url: str, storage_options: dict | None = None):
    """obstore's store for ``url`` (``http(s)://host/path`` or ``s3://bucket/prefix``), with the fsspec
    ``storage_options`` users pass today mapped onto obstore's configuration: what switching the default would
    need. An option without a counterpart is a ``ValueError`` naming it (such a URL would have to keep fsspec).
    obstore's own retries are switched off: zarrtorch's ``RetryPolicy`` decides, as it does for fsspec."""
    from obstore.store import HTTPStore, S3Store

    options = {k: v for k, v in (storage_options or {}).items() if k not in IGNORED}
    client_kwargs = dict(options.pop("client_kwargs", {}) or {})
    client: dict = {}
    retry = {"max_retries": 0}
    scheme, rest = url.split("://", 1)
    if scheme in ("http", "https"):
        headers = client_kwargs.pop("headers", None)
        if headers:
            client["default_headers"] = dict(headers)
        unmapped = sorted(options) + [f"client_kwargs.{k}" for k in client_kwargs]
        if unmapped:
            raise ValueError(f"no obstore counterpart for storage_options {unmapped} of {url}")
        return HTTPStore.from_url(url, client_options=client | {"allow_http": scheme == "http"}, retry_config=retry)
    if scheme in ("s3", "s3a"):
        bucket, _, prefix = rest.partition("/")
        config = {S3_OPTIONS[k]: options.pop(k) for k in list(options) if k in S3_OPTIONS}
        config |= {S3_CLIENT_KWARGS[k]: client_kwargs.pop(k) for k in list(client_kwargs) if k in S3_CLIENT_KWARGS}
        if options.pop("anon", False):
            config["skip_signature"] = True
        unmapped = sorted(options) + [f"client_kwargs.{k}" for k in client_kwargs]
        if unmapped:
            raise ValueError(f"no obstore counterpart for storage_options {unmapped} of {url}")
        client["allow_http"] = str(config.get("endpoint", "")).startswith("http://")
        return S3Store(bucket, prefix=prefix or None, config=config, client_options=client, retry_config=retry)
    raise ValueError(f"{url}: only http(s):// and s3:// are evaluated here")


def object_group(url: str, storage_options: dict | None = None) -> zarr.Group:
    """The store at ``url`` opened by zarr on obstore (``zarr.storage.ObjectStore``)."""
    return zarr.open_group(zarr.storage.ObjectStore(obstore_store(url, storage_options), read_only=True), mode="r")


# -- the servers --------------------------------------------------------------------------------------------
class Served:
    """One store behind one delayed server: today's URL and options, and the request count once stopped."""

    def __init__(self, protocol: str, delay_ms: float, url: str, storage_options: dict | None, counts):
        self.protocol, self.delay_ms, self.url, self.storage_options = protocol, delay_ms, url, storage_options
        self._counts = counts  # () -> requests answered, after the server stopped

    @property
    def requests(self) -> int:
        return self._counts()


def http_servers(stack: ExitStack, store: Path, delays: list[float]) -> dict[float, Served]:
    from zarrtorch.course import servers

    out = {}
    for delay in delays:
        host = stack.enter_context(servers.HttpStoreProcess(store.parent, delay_ms=delay, asyncio=True))
        out[delay] = Served("http", delay, f"{host.url}/{store.name}", None, lambda h=host: sum(h.requests.values()))
    return out


def s3_servers(stack: ExitStack, store: Path, delays: list[float]) -> dict[float, Served]:
    """moto in a process of its own answering on one port per delay (:func:`serve_s3`), the store uploaded once."""
    from zarrtorch.course import servers

    cmd = [sys.executable, __file__, "--serve-s3", str(store), "--delay-ms", *map(str, delays)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    counts: dict = {}

    def stop() -> None:
        out, _ = proc.communicate(input="", timeout=60)
        counts.update(json.loads(out.strip().splitlines()[-1]))

    stack.callback(stop)
    line = proc.stdout.readline().strip()
    if not line.startswith("{"):
        proc.kill()
        raise RuntimeError(f"the S3 stand-in did not start (it printed {line!r})")
    endpoints = json.loads(line)
    key, secret, region = servers.S3Server.key, servers.S3Server.secret, servers.S3Server.region
    out = {}
    for delay in delays:
        options = {
            "endpoint_url": endpoints[f"{delay:g}"],
            "key": key,
            "secret": secret,
            "client_kwargs": {"region_name": region},
        }
        out[delay] = Served("s3", delay, f"s3://{BUCKET}/{store.name}", options, lambda d=delay: counts[f"{d:g}"])
    return out


def serve_s3(store: Path, delays: list[float]) -> None:
    """moto's S3 application on one port per delay (sleeping that long before each answer, a thread per request,
    as ``servers.HttpStoreServer`` does), ``store`` uploaded as ``s3://bench/<name>``; prints ``{delay: endpoint}``
    as JSON, serves until stdin ends, then prints the GET requests each port answered."""
    import boto3
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import ThreadedWSGIServer, make_server

    from zarrtorch.course import servers

    class Handler(MotoRequestHandler):
        disable_nagle_algorithm = True  # else a kept-alive answer waits for the client's delayed ack (~40 ms)

        def log_request(self, *args) -> None:
            pass

    ThreadedWSGIServer.request_queue_size = 1024  # a burst of new connections is queued, not dropped
    app = DomainDispatcherApplication(create_backend_app)
    counts = {f"{d:g}": 0 for d in delays}
    lock = threading.Lock()

    def delayed(delay: float):
        def answer(environ, start_response):
            if environ["REQUEST_METHOD"] == "GET":
                with lock:
                    counts[f"{delay:g}"] += 1
            if delay:
                time.sleep(delay / 1000)
            return app(environ, start_response)

        return answer

    running = [make_server("127.0.0.1", 0, delayed(d), threaded=True, request_handler=Handler) for d in delays]
    upload = make_server("127.0.0.1", 0, app, threaded=True, request_handler=Handler)
    for server in [*running, upload]:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    s3 = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{upload.server_port}",
        aws_access_key_id=servers.S3Server.key,
        aws_secret_access_key=servers.S3Server.secret,
        region_name=servers.S3Server.region,
    )
    s3.create_bucket(Bucket=BUCKET)
    files = [p for p in store.rglob("*") if p.is_file()]
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda p: s3.put_object(Bucket=BUCKET, Key=f"{store.name}/{p.relative_to(store)}", Body=p.read_bytes()),
                files,
            )
        )
    print(
        json.dumps({f"{d:g}": f"http://127.0.0.1:{s.server_port}" for d, s in zip(delays, running, strict=True)}),
        flush=True,
    )
    sys.stdin.read()
    for server in [*running, upload]:
        server.shutdown()
    print(json.dumps(counts), flush=True)


# -- processes of their own -------------------------------------------------------------------------------
def in_own_session(task: dict, timeout_s: float) -> dict:
    """``task`` run by this script in a fresh process (:func:`run_task`), its answer (the last line it prints, JSON)
    or ``{"error": ...}``. The process is a session of its own, killed with whatever is left of it (DataLoader
    workers, a forkserver) when it ends or after ``timeout_s``: a child that hangs holds nothing up. A fresh process
    per task also keeps obstore out of the processes that fork: a forked child that touches obstore can stop the
    parent's obstore requests too (the ``fork`` part)."""
    import signal
    import tempfile

    cmd = [sys.executable, __file__, "--task", json.dumps(task)]
    with tempfile.TemporaryFile("w+") as said:
        proc = subprocess.Popen(cmd, stdout=said, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
            late = None
        except subprocess.TimeoutExpired:
            late = {"error": f"no answer within {timeout_s:g} s (killed)"}
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        said.seek(0)
        lines = said.read().strip().splitlines()
    if late:
        return late
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"exit {proc.returncode}: " + " / ".join(lines[-3:])}


def run_task(task: dict) -> None:
    """What :func:`in_own_session` asked for, its answer printed as one line of JSON."""
    jobs = {"loader": loader_task, "fork": fork_task, "fork-loader": fork_loader_task}
    print(json.dumps(jobs[task.pop("do")](**task)), flush=True)


# -- (a) the loader -----------------------------------------------------------------------------------------
def loader_task(client, url, storage_options, workers, epochs, batch_size, context) -> dict:
    """Rows/s of each of ``epochs`` epochs of one fresh ``ZarrDataLoader`` with default settings over ``url``
    opened by ``client``; ``context``: a start method for the workers (then kept across epochs, so that one
    start is not timed in each)."""
    from remote import epoch_rate

    from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset

    source = url if client == "fsspec" else object_group(url, storage_options)
    options = storage_options if client == "fsspec" else None
    ds = ZarrIterableDataset(source, seed=0, read=ReadOptions(storage_options=options))
    extra = {"multiprocessing_context": context, "persistent_workers": True} if context and workers else {}
    loader = ZarrDataLoader(ds, batch_size=batch_size, num_workers=workers, **extra)
    return {"rates": [epoch_rate(loader, epoch) for epoch in range(epochs)]}


LOADERS = [  # (client, workers, start method): today's defaults, obstore's, and today's with obstore's workers
    ("fsspec", 0, None),
    ("obstore", 0, None),
    ("fsspec", 2, None),
    ("fsspec", 2, "forkserver"),
    ("obstore", 2, "forkserver"),
]


def measure_loaders(served: Served, args, out: dict) -> None:
    """Each loader of :data:`LOADERS` in a process of its own (a user's training process has one client)."""
    for client, workers, context in LOADERS:
        if workers not in args.workers:
            continue
        task = {"do": "loader", "client": client, "url": served.url, "storage_options": served.storage_options}
        task |= {"workers": workers, "epochs": args.epochs, "batch_size": args.batch_size, "context": context}
        answer = in_own_session(task, args.loader_timeout)
        label = f"{client}, {workers} workers" + (f" ({context}, persistent)" if context else "")
        if "error" in answer:
            raise RuntimeError(f"{served.protocol} {served.delay_ms:g} ms, {label}: {answer['error']}")
        out.setdefault((served.protocol, "loader", label, served.delay_ms), []).append(
            statistics.median(answer["rates"])
        )
        if args.verbose:
            rates = [round(r) for r in answer["rates"]]
            print(f"  {served.protocol} {served.delay_ms:g} ms {label}: {rates} rows/s", flush=True)


# -- (b) raw fetch rate -------------------------------------------------------------------------------------
async def keep_in_flight(get, keys: list[str], n: int, seconds: float) -> tuple[int, int, float]:
    """``n`` requests kept going for ``seconds`` (each coroutine asks for the next key as its answer comes), after
    one untimed round of ``n`` that opens the connections: chunks, bytes and the seconds until the last answer."""
    await asyncio.gather(*(get(keys[i % len(keys)]) for i in range(n)))
    order = itertools.count(n)
    got = [0, 0]
    start = time.perf_counter()
    deadline = start + seconds

    async def one() -> None:
        while time.perf_counter() < deadline:
            data = await get(keys[next(order) % len(keys)])
            got[0] += 1
            got[1] += len(data)

    await asyncio.gather(*(one() for _ in range(n)))
    return got[0], got[1], time.perf_counter() - start


def threads_in_flight(get, keys: list[str], n: int, seconds: float) -> tuple[int, int, float]:
    """The same with ``n`` threads each calling a blocking ``get``."""
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(get, (keys[i % len(keys)] for i in range(n))))
        order = itertools.count(n)
        lock = threading.Lock()
        got = [0, 0]
        start = time.perf_counter()
        deadline = start + seconds

        def one(_) -> None:
            while time.perf_counter() < deadline:
                with lock:
                    key = keys[next(order) % len(keys)]
                data = get(key)
                with lock:
                    got[0] += 1
                    got[1] += len(data)

        list(pool.map(one, range(n)))
    return got[0], got[1], time.perf_counter() - start


def raw_clients(served: Served):
    """``name -> (n, seconds) -> (chunks, bytes, seconds)`` for each client of the raw comparison."""
    import obstore

    from zarrtorch import RetryPolicy
    from zarrtorch._compat.zarr import run as on_zarr_loop
    from zarrtorch._read import fetch
    from zarrtorch._read.source import open_arrays

    policy = RetryPolicy()
    today = open_arrays(served.url, storage_options=served.storage_options, retry=policy)
    today_store = next(iter(today.values())).store_path.store  # opened as the loader opens a URL (its pool)
    native = obstore_store(served.url, served.storage_options)
    object_store = zarr.storage.ObjectStore(native, read_only=True)

    def through_fetcher(store):
        async def get(key):
            return await fetch._get(store, key, policy)

        return lambda keys, n, s: on_zarr_loop(keep_in_flight(get, keys, n, s))

    return {
        "fsspec, zarrtorch's fetcher": through_fetcher(today_store),
        "obstore, zarrtorch's fetcher": through_fetcher(object_store),
        "obstore.get, N threads": lambda keys, n, s: threads_in_flight(
            lambda key: obstore.get(native, key).bytes(), keys, n, s
        ),
    }


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def measure_raw(served: Served, keys: list[str], args, out: dict) -> None:
    for name, measure in raw_clients(served).items():
        for n in args.in_flight:
            cpu = cpu_seconds()
            chunks, nbytes, seconds = measure(keys, n, args.seconds)
            cpu = cpu_seconds() - cpu
            key = (served.protocol, "raw", f"{name}, {n} in flight", served.delay_ms)
            out.setdefault(key, []).append(nbytes / seconds / 2**20)
            out.setdefault((*key[:3], served.delay_ms, "cpu_us"), []).append(1e6 * cpu / max(chunks, 1))


def decode_costs(store: Path, count: int) -> dict:
    """Microseconds per chunk of zarrtorch's direct decoder on ``count`` stored chunks (bytes read first), in 1 and
    2 threads: the CPU that decoding needs beside the fetching."""
    arr = zarr.open_group(store, mode="r")[sorted(zarr.open_group(store, mode="r").array_keys())[0]]
    from zarrtorch._read.fastpath import direct_decoder

    decode = direct_decoder(arr)
    files = sorted(p for p in (store / arr.path / "c").rglob("*") if p.is_file())[:count]
    chunks = [(str(p.relative_to(store / arr.path)), p.read_bytes()) for p in files]
    out = {
        "chunk_bytes": int(np.prod(arr.chunks)) * arr.dtype.itemsize,
        "stored_bytes": sum(len(b) for _, b in chunks) / len(chunks),
    }
    for threads in (1, 2):
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda kb: decode(*kb), chunks[:threads]))
            start = time.perf_counter()
            list(pool.map(lambda kb: decode(*kb), chunks))
            out[f"us_per_chunk_{threads}_threads"] = 1e6 * (time.perf_counter() - start) / len(chunks)
    return out


# -- the GIL ------------------------------------------------------------------------------------------------
def spin_rate(seconds: float) -> float:
    """Iterations/s of a Python loop that only counts (it holds the GIL whenever nothing else wants it)."""
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(1000):
            count += 1
    return count / (time.perf_counter() - start)


def measure_gil(served: Served, keys: list[str], args, out: dict) -> None:
    """The counting thread's rate while each client fetches (16 in flight), as a share of its rate alone."""
    alone = spin_rate(args.seconds)
    for name, measure in raw_clients(served).items():
        result: dict = {}
        worker = threading.Thread(target=lambda m=measure, r=result: r.update(r=m(keys, 16, args.seconds + 0.5)))
        worker.start()
        time.sleep(0.25)  # past the untimed round
        share = spin_rate(args.seconds) / alone
        worker.join()
        chunks, nbytes, seconds = result["r"]
        out.setdefault((served.protocol, "gil", name, served.delay_ms), []).append(share)
        out.setdefault((served.protocol, "gil", name, served.delay_ms, "MiB/s"), []).append(nbytes / seconds / 2**20)


# -- (c) zarr's own reads ----------------------------------------------------------------------------------
def measure_zarr(served: Served, args, out: dict) -> None:
    groups = {
        "FsspecStore": zarr.open_group(served.url, mode="r", storage_options=served.storage_options or {}),
        "ObjectStore": object_group(served.url, served.storage_options),
    }
    for name, group in groups.items():
        arr = group[sorted(group.array_keys())[0]]
        rows = min(arr.shape[0], args.zarr_chunks * arr.chunks[0])
        start = time.perf_counter()
        values = arr[:rows]
        seconds = time.perf_counter() - start
        out.setdefault((served.protocol, "zarr", name, served.delay_ms), []).append(values.nbytes / seconds / 2**20)


# -- fork, spawn, forkserver --------------------------------------------------------------------------------
def _child_get(store, key: str, how: str, url: str, queue) -> None:
    import obstore

    try:
        if how == "built in the child":
            store = obstore_store(url)
        elif how == "unpickled in the child":
            store = pickle.loads(pickle.dumps(store))
        queue.put(f"ok, {len(obstore.get(store, key).bytes())} bytes")
    except BaseException as exc:  # noqa: BLE001 (reported, whatever it is)
        queue.put(f"{type(exc).__name__}: {exc}")


def in_child(method: str, store, key: str, how: str, url: str, timeout_s: float) -> str:
    """What a ``method`` child process gets when it reads ``key`` from ``store`` (``how`` it has it), within
    ``timeout_s``."""
    ctx = multiprocessing.get_context(method)
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_get, args=(store, key, how, url, queue), daemon=True)
    proc.start()
    proc.join(timeout_s)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return f"no answer within {timeout_s:g} s (killed)"
    return queue.get(timeout=5) if not queue.empty() else f"exited {proc.exitcode} without a word"


def answers_within(stores: dict, key: str, timeout_s: float) -> dict[str, str]:
    """Whether this process still gets ``key`` from each of ``stores`` (name -> store), each asked from a thread of
    its own, all given ``timeout_s`` together."""
    import obstore

    got: dict = {}

    def ask(name, store) -> None:
        try:
            got[name] = f"ok, {len(obstore.get(store, key).bytes())} bytes"
        except Exception as exc:  # noqa: BLE001 (reported)
            got[name] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=ask, args=item, daemon=True) for item in stores.items()]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return {name: got.get(name, f"no answer within {timeout_s:g} s") for name in stores}


FORK_CASES = {  # name -> (start method, a request in the parent first, how the child has the store)
    "fork, no request in the parent before it, the store inherited": ("fork", False, "inherited"),
    "fork after a request in the parent, the store inherited": ("fork", True, "inherited"),
    "fork after a request in the parent, the store unpickled in the child": ("fork", True, "unpickled in the child"),
    "fork after a request in the parent, a store built in the child": ("fork", True, "built in the child"),
    "spawn after a request in the parent, the store pickled to the child": ("spawn", True, "inherited"),
    "forkserver after a request in the parent, the store pickled to the child": ("forkserver", True, "inherited"),
}


def fork_task(case: str, url: str, key: str, timeout_s: float) -> dict:
    """One of :data:`FORK_CASES` in this (fresh) process: what the child got, and whether this process's obstore
    still answers afterwards (the same store, and a new one)."""
    import obstore

    method, request_first, how = FORK_CASES[case]
    store = obstore_store(url)
    if request_first:
        obstore.get(store, key).bytes()  # obstore's runtime now runs in this process
    child = in_child(method, store, key, how, url, timeout_s)
    after = {"parent after": store, "new store in the parent": obstore_store(url)}
    return {"child": child} | answers_within(after, key, timeout_s)


def fork_loader_task(method: str, url: str, timeout_s: float) -> dict:
    """One epoch of a 2-worker ``ZarrDataLoader`` over an obstore group (requests of ``timeout_s / 2``, 2
    attempts)."""
    from zarrtorch import ReadOptions, RetryPolicy, ZarrDataLoader, ZarrIterableDataset

    group = object_group(url)
    read = ReadOptions(retry=RetryPolicy(timeout_s=timeout_s / 2, retries=1, backoff_s=0.1))
    ds = ZarrIterableDataset(group, seed=0, read=read)
    try:
        loader = ZarrDataLoader(ds, batch_size=64, num_workers=2, multiprocessing_context=method, timeout=60)
    except ValueError as exc:  # forked workers on an obstore store are refused (zarrtorch.options.check_start_method)
        return {"child": f"refused at construction: {str(exc)[:200]}"}
    start, rows = time.perf_counter(), 0
    total = group[sorted(group.array_keys())[0]].shape[0]
    try:
        for batch in loader:
            rows += len(next(iter(batch.values())))
    except Exception as exc:  # noqa: BLE001 (reported)
        said = str(exc).strip().splitlines()[-1]
        return {"child": f"{type(exc).__name__} after {time.perf_counter() - start:.1f} s: {said[-300:]}"}
    return {"child": f"ok, {rows} of {total} rows in {time.perf_counter() - start:.1f} s"}


def fork_cases(url: str, key: str, timeout_s: float) -> dict[str, dict]:
    """Each case of :data:`FORK_CASES`, and the loader forked and from a forkserver, each in a fresh process."""
    out = {}
    for case in FORK_CASES:
        out[case] = in_own_session(
            {"do": "fork", "case": case, "url": url, "key": key, "timeout_s": timeout_s}, 60 + 3 * timeout_s
        )
    for method in ("fork", "forkserver"):
        name = f"ZarrDataLoader over an obstore group, 2 workers, {method}"
        out[name] = in_own_session({"do": "fork-loader", "method": method, "url": url, "timeout_s": timeout_s}, 120)
    return out


# -- the run ------------------------------------------------------------------------------------------------
def chunk_keys_of(store: Path) -> list[str]:
    """The chunk objects' keys relative to the store's root."""
    metadata = {"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"}
    return sorted(str(p.relative_to(store)) for p in store.rglob("*") if p.is_file() and p.name not in metadata)


def ratios(out: dict, key: tuple) -> list[float]:
    """Each repeat's value over the same repeat's value without delay."""
    base = out.get((key[0], key[1], key[2], 0.0, *key[4:]))
    if not base or key[3] == 0.0:
        return []
    return [v / b for v, b in zip(out[key], base, strict=True)]


def table(out: dict, part: str, delays: list[float], unit: str) -> list[str]:
    from remote import summary

    labels = list(dict.fromkeys(k[2] for k in out if k[1] == part and len(k) == 4))
    lines = []
    for protocol in dict.fromkeys(k[0] for k in out if k[1] == part):
        lines.append(f"| {protocol}: {part} ({unit}) | " + " | ".join(f"{d:g} ms" for d in delays) + " |")
        lines.append("|---|" + "---:|" * len(delays))
        for label in labels:
            cells = []
            for d in delays:
                key = (protocol, part, label, d)
                if key not in out:
                    cells.append("")
                    continue
                r = ratios(out, key)
                cells.append(summary(out[key], 2 if part == "gil" else 0) + (f" ({summary(r, 2)})" if r else ""))
                extra = out.get((*key, "cpu_us"))
                if extra:
                    cells[-1] += f", {summary(extra)} us/chunk"
                fetched = out.get((*key, "MiB/s"))
                if fetched:
                    cells[-1] += f", fetching {summary(fetched)} MiB/s meanwhile"
            if any(cells):
                lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", help="a first-axis-chunked store (default: remote.py's generated one)")
    p.add_argument("--rows", type=int, default=100_000, help="rows of the generated store (64-row chunks)")
    p.add_argument("--protocols", nargs="+", choices=["http", "s3"], default=["http", "s3"])
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--delay-ms", type=float, nargs="+", default=[0.0, 20.0, 100.0])
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2], choices=[0, 2])
    p.add_argument("--epochs", type=int, default=3, help="epochs per loader (the median is taken)")
    p.add_argument("--repeats", type=int, default=3, help="rounds of every measurement (median and spread)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--in-flight", type=int, nargs="+", default=[1, 16, 256], help="requests at once, raw part")
    p.add_argument("--seconds", type=float, default=2.0, help="length of each raw and GIL measurement")
    p.add_argument("--zarr-chunks", type=int, default=256, help="chunks read through zarr's API, zarr part")
    p.add_argument("--decode-chunks", type=int, default=200, help="chunks decoded for the decode cost")
    p.add_argument("--fork-timeout", type=float, default=10.0, help="seconds a child may take in the fork part")
    p.add_argument("--loader-timeout", type=float, default=300.0, help="seconds one loader's epochs may take")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--verbose", action="store_true", help="print each loader's epochs")
    args = p.parse_args(argv)
    from remote import generated_store

    if 0.0 not in args.delay_ms:
        raise SystemExit("--delay-ms must include 0: the ratios are to it")
    store = Path(args.store).resolve() if args.store else generated_store(args.rows)
    keys = chunk_keys_of(store)
    out: dict = {}
    results: dict = {"store": str(store), "chunks": len(keys), "repeats": args.repeats, "epochs": args.epochs}
    import obstore

    results["versions"] = {"obstore": obstore.__version__, "zarr": zarr.__version__}
    timed = [part for part in ("loader", "raw", "gil", "zarr") if part in args.parts]
    with ExitStack() as stack:
        hosts = {}
        for protocol in args.protocols:
            start = http_servers if protocol == "http" else s3_servers
            hosts[protocol] = start(stack, store, args.delay_ms)
        if "fork" in args.parts:
            http = hosts.get("http") or http_servers(stack, store, [0.0])
            results["fork"] = fork_cases(http[0.0].url, keys[0], args.fork_timeout)
        for _ in range(args.repeats if timed else 0):
            for by_delay in hosts.values():
                for delay, served in by_delay.items():
                    if "loader" in args.parts:
                        measure_loaders(served, args, out)
                    if "raw" in args.parts:
                        measure_raw(served, keys, args, out)
                    if "gil" in args.parts and delay == 0.0:
                        measure_gil(served, keys, args, out)
                    if "zarr" in args.parts:
                        measure_zarr(served, args, out)
        served_all = [s for by_delay in hosts.values() for s in by_delay.values()]
    results["requests"] = {f"{s.protocol} {s.delay_ms:g}": s.requests for s in served_all}
    if "raw" in args.parts:
        results["decode"] = decode_costs(store, args.decode_chunks)
    results["measurements"] = [
        {
            "protocol": k[0],
            "part": k[1],
            "setting": k[2],
            "delay_ms": k[3],
            "what": k[4] if len(k) > 4 else "rate",
            "values": v,
            "ratio": ratios(out, k) if len(k) == 4 else [],
        }
        for k, v in out.items()
    ]
    units = {"loader": "rows/s", "raw": "MiB/s", "gil": "share of a counting thread's rate", "zarr": "MiB/s"}
    print(f"{store.name}: {len(keys)} chunks; median [lowest-highest] of {args.repeats}; (x): ratio to 0 ms")
    for part in timed:
        print("\n".join(table(out, part, args.delay_ms if part != "gil" else [0.0], units[part])))
    if "decode" in results:
        d = results["decode"]
        print(
            f"decoding (zarrtorch's direct decoder, {d['chunk_bytes'] / 2**10:g} KiB chunks stored in "
            f"{d['stored_bytes'] / 2**10:.0f} KiB): {d['us_per_chunk_1_threads']:.0f} us/chunk in 1 thread, "
            f"{d['us_per_chunk_2_threads']:.0f} in 2"
        )
    for case, said in results.get("fork", {}).items():
        print(f"{case}: " + "; ".join(f"{k}: {v}" for k, v in said.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-s3":
        at = sys.argv.index("--delay-ms")
        serve_s3(Path(sys.argv[2]), [float(d) for d in sys.argv[at + 1 :]])
    elif len(sys.argv) > 1 and sys.argv[1] == "--task":
        run_task(json.loads(sys.argv[2]))
    else:
        main()
