"""Turn what a user hands the loader (a group, a path or URL, a mapping, an xarray-written store) into a
named set of Zarr arrays, with an error that says what to pass instead when it cannot.

Remote stores (``http(s)://``, ``s3://``, ... through fsspec, or any store a user opened) hold network
sessions bound to the process and event loop that made them; a forked DataLoader worker that reuses its
parent's session fails or hangs. :func:`for_this_process` therefore gives each process its own copy of
every remote array, made from the array's picklable description.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import zarr
import zarr.api.asynchronous
import zarr.storage

from zarrtorch._read.connections import with_connection_pool
from zarrtorch._read.fetch import RetriesExhausted, RetryPolicy, with_retries, within


def is_url(store) -> bool:
    """Whether ``store`` names a remote store (``s3://``, ``https://``...), not a local path."""
    return isinstance(store, str) and "://" in store and not store.startswith("file://")


ACCEPTED = "a zarr.Group, a zarr.Array, a path or URL of a Zarr store, or a mapping name -> zarr.Array"


_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@\s:]*):(?P<password>[^/@\s]*)@")
_SECRET_KEYS = ("key", "secret", "token", "password", "passwd", "credential", "auth", "signature", "session")


def secrets_of(storage_options: dict | None) -> tuple[str, ...]:
    """The string values of ``storage_options`` (nested dicts too) whose keys name a secret (key, secret,
    token, password...): what no message may show."""
    found: list[str] = []

    def walk(options) -> None:
        for name, value in (options or {}).items():
            if isinstance(value, dict):
                walk(value)
            elif isinstance(value, str) and len(value) >= 4 and any(k in str(name).lower() for k in _SECRET_KEYS):
                found.append(value)

    walk(storage_options)
    return tuple(sorted(set(found), key=len, reverse=True))


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` without the password of any ``scheme://user:password@host`` URL, nor any of ``secrets``."""
    text = _CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:***@", str(text))
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def store_label(arr: zarr.Array | zarr.Group, secrets: tuple[str, ...] = ()) -> str:
    """The array's store, as messages show it (credentials removed)."""
    return redact(str(arr.store_path.store), secrets)


def _open_url(url: str, storage_options: dict | None, policy: RetryPolicy):
    """Open a remote store's root with a deadline and the retries of ``policy`` (a server error or a dropped
    connection is tried again), and say what to check when it fails; no message shows a credential."""
    secrets, shown = secrets_of(storage_options), redact(url, secrets_of(storage_options))
    opened_with = with_connection_pool(url, storage_options)

    def attempt():
        try:
            return within(
                zarr.api.asynchronous.open(store=url, mode="r", storage_options=opened_with), policy.timeout_s
            )
        except ImportError as exc:
            raise ImportError(
                f"opening {shown} needs the fsspec backend for its protocol ({exc}); for s3:// "
                "`pip install s3fs`, for http(s):// `pip install aiohttp`"
            ) from exc

    try:
        opened = with_retries(attempt, policy)
    except RetriesExhausted as exc:
        raise _unanswered(shown, exc.__cause__, policy, secrets) from None
    except ImportError:
        raise
    except PermissionError as exc:
        raise PermissionError(
            f"access to {shown} was refused ({redact(exc, secrets)}): check the credentials in "
            "storage_options (key/secret, or anon=True for a public bucket)"
        ) from None
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"no Zarr store at {shown} ({redact(exc, secrets)}): check the URL (bucket and path)"
        ) from None
    except _http_errors() as exc:  # a final answer (retries are for the others): 401, 403, 410...
        raise _refused(shown, exc, secrets) from None
    except (ValueError, KeyError, TypeError) as exc:  # zarr's errors (ValueError) for what is no Zarr metadata
        raise ValueError(
            f"{shown} is not a readable Zarr store ({type(exc).__name__}: {redact(exc, secrets)})"
        ) from None
    except Exception as exc:  # noqa: BLE001 (named with the store, redacted: its text may quote a credential)
        raise ConnectionError(f"cannot open {shown}: {type(exc).__name__}: {redact(exc, secrets)}") from None
    return zarr.Group(opened) if isinstance(opened, zarr.api.asynchronous.AsyncGroup) else zarr.Array(opened)


def _unanswered(shown: str, last: BaseException, policy: RetryPolicy, secrets: tuple[str, ...]) -> OSError:
    """The error for a store whose metadata every attempt failed to read, ``last`` the last attempt's error."""
    attempts = policy.retries + 1
    if isinstance(last, TimeoutError):
        return TimeoutError(
            f"no answer from {shown} within {policy.timeout_s:g} s ({attempts} attempts): check that the server is "
            "up and reachable from here (proxy, firewall), or pass retry=RetryPolicy(timeout_s=...) for a slower one"
        )
    status = getattr(last, "status", None)
    if isinstance(status, int):
        return ConnectionError(
            f"{shown} answered HTTP {status} ({redact(getattr(last, 'message', ''), secrets)}) to all {attempts} "
            "attempts to read its metadata: the server has a problem; try again later, or ask its operator"
        )
    return ConnectionError(
        f"cannot reach {shown}: {type(last).__name__}: {redact(last, secrets)} ({attempts} attempts). Check the host "
        "and port, and that the server is running"
    )


def _http_errors() -> tuple[type[BaseException], ...]:
    """The errors of an HTTP answer (aiohttp's, which fsspec's HTTP file system raises); none without aiohttp."""
    try:
        from aiohttp import ClientResponseError
    except ImportError:
        return ()
    return (ClientResponseError,)


def _refused(shown: str, exc: BaseException, secrets: tuple[str, ...]) -> OSError:
    """The error for a server's final answer to a metadata request: access refused (401, 403), or its status."""
    status, said = getattr(exc, "status", None), redact(getattr(exc, "message", ""), secrets)
    if status in (401, 403):
        return PermissionError(
            f"access to {shown} was refused (HTTP {status} {said}): check the credentials in storage_options "
            "(client_kwargs={'headers': ...} or auth for HTTP; key/secret, or anon=True for a public bucket)"
        )
    return ConnectionError(
        f"{shown} answered HTTP {status} ({said}) to a request for its metadata: check the URL, or ask the server's "
        "operator"
    )


def _open_path(path: str | os.PathLike, storage_options: dict | None = None, policy: RetryPolicy | None = None):
    text = os.fspath(path)
    if is_url(text):
        return _open_url(text, storage_options, policy or RetryPolicy())
    if storage_options:
        raise ValueError(f"storage_options apply to remote stores (a URL such as s3://...), not to {text}")
    local = Path(text.removeprefix("file://")).expanduser()
    if not local.exists():
        unfinished = sorted(local.parent.glob(f".{local.name}.writing-*")) if local.name else []
        if unfinished:  # zarrtorch.prepare_zarr moves a store into place only once it is complete
            raise FileNotFoundError(
                f"no Zarr store at {local}: its writing did not finish ({unfinished[0].name} is what was written "
                "before it stopped). Run prepare_zarr again (it removes that leftover)"
            )
        raise FileNotFoundError(
            f"no Zarr store at {local}: check the path, or create the course data with "
            "`python -m zarrtorch make-data` (or zarrtorch.prepare_zarr for your own data)"
        )
    text = str(local)
    try:
        return zarr.open(text, mode="r")
    except Exception as exc:  # zarr raises several types for "not a store"
        raise ValueError(f"{text} is not a readable Zarr store ({type(exc).__name__}: {exc})") from exc


def _data_variables(group: zarr.Group) -> list[str]:
    """The arrays to stream from a group: those listed by ``prepare_zarr``, else (a store written by
    xarray) the data variables along the sample dimension (:func:`zarrtorch._read.source.sample_dimension`), else
    every array."""
    meta = group.attrs.get("zarrtorch")
    if isinstance(meta, Mapping) and "variables" in meta:
        return list(meta["variables"])
    arrays = dict(group.arrays())
    dims = {n: dimension_names(a) for n, a in arrays.items()}
    if not any(dims.values()):
        return sorted(arrays)
    coords = {c for a in arrays.values() for c in str(a.attrs.get("coordinates", "")).split()}
    dimension_coords = {n for n, d in dims.items() if d and len(d) == 1 and d[0] == n}
    candidates = {n: d for n, d in dims.items() if d and n not in coords | dimension_coords}
    if not candidates:
        return sorted(arrays)
    sample_dim = sample_dimension(candidates, {n: arrays[n].nbytes for n in candidates})
    return sorted(n for n, d in candidates.items() if d[0] == sample_dim)


def dimension_names(arr: zarr.Array):
    """The array's dimension names (Zarr v3 metadata, or xarray's ``_ARRAY_DIMENSIONS`` in v2), or ``None``."""
    named = arr.metadata.dimension_names if hasattr(arr.metadata, "dimension_names") else None
    return named or arr.attrs.get("_ARRAY_DIMENSIONS")


def check_listing(group: zarr.Group, listed: Mapping[str, zarr.Array]) -> None:
    """Refuse a local consolidated group whose folder holds arrays its consolidated copy does not list: added
    after it was written, they would be left out without a word. A remote store cannot list its keys; there an
    array named by ``variables=`` is looked for by its own metadata (:func:`_member`)."""
    if not isinstance(group.store_path.store, zarr.storage.LocalStore):
        return
    on_disk = zarr.open_group(store=group.store_path.store, path=group.path, mode="r", use_consolidated=False)
    added = sorted(set(dict(on_disk.arrays())) - set(listed))
    if added:
        raise ValueError(
            f"the group at {store_label(group)} holds arrays {added} that its consolidated metadata does not list "
            f"(added after it was written). {_CONSOLIDATE}"
        )


_CONSOLIDATE = (
    "Consolidate the store again once: zarr.consolidate_metadata(path) (xarray: to_zarr(..., consolidated=True) on "
    "its last write)"
)


def _member(group: zarr.Group, name: str, listed: Mapping[str, zarr.Array]) -> zarr.Array:
    """The array ``name`` of ``group``: from its listing, else opened by name (a store over HTTP cannot list
    its keys, so an unconsolidated group lists nothing there, yet each array opens from its own metadata)."""
    if name in listed:
        return listed[name]
    try:
        member = group[name]
    except (KeyError, FileNotFoundError):
        member = None
    if not isinstance(member, zarr.Array):
        if group.metadata.consolidated_metadata is not None and _has_own_metadata(group, name):
            raise ValueError(
                f"array {name!r} is in the store at {store_label(group)} but not in its consolidated metadata "
                f"(added after it was written). {_CONSOLIDATE}"
            )
        hint = f" ({_LISTING_HINT})" if not listed else ""
        raise KeyError(f"unknown array name {name!r}: the group holds {sorted(listed)}{hint}")
    return member


def _has_own_metadata(group: zarr.Group, name: str) -> bool:
    """Whether ``name`` has array metadata of its own in the group's store. No object there, or a group's metadata,
    is "no"; a request that fails (a dropped connection, a refusal) answers nothing and is raised as it is."""
    policy = RetryPolicy()
    try:
        _open_own(group.store_path.store, f"{group.path}/{name}".lstrip("/"), None, policy)
    except (FileNotFoundError, zarr.errors.NodeTypeValidationError):
        return False
    except TimeoutError:  # said without a word by the deadline
        raise TimeoutError(
            f"no answer within {policy.timeout_s:g} s to a request for the metadata of array {name!r} at "
            f"{store_label(group)}"
        ) from None
    return True


_LISTING_HINT = (
    "a store read over HTTP cannot list its arrays unless its metadata is consolidated: name the arrays "
    "(variables=[...]), or consolidate the store once with zarr.consolidate_metadata(path), as prepare_zarr does"
)


def _nothing_listed(group: zarr.Group) -> LookupError:
    return LookupError(f"the group at {store_label(group)} lists no arrays: {_LISTING_HINT}")


def open_source(source, storage_options: dict | None = None, retry: RetryPolicy | None = None):
    """``source`` opened where it is a path or URL (a group or an array; a URL with the deadline and retries of
    ``retry``); anything else as given."""
    if isinstance(source, (str, os.PathLike)):
        return _open_path(source, storage_options, retry)
    if storage_options:
        raise ValueError("storage_options apply when the source is a URL; an opened group already has its store")
    return source


def open_arrays(
    source,
    names: Sequence[str] | None = None,
    *,
    storage_options: dict | None = None,
    retry: RetryPolicy | None = None,
) -> dict[str, zarr.Array]:
    """Resolve ``source`` (and optionally a subset ``names``) to ``{name: zarr.Array}``; a URL is opened with
    the deadline and retries of ``retry``."""
    source = open_source(source, storage_options, retry)
    consolidated = False  # a group read from its consolidated metadata, or arrays that may come from one
    if isinstance(source, zarr.Array):
        arrays = {source.basename or "data": source}
        consolidated = True
    elif isinstance(source, zarr.Group):
        available = dict(source.arrays())
        if names is None:
            if not available and not is_local(source):
                raise _nothing_listed(source)
            arrays = {n: _member(source, n, available) for n in _data_variables(source)}
        else:
            arrays = {n: _member(source, n, available) for n in names}
        names = None
        consolidated = source.metadata.consolidated_metadata is not None
        if consolidated:
            check_listing(source, available)
    elif isinstance(source, Mapping):
        arrays = dict(source)
        consolidated = True  # arrays opened by the user, maybe from a consolidated group: checked (one read each)
        for n, a in arrays.items():
            if not isinstance(a, zarr.Array):
                raise TypeError(
                    f"{n!r} maps to a {type(a).__name__}, not a zarr.Array: open it with zarr.open_array(...), "
                    "or write NumPy/dask/xarray data with zarrtorch.prepare_zarr(...) first"
                )
    else:
        raise TypeError(
            f"cannot load from a {type(source).__name__}: pass {ACCEPTED}. "
            "To use in-memory NumPy/xarray data, write it with zarrtorch.prepare_zarr(...) first."
        )
    if names is not None:
        missing = [n for n in names if n not in arrays]
        if missing:
            raise KeyError(f"unknown array name(s) {missing}: available are {sorted(arrays)}")
        arrays = {n: arrays[n] for n in names}
    for name, arr in arrays.items():
        check_url_safe(name, arr)
    if consolidated:
        check_consolidated(arrays, retry or RetryPolicy())
    return arrays


_URL_SPECIAL = "%#?"


def check_url_safe(name: str, arr: zarr.Array) -> None:
    """Refuse an array read over HTTP whose path holds ``%``, ``#`` or ``?``: fsspec puts keys in URLs as they
    are, so the server reads ``%41`` as ``A`` (another array's chunks, silently) and cuts a key at ``#`` or ``?``
    (every chunk then looks missing)."""
    fs = getattr(arr.store_path.store, "fs", None)
    protocols = getattr(fs, "protocol", ()) or ()
    if isinstance(protocols, str):
        protocols = (protocols,)
    if not any(str(p).startswith("http") for p in protocols):
        return
    odd = sorted({c for c in arr.path if c in _URL_SPECIAL})
    if odd:
        raise ValueError(
            f"array {name!r} (path {arr.path!r}) cannot be read over HTTP: its path holds {' '.join(odd)}, which "
            "fsspec leaves unencoded in a URL, so another key would be read (%41 is A) or the key cut short. "
            "Write it again under another name (zarrtorch.prepare_zarr({'new_name': ...}, ...)), or read the store "
            "from a path or from S3"
        )


def check_consolidated(arrays: dict[str, zarr.Array], policy: RetryPolicy) -> None:
    """Refuse arrays whose group's consolidated metadata no longer says what their own metadata says. Zarr
    (and xarray) open a consolidated group from that one copy, so rows appended or an array resized after it
    was written stayed invisible: 20 appended rows of 60 were never streamed, silently, and a shrunk array
    was read past its end. One read of each array's own metadata (a request per array over a network)."""
    for name, arr in arrays.items():
        try:
            own = _own_metadata(arr, policy)
        except FileNotFoundError:
            own = None
        mine, theirs = _fields(arr.metadata), _fields(own) if own is not None else {}
        if own is not None and mine == theirs:
            continue
        if own is None:
            raise ValueError(
                f"array {name!r} of {store_label(arr)} is listed in the group's consolidated metadata, but the "
                f"store holds no metadata of its own for it (removed or moved after the store was consolidated). "
                f"{_CONSOLIDATE}"
            )
        fields = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        said = "; ".join(f"{k} {mine.get(k)} where its own says {theirs.get(k)}" for k in fields[:3])
        raise ValueError(
            f"array {name!r} of {store_label(arr)}: the group's consolidated metadata says {said}. It was "
            "written before the array last changed (rows appended, a resize, new attributes), and zarr reads "
            f"a consolidated group from it alone, so rows would be lost or read past the array's end. {_CONSOLIDATE}"
        )


def _fields(metadata) -> dict[str, str]:
    """Each field of an array's metadata as comparable text (a NaN fill value equals a NaN one)."""
    return {k: json.dumps(v, sort_keys=True, default=repr) for k, v in metadata.to_dict().items()}


def _own_metadata(arr: zarr.Array, policy: RetryPolicy):
    """The array's metadata read from its own document (``zarr.json``, ``.zarray``), not the group's copy."""

    return _open_own(arr.store_path.store, arr.path, arr.metadata.zarr_format, policy, once=is_local(arr)).metadata


def _open_own(store, path: str, zarr_format: int | None, policy: RetryPolicy, once: bool = True):
    """The array at ``path`` opened from its own metadata document, within the policy's deadline (and with its
    retries unless ``once``)."""

    def attempt():
        opening = zarr.api.asynchronous.open_array(store=store, path=path, mode="r", zarr_format=zarr_format)
        return within(opening, policy.timeout_s)

    return attempt() if once else with_retries(attempt, policy)


def is_local(arr: zarr.Array | zarr.Group) -> bool:
    """Whether the array's store lives in this process or on its file system (nothing to reopen)."""
    return isinstance(arr.store_path.store, (zarr.storage.LocalStore, zarr.storage.MemoryStore))


def all_local(arrays: dict[str, zarr.Array]) -> bool:
    """Whether every array is local (:func:`is_local`): no request has a latency or a cost."""
    return all(is_local(a) for a in arrays.values())


_INHERITED: list[list[zarr.Array]] = []  # a parent's remote arrays, forked into this process: never collected here


class Arrays(dict):
    """``{name: zarr.Array}`` whose ``repr`` shows no credential: zarr's own shows each array's store URL whole,
    password included, and a dataset's arrays get printed (a notebook cell, a log line, an error)."""

    def __init__(self, arrays, secrets: tuple[str, ...] = ()):
        super().__init__(arrays)
        self.secrets = tuple(secrets)

    def __repr__(self) -> str:
        return redact(super().__repr__(), self.secrets)

    __str__ = __repr__


def for_this_process(arrays: dict[str, zarr.Array]) -> dict[str, zarr.Array]:
    """The arrays with each remote one rebuilt from its description, so that this process opens its own
    connections (fsspec and obstore create a fresh session when a store is unpickled in a new process).

    The parent's copies are kept, not dropped: collecting one in a forked worker runs fsspec's finalizer on the
    parent's session, which closes its connections through the epoll set the fork shares, so the parent's
    loop stops watching them and its next read on one hangs (and aiohttp prints "Unclosed client session",
    once per worker and epoch). The loader's own HTTP sessions never
    close in another process (:func:`zarrtorch._compat.aiohttp.own_connections_class`); this covers the
    sessions that ``storage_options`` choose (their own client or connector, s3)."""
    _INHERITED.append([a for a in arrays.values() if not is_local(a)])
    own = {n: a if is_local(a) else pickle.loads(pickle.dumps(a)) for n, a in arrays.items()}
    return Arrays(own, getattr(arrays, "secrets", ()))


# -- which dimension holds the samples (shared with prepare_zarr) --------------------------------------------
def sample_dimension(dims: Mapping[str, Sequence[str]], nbytes: Mapping[str, int] | None = None) -> str | None:
    """The sample dimension among variables ``name -> dimension names`` (``None`` if none has a dimension)."""
    firsts = {d[0] for d in dims.values() if d}
    if not firsts:
        return None
    inner = {x for d in dims.values() for x in d[1:]}
    pool = sorted(firsts - inner or firsts)
    sizes = nbytes or {}

    def weight(dim: str) -> tuple[int, int]:
        names = [n for n, d in dims.items() if d and d[0] == dim]
        return len(names), sum(int(sizes.get(n, 0)) for n in names)

    return max(pool, key=weight)  # max keeps the first of equal weights: sorted order breaks ties


def fork_unsafe_stores(stores, start_method: str) -> list:
    """The stores a worker started by ``start_method`` could not read: obstore's (zarr's ``ObjectStore``) under
    ``fork``. obstore is not fork-safe: a forked child's requests go unanswered once the parent has made one, so
    such a worker would wait out its retries on every chunk. Spawned and forkserver workers open the store afresh."""
    if start_method != "fork":
        return []
    return [s for s in stores if isinstance(s, zarr.storage.ObjectStore)]
