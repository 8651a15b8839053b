"""The private part of ``threading`` zarrtorch relies on (zarrtorch/_compat/threading.py): a callback registered
there runs at exit before the threads of ``concurrent.futures`` executors are joined."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import time
    from concurrent.futures import ThreadPoolExecutor

    from zarrtorch._compat.threading import at_exit_before_executor_joins

    pool = ThreadPoolExecutor(1)
    pool.submit(lambda: (time.sleep(0.5), print("executor thread ended", flush=True)))
    at_exit_before_executor_joins(lambda: print("callback ran", flush=True))
    """
)


def test_the_callback_runs_before_the_executors_threads_are_joined():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["callback ran", "executor thread ended"], done.stdout
