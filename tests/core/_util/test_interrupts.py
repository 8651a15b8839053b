"""A Ctrl-C that lands in a ``__del__`` is raised in the main thread, not dropped (``zarrtorch._util.interrupts``)."""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import pytest

from zarrtorch._util import interrupts
from zarrtorch._util.pool import Lease


@pytest.fixture
def own_hook(monkeypatch):
    """The process's unraisable hook as it was, put back after the test; a recording hook underneath."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    return seen


def unraisable(exc: BaseException) -> SimpleNamespace:
    return SimpleNamespace(exc_type=type(exc), exc_value=exc, exc_traceback=None, err_msg=None, object=None)


def wait_for_the_interrupt() -> None:
    for _ in range(2000):  # the interrupt, sent again, is raised at one of these (10 s at most)
        time.sleep(0.005)


def test_a_ctrl_c_at_the_first_line_of_a_del_still_interrupts(own_hook):
    """1 of 20 Ctrl-Cs sent to a loader with 2 workers was dropped and the loop ran on: the signal's handler ran at
    the first instruction of ``Lease.__del__``, before the ``try`` meant to catch it, and Python printed "Exception
    ignored in: Lease.__del__". Any ``__del__`` can receive it there, so a dropped KeyboardInterrupt is sent again
    from the unraisable hook, whichever ``__del__`` dropped it."""

    class Interrupted:
        def __del__(self):
            raise KeyboardInterrupt  # as the signal's handler raises it, before any line of the method

    Lease(lambda: None)  # the loader's first lease installs the hook
    with pytest.raises(KeyboardInterrupt):
        Interrupted()
        wait_for_the_interrupt()
    assert own_hook == [], "the interrupt is raised again, not reported"


def test_other_unraisable_exceptions_go_to_the_hook_installed_before(own_hook):
    interrupts.resend_dropped_interrupts()
    error = ValueError("in a __del__")
    sys.unraisablehook(unraisable(error))
    assert [u.exc_value for u in own_hook] == [error]


def test_the_hook_is_installed_once_and_again_only_when_replaced(own_hook, monkeypatch):
    interrupts.resend_dropped_interrupts()
    first = sys.unraisablehook
    interrupts.resend_dropped_interrupts()
    assert sys.unraisablehook is first
    replaced = []
    monkeypatch.setattr(sys, "unraisablehook", replaced.append)  # another library's hook, installed later
    Lease(lambda: None)
    assert sys.unraisablehook is not replaced.append
    sys.unraisablehook(unraisable(OSError("later")))
    assert [type(u.exc_value) for u in replaced] == [OSError] and own_hook == []
    with pytest.raises(KeyboardInterrupt):
        sys.unraisablehook(unraisable(KeyboardInterrupt()))
        wait_for_the_interrupt()


def test_nothing_is_installed_at_import():
    """The package's core has no import side effects: a fresh interpreter importing it keeps Python's own hook."""
    import subprocess

    code = "import sys, zarrtorch, zarrtorch._util.pool; print(sys.unraisablehook is sys.__unraisablehook__)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "True\n"
