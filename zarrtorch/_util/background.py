"""A call started now in a daemon thread, its outcome taken later.

For a check that must not add its wait to the work beside it: each epoch of a remote store read without a cache
checks that the store was not rewritten while its chunks are already being read (no round trip before its first
request), so a server that does not answer fails at the
epoch's first chunk, after that chunk's attempts alone. A daemon thread, not an executor's: a check still
retrying against a silent server must not hold the interpreter's exit."""

from __future__ import annotations

import threading
from collections.abc import Callable


class BackgroundCall:
    """``call()`` running in its own daemon thread; :meth:`result` waits for it and raises what it raised."""

    def __init__(self, call: Callable[[], object], name: str):
        self._finished = threading.Event()
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(call,), name=name, daemon=True).start()

    def _run(self, call: Callable[[], object]) -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - taken by result(), raised in the thread that waits for it
            self._error = exc
        finally:
            self._finished.set()

    def done(self) -> bool:
        return self._finished.is_set()

    def result(self) -> None:
        """Wait for the call; raise its exception, once (the thread's frame is not kept alive by a second look)."""
        self._finished.wait()
        error, self._error = self._error, None
        if error is not None:
            raise error
