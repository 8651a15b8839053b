"""The private part of aiohttp zarrtorch relies on: a connector's ``_close`` and ``_closed``.

``tests/core/_compat/test_aiohttp.py`` checks it against the installed aiohttp (an optional dependency, for
stores read over HTTP; imported here only when a connector is made).
"""

from __future__ import annotations

import functools
import os


@functools.cache
def own_connections_class() -> type:
    """aiohttp's TCPConnector, closing its connections only in the process that opened them.

    Why: a forked process holds copies of the parent's sessions and of its event loop's epoll set, which the fork
    shares. Closing a copied connection there (fsspec's finalizer does, when the child collects a filesystem that
    only fsspec's instance cache held, or at a normal exit) unregisters the parent's socket from that set, and the
    parent's loop then never sees its next answer on it. In another process the connector counts as closed and
    closes nothing: its sockets are the parent's to close. aiohttp closes a connector's connections in its private
    ``_close`` (which ``close()`` and the session call) and records it in ``_closed``; there is no public hook, and
    its ``__del__`` warns of "Unclosed connector" about connections that are the parent's."""
    import aiohttp

    class OwnConnections(aiohttp.TCPConnector):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._opened_in = os.getpid()

        @property
        def closed(self) -> bool:  # in another process: closed, so its session says so and is never used
            return self._closed or os.getpid() != self._opened_in

        def _close(self, *args, **kwargs):
            if os.getpid() != self._opened_in:
                self._closed = True
                return []
            return super()._close(*args, **kwargs)

        def __del__(self, *args, **kwargs):  # nor "Unclosed connector" about another process's connections
            if os.getpid() == self._opened_in:
                super().__del__(*args, **kwargs)

    return OwnConnections
