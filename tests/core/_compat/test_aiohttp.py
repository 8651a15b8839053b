"""The private part of aiohttp zarrtorch relies on (zarrtorch/_compat/aiohttp.py): a connector closes its
connections in ``_close``, which ``close()`` and ``__del__`` call, and records it in ``_closed``."""

from __future__ import annotations

import asyncio
import inspect
import os

import pytest

from zarrtorch._compat.aiohttp import own_connections_class

aiohttp = pytest.importorskip("aiohttp")
UPDATE = "update zarrtorch._compat.aiohttp.own_connections_class"


def test_a_connector_closes_through_its_private_close():
    assert "self._close(" in inspect.getsource(aiohttp.BaseConnector.close), UPDATE
    assert "self._close(" in inspect.getsource(aiohttp.BaseConnector.__del__), UPDATE
    assert "self._closed = True" in inspect.getsource(aiohttp.BaseConnector._close), UPDATE


def test_a_copy_in_another_process_closes_nothing_and_says_it_is_closed(monkeypatch):
    """Made to look like a forked copy (``_opened_in`` another pid), the connector reports itself closed and its
    ``close()`` never reaches aiohttp's ``_close``; in its own process it closes as aiohttp's does."""
    closed_by_aiohttp = []
    real_close = aiohttp.TCPConnector._close

    def recording_close(self, *args, **kwargs):
        closed_by_aiohttp.append(self)
        return real_close(self, *args, **kwargs)

    monkeypatch.setattr(aiohttp.TCPConnector, "_close", recording_close)

    async def scenario():
        copy, own = own_connections_class()(limit=0), own_connections_class()(limit=0)
        assert not copy.closed and not own.closed, UPDATE
        copy._opened_in = os.getpid() + 1  # the parent's connector, seen from a forked child
        assert copy.closed, UPDATE
        await copy.close()
        await own.close()
        assert closed_by_aiohttp == [own] and own.closed, UPDATE
        copy._opened_in = os.getpid()  # back in its own process: aiohttp's close works
        copy._closed = False
        await copy.close()
        assert closed_by_aiohttp == [own, copy]

    asyncio.run(scenario())
