"""A Ctrl-C that Python would drop, given back to the main thread.

A ``KeyboardInterrupt`` raised inside a ``__del__`` method (or a weakref callback, or the garbage collector) cannot
propagate: Python reports it to :data:`sys.unraisablehook` ("Exception ignored in ...") and carries on, so the
user's Ctrl-C does nothing and a training loop runs on. A loader runs ``__del__`` methods all the time (every
pooled buffer freed gives itself back to its pool in ``Lease.__del__``), so a Ctrl-C lands in one often enough to
matter, and it can land at a method's first instruction, before any ``try`` inside it could catch it.

:func:`resend_dropped_interrupts` installs a hook that sends the process SIGINT again, from another thread and a
moment later, so that it is raised in the main thread outside the ``__del__``; every other unraisable exception
goes to the hook that was there before. The loader installs it when it makes its first buffer lease, not at import.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

INTERRUPT_AGAIN_AFTER_S = 0.02  # long enough for the __del__ that dropped it to have returned


class Installed:
    """The hook this module installed last: a caller on a hot path compares ``sys.unraisablehook`` with
    ``installed.hook`` itself before it calls :func:`resend_dropped_interrupts` (a Lease is made per chunk)."""

    hook = None


installed = Installed()


def resend_dropped_interrupts() -> None:
    """Make a ``KeyboardInterrupt`` that Python reports as unraisable interrupt the main thread again. Installed
    once; installed again (chained to the new one) if something replaced it since."""
    if sys.unraisablehook is installed.hook:
        return
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            interrupt_again()
        else:
            previous(unraisable)

    sys.unraisablehook = installed.hook = hook


def interrupt_again() -> None:
    """Send this process SIGINT again, from another thread and a moment later: sent from the thread running the
    ``__del__``, the handler would run at once, inside it. Where it lands in a ``__del__`` again (rarely: they are
    short), the hook sends it again."""
    timer = threading.Timer(INTERRUPT_AGAIN_AFTER_S, os.kill, (os.getpid(), signal.SIGINT))
    timer.daemon, timer.name = True, "zarrtorch-interrupt"
    with contextlib.suppress(RuntimeError):  # no new thread at interpreter shutdown: nothing left to interrupt
        timer.start()
