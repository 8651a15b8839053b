"""Read one stored object with a deadline and a bounded number of retries.

Object storage answers most requests quickly, a few slowly, and now and then not at all. A read that waits
forever hangs every DDP rank behind it, and a read that fails on the first hiccup ends a job hours in. So
every chunk read from a remote store gets a timeout, transient failures (timeouts, dropped connections, 5xx
answers) are retried with exponential backoff, and what can never succeed (404, 403, bad credentials) fails
at once. When the retries are spent the caller names the store and the chunk (:class:`ChunkReadError`).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import email.utils
import os
import stat
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import zarr
from zarr.abc.buffer import Buffer
from zarr.abc.store import ByteRequest
from zarr.buffer import default_buffer_prototype

from zarrtorch._compat.zarr import event_loop, run
from zarrtorch._util.arguments import finite_number, whole_number

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """``timeout_s`` per request, then up to ``retries`` more attempts, waiting ``backoff_s`` x 2^attempt."""

    timeout_s: float = 30.0
    retries: int = 3
    backoff_s: float = 0.5

    def __post_init__(self):
        object.__setattr__(
            self, "timeout_s", finite_number(self.timeout_s, "RetryPolicy(timeout_s=...)", strictly=True)
        )
        object.__setattr__(self, "retries", whole_number(self.retries, "RetryPolicy(retries=...)", least=0))
        object.__setattr__(self, "backoff_s", finite_number(self.backoff_s, "RetryPolicy(backoff_s=...)"))

    def backoff_after(self, attempt: int) -> float:
        """Seconds waited after failed attempt ``attempt`` (0: the first) before the next: doubled each time."""
        return self.backoff_s * 2**attempt

    def seconds_until_given_up(self) -> float:
        """Seconds from a request's first attempt to its error when nothing ever answers: every attempt waits
        its whole ``timeout_s``, with the back-offs between them (requests in flight wait side by side, so one
        request's attempts are what an epoch waits before its ``ChunkReadError``)."""
        return (self.retries + 1) * self.timeout_s + sum(self.backoff_after(k) for k in range(self.retries))


class RetriesExhausted(RuntimeError):
    """Every attempt failed with a transient error; ``__cause__`` is the last one."""


def is_permanent(exc: BaseException) -> bool:
    """Errors that another attempt cannot fix: a missing or forbidden object, refused credentials, bad
    input. Anything else (timeouts, resets, 5xx, an answer that was not HTTP) is worth another try."""
    if _garbled(exc):
        return False
    if isinstance(exc, (FileNotFoundError, PermissionError, KeyError, ValueError, TypeError, ImportError)):
        return True
    if isinstance(exc, _obstore_refusals()):
        return True
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    return isinstance(status, int) and 400 <= status < 500 and status not in (408, 429)


def _obstore_refusals() -> tuple[type[BaseException], ...]:
    """obstore's errors that another attempt cannot fix (a store opened through zarr's ``ObjectStore``); its
    ``GenericError`` covers transfer faults too, so it stays worth another try. Empty where obstore was never
    imported, which is also where none of its errors can arise."""
    errors = sys.modules.get("obstore.exceptions")
    if errors is None:
        return ()
    names = ("PermissionDeniedError", "UnauthenticatedError", "NotFoundError", "InvalidPathError", "NotSupportedError")
    return tuple(getattr(errors, n) for n in names if hasattr(errors, n))


def _garbled(exc: BaseException) -> bool:
    """An answer the client could not parse (a bad status line, bytes after a body on a kept-alive connection):
    a transfer fault, worth another try, although aiohttp calls it a "400" the server never sent (read as
    permanent, it would end an epoch at the first stray byte, blaming a chunk that was answered right)."""
    try:
        from aiohttp.http_exceptions import HttpProcessingError
    except ImportError:
        return False
    return isinstance(exc.__cause__, HttpProcessingError)


def short(text: str, most: int = 400) -> str:
    """``text`` cut to ``most`` characters: an error may quote a whole response's bytes."""
    text = str(text)
    return text if len(text) <= most else f"{text[: most - 30]}... ({len(text)} characters)"


def wait_before_retry(policy: RetryPolicy, attempt: int, exc: BaseException) -> float:
    """Seconds before the next attempt: the policy's back-off, doubled per attempt, or the server's Retry-After
    where longer (a 429 or 503 that says how long: retries spent before the server's stated wait would fail an
    epoch the server would have finished), up to a minute or the request timeout."""
    wait = policy.backoff_after(attempt)
    after = retry_after_s(exc)
    return max(wait, min(after, max(60.0, policy.timeout_s))) if after is not None else wait


def retry_after_s(exc: BaseException) -> float | None:
    """The Retry-After of an HTTP error (seconds, or a date), or ``None``."""
    headers = getattr(exc, "headers", None)
    value = headers.get("Retry-After") if headers is not None and hasattr(headers, "get") else None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _exhausted(policy: RetryPolicy, exc: BaseException) -> RetriesExhausted:
    after = retry_after_s(exc)
    said = f", the server asked to wait {after:g} s (Retry-After)" if after is not None else ""
    return RetriesExhausted(
        f"{policy.retries + 1} attempts failed (timeout {policy.timeout_s:g} s each{said}); last: "
        f"{type(exc).__name__}: {short(exc) or f'no answer within {policy.timeout_s:g} s'}. More attempts or a "
        "longer back-off: ReadOptions(retry=RetryPolicy(retries=..., backoff_s=...))"
    )


def with_retries(attempt: Callable[[], T], policy: RetryPolicy) -> T:
    """Call ``attempt`` until it succeeds, a permanent error is raised, or the retries are spent."""
    for n in range(policy.retries + 1):
        try:
            return attempt()
        except Exception as exc:
            if is_permanent(exc):
                raise
            if n == policy.retries:
                raise _exhausted(policy, exc) from exc
            time.sleep(wait_before_retry(policy, n, exc))
    raise AssertionError("unreachable")


async def get_buffer(
    store: zarr.abc.store.Store, key: str, policy: RetryPolicy | None, byte_range: ByteRequest | None = None
) -> Buffer:
    """The object at ``key`` (its ``byte_range`` only, where given) as zarr's buffer; each attempt waits
    ``policy.timeout_s`` at most (``policy=None``: one attempt without a deadline, for local stores);
    ``FileNotFoundError`` when the store has none."""
    if policy is None:
        _refuse_a_file_that_is_not_regular(store, key)
        got = await store.get(key, default_buffer_prototype(), byte_range=byte_range)
        if got is None:
            raise FileNotFoundError(key)
        return got
    for n in range(policy.retries + 1):
        try:
            got = await asyncio.wait_for(
                store.get(key, default_buffer_prototype(), byte_range=byte_range), policy.timeout_s
            )
            if got is None:
                raise FileNotFoundError(key)
            return got
        except Exception as exc:
            if is_permanent(exc):
                raise
            if n == policy.retries:
                raise _exhausted(policy, exc) from exc
            await asyncio.sleep(wait_before_retry(policy, n, exc))
    raise AssertionError("unreachable")


def _refuse_a_file_that_is_not_regular(store: zarr.abc.store.Store, key: str) -> None:
    """A local store's object at ``key`` that is there but is no regular file (a named pipe, a device) is refused
    before zarr opens it: zarr's ``open()`` of a named pipe no process writes to waits for a writer forever. (The
    direct decoder opens its files without blocking instead: :data:`zarrtorch._read.fastpath.READ_FLAGS`.)"""
    if not isinstance(store, zarr.storage.LocalStore):
        return
    path = store.root / key
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # missing (zarr says so) or unreadable (zarr's own error names it)
    if not stat.S_ISREG(mode):
        kind = "a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "not a file"
        raise ValueError(f"{path} is {kind}, not a chunk file: replace it with the chunk (re-copy the store)")


def within(coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """Run ``coro`` on zarr's event loop for ``timeout_s`` at most. On expiry it is cancelled there and waited
    for (``TimeoutError``), not abandoned: an abandoned request goes on holding a connection, and at exit
    prints "Exception ignored in <coroutine ...>" tracebacks (or stops the loop from closing). The outer bound
    only matters for a request that ignores its cancellation: never stuck, even then."""
    return run(asyncio.wait_for(coro, timeout_s), timeout=timeout_s + 10)


async def _get(
    store: zarr.abc.store.Store, key: str, policy: RetryPolicy, byte_range: ByteRequest | None = None
) -> bytes:
    return (await get_buffer(store, key, policy, byte_range)).to_bytes()


def get_bytes(
    store: zarr.abc.store.Store, key: str, policy: RetryPolicy, byte_range: ByteRequest | None = None
) -> bytes:
    """The object at ``key`` (its ``byte_range`` only, where given: a shard's index, a run of its inner chunks);
    ``FileNotFoundError`` when the store has none."""
    return run(_get(store, key, policy, byte_range))


async def _get_all(requests: list[tuple[zarr.abc.store.Store, str]], policy: RetryPolicy) -> list[bytes | Exception]:
    return await asyncio.gather(*(_get(store, key, policy) for store, key in requests), return_exceptions=True)


def get_many(requests: list[tuple[zarr.abc.store.Store, str]], policy: RetryPolicy) -> list[bytes | Exception]:
    """Several objects requested at once (each with its own deadline and retries): the arrays of one
    chunk row wait for one round trip instead of one per array. A failure is returned in its place."""
    return run(_get_all(requests, policy))


def fetch_soon(requests: list[tuple[zarr.abc.store.Store, str]], policy: RetryPolicy) -> concurrent.futures.Future:
    """:func:`get_many` started on zarr's event loop, returning at once: a future of the same list. No thread
    waits for the answers: a blocked thread per request in flight (hundreds at 100 ms) fought the event loop
    for the GIL."""
    _settle_at_exit_once()
    return asyncio.run_coroutine_threadsafe(_tracked(requests, policy), event_loop())


# fetch_soon's tasks not finished yet (touched on zarr's loop only). A cancelled one (an epoch left early) still
# has to unwind its requests on the loop; a process that exits first printed "Task was destroyed but it is
# pending!" for each, so at exit they are given a moment to finish, before zarr stops its loop.
_LIVE: set[asyncio.Task] = set()
_SETTLE_S = 2.0
_exit_hook: list[bool] = []


async def _tracked(requests: list[tuple[zarr.abc.store.Store, str]], policy: RetryPolicy) -> list[bytes | Exception]:
    task = asyncio.current_task()
    _LIVE.add(task)
    try:
        return await _get_all(requests, policy)
    finally:
        _LIVE.discard(task)


async def _settle(timeout_s: float) -> None:
    tasks = [t for t in _LIVE if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout_s)


def _settle_now() -> None:
    """Cancel the unfinished requests and wait (at most :data:`_SETTLE_S`) until they have unwound."""
    if not _LIVE:
        return
    try:
        asyncio.run_coroutine_threadsafe(_settle(_SETTLE_S), event_loop()).result(timeout=_SETTLE_S + 1)
    except (RuntimeError, TimeoutError, concurrent.futures.CancelledError):  # the loop is closed, or stopped first
        pass


def _settle_at_exit_once() -> None:
    # registered after zarr's own exit hook (zarr's event loop module is imported above), so it runs first
    if not _exit_hook:
        _exit_hook.append(True)
        atexit.register(_settle_now)
        os.register_at_fork(after_in_child=_LIVE.clear)  # the parent's tasks are not this process's
