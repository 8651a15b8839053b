"""The private part of Python's ``threading`` zarrtorch relies on: a callback run at exit before the threads of
``concurrent.futures`` executors are joined.

``tests/core/_compat/test_threading.py`` checks it against the running Python.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


def at_exit_before_executor_joins(callback: Callable[[], None]) -> None:
    """Run ``callback`` when the interpreter exits, before ``concurrent.futures`` joins its executors' threads.

    ``atexit`` runs after those joins: a loader's work-ahead thread must end its epoch (and tear down its
    DataLoader workers) before them, or DataLoader's SIGCHLD handler raises inside a join for a worker that died.
    Python runs these callbacks last registered first, and ``concurrent.futures`` registers at its import."""
    threading._register_atexit(callback)  # noqa: SLF001 (no public hook runs before the executors' joins)
