"""Enough connections for the requests in flight: the client libraries' own pools are smaller.

fsspec's HTTP filesystem opens an aiohttp session whose connector allows 100 connections, and s3fs a botocore
pool of 10. Requests beyond that wait for a free connection inside the client, not for the network, so a
process that keeps 128 or 256 requests in flight (:mod:`zarrtorch._read.inflight`) has at most 100 (or 10) on the wire:
at 100 ms per request, 1,000 (or 100) requests per second whatever the level. Measured in ``benchmarks/README.md``
("the client's pool"). A URL opened by the loader gets a pool the requests in flight cannot exhaust, unless its
``storage_options`` choose one already (``get_client``, ``client_kwargs["connector"]``,
``config_kwargs["max_pool_connections"]``).
"""

from __future__ import annotations

from zarrtorch._compat.aiohttp import own_connections_class

S3_POOL = 512  # connections per process and store for s3://: more than the requests in flight of a few arrays


async def unbounded_http_client(**kwargs):
    """fsspec's ``get_client`` for http(s)://: an aiohttp session without a cap on its connections (the loader's
    requests in flight are its cap). Module level, so that a store holding it pickles into worker processes."""
    import aiohttp

    kwargs.setdefault("connector", own_connections_class()(limit=0))
    return aiohttp.ClientSession(**kwargs)


def with_connection_pool(url: str, storage_options: dict | None) -> dict | None:
    """``storage_options`` for opening ``url``, with a connection pool that holds the requests in flight
    (nothing changed where the options choose a pool, or for other protocols)."""
    options = dict(storage_options or {})
    protocol = url.split("://", 1)[0].lower()
    if protocol in ("http", "https"):
        if "get_client" not in options and "connector" not in options.get("client_kwargs", {}):
            options["get_client"] = unbounded_http_client
    elif protocol in ("s3", "s3a"):
        config = dict(options.get("config_kwargs", {}))
        config.setdefault("max_pool_connections", S3_POOL)
        options["config_kwargs"] = config
    else:
        return storage_options
    return options
