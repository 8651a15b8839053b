"""What a remote store's failures say: never a credential (a password in the URL, a secret in
``storage_options``), a server error on the metadata retried then named, a timeout that names the setting
that exists. Real servers on 127.0.0.1, started and stopped here."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import traceback

import numpy as np
import pytest

from zarrtorch import ChunkReadError, ReadOptions, ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch._read.fetch import RetryPolicy
from zarrtorch._read.source import redact, secrets_of
from zarrtorch.course.servers import HttpStoreServer, S3Server

QUICK = RetryPolicy(timeout_s=1.0, retries=2, backoff_s=0.05)
PASSWORD = "s3cr3t-Pa55"


@pytest.fixture()
def served(tmp_path):
    prepare_zarr({"x": np.arange(80, dtype=np.float32)}, tmp_path / "s.zarr", chunk_rows=10, progress=False)
    return tmp_path


def with_password(url: str) -> str:
    return url.replace("http://", f"http://reader:{PASSWORD}@")


def shown(exc: BaseException) -> str:
    """Everything a user sees of an error: its message, its causes and the traceback text."""
    return "".join(traceback.format_exception(exc))


def test_redact():
    assert redact(f"http://u:{PASSWORD}@h:1/x and s3://k:p@b/y") == "http://u:***@h:1/x and s3://k:***@b/y"
    assert redact("token=abcd1234 in text", ("abcd1234",)) == "token=*** in text"
    options = {
        "key": "AKIA1234",
        "secret": "abcdefgh",
        "endpoint_url": "http://e:1",
        "client_kwargs": {"headers": {"Authorization": "Bearer xyz123"}},
    }
    assert set(secrets_of(options)) == {"AKIA1234", "abcdefgh", "Bearer xyz123"}


def test_a_password_in_an_http_url_is_never_shown(served):
    (served / "s.zarr" / "x" / "c" / "3").unlink()  # a missing chunk
    with HttpStoreServer(served) as server:
        url = with_password(f"{server.url}/s.zarr")
        ds = ZarrIterableDataset(url, shuffle=False, read=ReadOptions(retry=QUICK))
        assert PASSWORD not in repr(ds) and "reader:***@" in repr(ds)
        with pytest.raises(ChunkReadError, match=r"missing chunk 3 .*reader:\*\*\*@") as err:
            list(ZarrDataLoader(ds, batch_size=10))
        assert PASSWORD not in shown(err.value)
        with pytest.raises(FileNotFoundError, match=r"no Zarr store at http://reader:\*\*\*@") as err:
            ZarrIterableDataset(with_password(f"{server.url}/elsewhere.zarr"), read=ReadOptions(retry=QUICK))
        assert PASSWORD not in shown(err.value)
        server.faults[r"x/c/5$"] = 503  # a chunk the server fails on: the retries' message
        with pytest.raises(ChunkReadError, match="3 attempts failed") as err:
            list(
                ZarrDataLoader(
                    ZarrIterableDataset(url, shuffle=False, read=ReadOptions(retry=QUICK, missing_chunks="fill")),
                    batch_size=10,
                )
            )
        assert PASSWORD not in shown(err.value)


def test_a_secret_in_the_storage_options_is_never_shown(served):
    """Wherever a secret of ``storage_options`` would appear (here the store's path holds it), it is masked."""
    token = "tok-9f8e7d6c"
    shutil.move(served / "s.zarr", served / token)
    (served / token / "x" / "c" / "2").unlink()
    with HttpStoreServer(served) as server:
        options = {"client_kwargs": {"headers": {"X-Api-Token": token}}}
        ds = ZarrIterableDataset(
            f"{server.url}/{token}", shuffle=False, read=ReadOptions(retry=QUICK, storage_options=options)
        )
        with pytest.raises(ChunkReadError, match="missing chunk 2") as err:
            list(ZarrDataLoader(ds, batch_size=10))
        assert token not in shown(err.value) and token not in repr(ds)


def test_a_server_error_on_the_metadata_is_retried_then_named(served):
    """HTTP 500 on zarr.json was once read as 'not a readable Zarr store', without another try."""
    with HttpStoreServer(served, faults={r"s\.zarr/zarr\.json$": 500}) as server:
        with pytest.raises(ConnectionError, match=r"answered HTTP 500 .*all 3 attempts") as err:
            ZarrIterableDataset(f"{server.url}/s.zarr", read=ReadOptions(retry=QUICK))
        assert "not a readable Zarr store" not in str(err.value)
        assert server.requests["s.zarr/zarr.json"] == 3
        server.faults.clear()  # the server recovers: the next open works
        assert ZarrIterableDataset(f"{server.url}/s.zarr", read=ReadOptions(retry=QUICK)).rows == 80


def test_a_timeout_names_the_setting_that_exists(served):
    """The message once said 'raise request_timeout_s', which no API has."""
    with HttpStoreServer(served) as server:
        server.hang()
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=r"within 1 s .*RetryPolicy\(timeout_s=") as err:
            ZarrIterableDataset(f"{server.url}/s.zarr", read=ReadOptions(retry=QUICK))
        assert "request_timeout_s" not in str(err.value)
        assert time.monotonic() - start < 20
        server.release.set()


STALLED = RetryPolicy(timeout_s=0.3, retries=1, backoff_s=0.01)


def test_a_server_stalled_before_a_datasets_first_epoch_is_a_chunk_read_error_naming_a_chunk(served):
    """Lesson 07 stalls the server after the dataset opened the store and catches the ChunkReadError of the first
    epoch's chunks; once each epoch began by reading the group's attributes (to tell a store prepare_zarr wrote
    again), that read timed out first and raised RetriesExhausted, which the lesson did not catch. The first epoch
    of a store read without a cache reads nothing of it early: it is not checked, and its chunks say what failed."""
    with HttpStoreServer(served) as server:
        loader = ZarrDataLoader(
            ZarrIterableDataset(f"{server.url}/s.zarr", read=ReadOptions(retry=STALLED)), batch_size=8
        )
        server.hang()
        with pytest.raises(ChunkReadError, match=r"key .x/c/\d") as err:
            list(loader)
        assert "attributes of the group" not in str(err.value)
        server.release.set()


def test_a_server_stalled_before_a_later_epoch_is_the_chunk_read_error_of_its_first_chunk(served):
    """From the second epoch on, the check that the store was not written again runs beside the epoch's first chunk
    reads, as the first epoch's does (it once came first, a round trip before any request of the epoch): a server
    that does not answer at all is the ChunkReadError of the chunk the epoch waited for, not an error of the check
    that hides it."""
    with HttpStoreServer(served) as server:
        loader = ZarrDataLoader(
            ZarrIterableDataset(f"{server.url}/s.zarr", read=ReadOptions(retry=STALLED)), batch_size=8
        )
        assert sum(len(b["x"]) for b in loader) == 80
        server.hang()
        loader.set_epoch(1)
        with pytest.raises(ChunkReadError, match=r"key .x/c/\d") as err:
            list(loader)
        assert "attempts failed" in str(err.value)
        server.release.set()


def test_a_later_epoch_whose_store_check_gets_no_answer_hands_out_no_batch(served):
    """The group's attributes alone unanswered from the second epoch on (its chunks answered): the check, run beside
    the epoch's reads, is waited for before the first batch, and its failure is a ChunkReadError saying what was
    read and why, not a RetriesExhausted from inside it; no batch of the epoch is handed out."""
    from zarrtorch.course.servers import NO_ANSWER

    with HttpStoreServer(served) as server:
        loader = ZarrDataLoader(
            ZarrIterableDataset(f"{server.url}/s.zarr", read=ReadOptions(retry=STALLED)), batch_size=8
        )
        assert sum(len(b["x"]) for b in loader) == 80
        server.faults[r"^s\.zarr/zarr\.json$"] = NO_ANSWER
        loader.set_epoch(1)
        handed_out = []
        with pytest.raises(ChunkReadError, match="attributes of the group .* rewritten") as err:
            handed_out.extend(loader)
        assert handed_out == []
        assert "TimeoutError" in str(err.value) or "attempts failed" in str(err.value)
        server.release.set()


def test_a_later_epoch_requests_its_chunks_while_its_store_check_waits(served):
    """A later epoch's first chunk requests go out while the check of the store's attributes is still unanswered
    (the check once came first, holding every request of the epoch back by a round trip: 210 ms to the first batch
    at 100 ms per request, against 110 for the first epoch); no batch is handed out before the check's outcome,
    here a failure."""
    import threading

    from zarrtorch.course.servers import NO_ANSWER

    with HttpStoreServer(served) as server:
        loader = ZarrDataLoader(
            ZarrIterableDataset(f"{server.url}/s.zarr", read=ReadOptions(retry=RetryPolicy(timeout_s=3, retries=0))),
            batch_size=8,
        )
        assert sum(len(b["x"]) for b in loader) == 80

        def chunk_requests() -> int:
            return sum(n for key, n in list(server.requests.items()) if "/c/" in key)

        before = chunk_requests()
        server.faults[r"^s\.zarr/zarr\.json$"] = NO_ANSWER
        loader.set_epoch(1)
        handed_out, raised = [], []

        def epoch() -> None:
            try:
                handed_out.extend(loader)
            except ChunkReadError as exc:
                raised.append(exc)

        thread = threading.Thread(target=epoch)
        thread.start()
        deadline = time.monotonic() + 20
        while chunk_requests() == before and time.monotonic() < deadline:
            time.sleep(0.01)
        requested_meanwhile = chunk_requests() - before
        server.release.set()  # the check's request stays unanswered: it fails at its deadline (no retries)
        thread.join(30)
        assert requested_meanwhile > 0
        assert handed_out == [] and len(raised) == 1
        assert "attributes of the group" in str(raised[0])


def test_the_datamodule_keeps_a_url(served):
    """``ZarrDataModule("http://...")`` once turned the URL into a path ("http:/127.0.0.1...")."""
    from zarrtorch.lightning import ZarrDataModule

    with HttpStoreServer(served) as server:
        dm = ZarrDataModule(f"{server.url}/s.zarr", batch_size=8, val_fraction=0.25)
        dm.setup("fit")
        rows = [r for b in dm.train_dataloader() for r in b["x"].tolist()]
        assert len(rows) == 56 and set(rows) <= set(range(60))  # 6 chunks of 10 fit, batches of 8


@pytest.mark.slow
def test_the_datamodule_takes_storage_options(served):
    with S3Server() as s3:
        s3.create_bucket("datamodule")  # moto keeps buckets across servers in one process: a name of its own
        s3.upload(served / "s.zarr", "s3://datamodule/s.zarr")
        from zarrtorch.lightning import ZarrDataModule

        read = ReadOptions(storage_options=s3.storage_options)
        dm = ZarrDataModule("s3://datamodule/s.zarr", batch_size=8, read=read)
        dm.setup("fit")
        assert sum(len(b["x"]) for b in dm.val_dataloader()) == 20


# Run in a fresh interpreter: what matters is printed at its exit, once zarr's event loop is closed.
_TIMEOUTS_THEN_EXIT = r"""
import socket, sys, threading
from zarrtorch import ReadOptions, ZarrIterableDataset
from zarrtorch._read.fetch import RetryPolicy

def endpoint(answer):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    held = []  # connections accepted and never answered
    if answer == "accept":
        threading.Thread(target=lambda: [held.append(s.accept()[0]) for _ in iter(int, 1)], daemon=True).start()
    return s, held, f"http://127.0.0.1:{s.getsockname()[1]}"

kept = []
for scheme in sys.argv[1:]:
    for answer in ("listen", "accept"):
        s, held, base = endpoint(answer)
        kept.append((s, held))
        if scheme == "s3":
            url, options = "s3://bucket/x.zarr", {"endpoint_url": base, "key": "k", "secret": "s"}
        else:
            url, options = f"{base}/x.zarr", None
        read = ReadOptions(storage_options=options, retry=RetryPolicy(timeout_s=0.5, retries=0))
        try:
            ZarrIterableDataset(url, read=read)
        except TimeoutError as exc:
            print("TimeoutError:", exc, flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["s3", "http"])
def test_a_timeout_leaves_nothing_to_print_at_exit(scheme):
    """An open that timed out was once abandoned on zarr's event loop, still waiting: at exit it printed
    "Exception ignored in: <coroutine object FsspecStore.get>" tracebacks, or the loop could not close."""
    if scheme == "s3":
        pytest.importorskip("s3fs")
    done = subprocess.run(
        [sys.executable, "-c", _TIMEOUTS_THEN_EXIT, scheme, scheme],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("TimeoutError: no answer from") == 4, done.stdout + done.stderr
    for noise in ("Exception ignored", "was never awaited", "Task was destroyed", "Traceback"):
        assert noise not in done.stderr, done.stderr


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_an_unconsolidated_store_over_http_opens_by_name_and_says_why_it_lists_nothing(tmp_path, zarr_format):
    """A store written by zarr without consolidated metadata lists no arrays over HTTP (no listing there).
    Named arrays open from their own metadata and read every row; unnamed, the error says to name them or to
    consolidate, where it once said "the group holds []" even for a name it has."""
    import zarr

    values = np.arange(90 * 3, dtype=np.float32).reshape(90, 3)
    group = zarr.open_group(str(tmp_path / "plain.zarr"), mode="w", zarr_format=zarr_format)
    group.create_array("x", shape=values.shape, dtype=values.dtype, chunks=(10, 3))[:] = values
    with HttpStoreServer(tmp_path) as server:
        url = f"{server.url}/plain.zarr"
        ds = ZarrIterableDataset(url, variables=["x"], seed=3)
        rows = np.concatenate([b["x"].numpy() for b in ZarrDataLoader(ds, batch_size=16)])
        assert sorted(map(tuple, rows.tolist())) == list(map(tuple, values.tolist()))
        with pytest.raises(LookupError, match=r"lists no arrays.*variables=\[\.\.\.\].*consolidate_metadata"):
            ZarrIterableDataset(url)
        with pytest.raises(KeyError, match=r"unknown array name 'y'.*consolidate_metadata"):
            ZarrIterableDataset(url, variables=["y"])


_LEFT_EARLY_THEN_EXIT = """
import sys
import numpy as np
from zarrtorch import ZarrDataLoader, ZarrIterableDataset, Windows, prepare_zarr
from zarrtorch.course.servers import HttpStoreServer

root = sys.argv[1]
prepare_zarr({"x": np.arange(400, dtype=np.float32)}, root + "/w.zarr", chunk_rows=4, progress=False, overwrite=True)
with HttpStoreServer(root, delay_ms=float(sys.argv[2])) as server:
    ds = ZarrIterableDataset(server.url + "/w.zarr", windows=Windows(history=2, lead=4))
    loader = ZarrDataLoader(ds, batch_size=8)
    try:
        for batch in loader:
            raise KeyboardInterrupt  # a notebook's Ctrl-C at the first batch, many requests still in flight
    except KeyboardInterrupt:
        pass
    loader.set_epoch(1)
print("exiting", flush=True)
"""


@pytest.mark.slow
def test_requests_in_flight_at_exit_leave_nothing_to_print(tmp_path):
    """An epoch left at its first batch cancels its requests on zarr's event loop; a process that exited before
    they had unwound printed "Task was destroyed but it is pending!" for each (and "Future exception was never
    retrieved" once the server had gone). At exit they are now given a moment to finish."""
    for delay_ms in ("0", "50", "200"):
        done = subprocess.run(
            [sys.executable, "-c", _LEFT_EARLY_THEN_EXIT, str(tmp_path), delay_ms],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0 and "exiting" in done.stdout, done.stderr
        for noise in ("Task was destroyed", "never retrieved", "Exception ignored", "Traceback", "Warning"):
            assert noise not in done.stderr, (delay_ms, done.stderr)


@pytest.mark.parametrize("odd", ["%41", "a#b", "a?b"])
def test_names_a_url_cannot_hold_are_refused_over_http(tmp_path, odd):
    """fsspec puts keys in URLs unencoded: an array named '%41' beside 'A' streamed A's rows over HTTP,
    silently; '#' and '?' cut the key (every chunk 'missing'). Refused by name; read locally as stored."""
    import zarr

    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    group.create_array("A", shape=(8,), chunks=(4,), dtype="i8")[:] = np.arange(8) + 100
    group.create_array(odd, shape=(8,), chunks=(4,), dtype="i8")[:] = np.arange(8) + 500
    zarr.consolidate_metadata(str(tmp_path / "s.zarr"))
    with HttpStoreServer(tmp_path) as server:
        with pytest.raises(ValueError, match=rf"array '{re.escape(odd)}' .*cannot be read over HTTP.*another name"):
            ZarrIterableDataset(f"{server.url}/s.zarr", variables=[odd])
        assert ZarrIterableDataset(f"{server.url}/s.zarr", variables=["A"]).rows == 8  # the others still open
    local = ZarrIterableDataset(tmp_path / "s.zarr", variables=[odd], shuffle=False)
    np.testing.assert_array_equal(
        np.concatenate([b[odd].numpy() for b in ZarrDataLoader(local, batch_size=4)]), np.arange(8) + 500
    )


def every_row(url, policy) -> list[int]:
    ds = ZarrIterableDataset(url, seed=1, return_index=True, read=ReadOptions(retry=policy, requests_in_flight=1))
    return sorted(int(i) for b in ZarrDataLoader(ds, batch_size=8) for i in b["index"])


@pytest.mark.parametrize("fault", ["garbled", "cut short"])
def test_a_transfer_fault_is_tried_again_not_blamed_on_the_chunk(served, fault):
    """Two answers that ended an epoch at once, with no retry (found by a break-test helper): bytes that are not
    HTTP (aiohttp calls them a 400 the server never sent, which read as permanent), and half a chunk sent as if it
    were all of it (complete to HTTP; the decode then fails, outside the request's retries). The first is
    retried like a reset; the second fetched once more before the chunk is called damaged."""
    from zarrtorch.course.servers import CUT_SHORT, GARBLED

    code = GARBLED if fault == "garbled" else CUT_SHORT
    policy = RetryPolicy(timeout_s=5, retries=2, backoff_s=0.05)
    with HttpStoreServer(served, faults={r"x/c/3$": code}, fault_times=1) as server:
        assert every_row(f"{server.url}/s.zarr", policy) == list(range(80))
        assert server.requests["s.zarr/x/c/3"] == 2  # once faulted, once answered
    with HttpStoreServer(served, faults={r"x/c/3$": CUT_SHORT}) as server:  # every answer cut: the chunk is damaged
        with pytest.raises(ChunkReadError, match=r"chunk 3 .*the same once fetched again: the stored chunk is damaged"):
            every_row(f"{server.url}/s.zarr", policy)


def test_retry_after_is_waited_for(served):
    """A 503 with Retry-After: 1 s: the retries (0.05 s back-off) ran out within 0.15 s, before the server's stated
    wait, and failed an epoch the server would have finished (found by a break-test helper)."""
    import threading

    policy = RetryPolicy(timeout_s=5, retries=2, backoff_s=0.05)
    with HttpStoreServer(served, faults={r"x/c/3$": 503}, retry_after_s=1) as server:
        threading.Timer(0.6, server.faults.clear).start()  # the server is back after 0.6 s
        start = time.monotonic()
        assert every_row(f"{server.url}/s.zarr", policy) == list(range(80))
        assert time.monotonic() - start >= 1.0
    with HttpStoreServer(served, faults={r"x/c/3$": 429}, retry_after_s=0.2) as server:  # never back: said
        with pytest.raises(
            ChunkReadError, match=r"the server asked to wait 0.2 s \(Retry-After\).*RetryPolicy\(retries"
        ):
            every_row(f"{server.url}/s.zarr", policy)


def test_the_arrays_of_a_dataset_print_without_the_password(served):
    """``str(ds.arrays)`` printed zarr's own repr of each array, whose store URL held the password."""
    with HttpStoreServer(served) as server:
        ds = ZarrIterableDataset(with_password(f"{server.url}/s.zarr"), read=ReadOptions(retry=QUICK))
        for text in (
            str(ds.arrays),
            repr(ds.arrays),
            f"{ds.arrays}",
            str(ZarrDataLoader(ds, batch_size=8).data.arrays),
        ):
            assert PASSWORD not in text and "reader:***@" in text
