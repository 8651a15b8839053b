"""The course's HTTP store server in a process of its own (``servers.HttpStoreProcess``) stops when asked, whatever
its clients are doing."""

import threading
import urllib.request

from zarrtorch.course.servers import HttpStoreProcess


def test_stopping_the_server_does_not_wait_for_a_request_still_being_answered(tmp_path):
    """A benchmark stopped the server while a loader's persistent workers still held it: ``stop()`` waited for the
    answers in flight (aiohttp gives them a minute) and failed after 30 s. A request still waiting out its delay (a
    minute here) is now cut when the server stops, and ``stop()`` returns with the counts."""
    (tmp_path / "x").write_bytes(b"12345")
    errors = []

    def ask(url: str) -> None:
        try:
            urllib.request.urlopen(url, timeout=120).read()
        except Exception as exc:  # noqa: BLE001 (the cut request's error is expected)
            errors.append(exc)

    server = HttpStoreProcess(tmp_path, delay_ms=60_000, asyncio=True).start()
    client = threading.Thread(target=ask, args=(f"{server.url}/x",), daemon=True)
    client.start()
    client.join(1.0)
    assert client.is_alive()  # its answer is a minute away
    server.stop()  # raised subprocess.TimeoutExpired after 30 s before
    assert server.requests == {"x": 1}
    client.join(30)
    assert not client.is_alive() and errors  # cut, not answered


def test_the_server_stops_while_forked_processes_still_hold_its_input(tmp_path):
    """DataLoader workers forked after the server started inherit the writing end of its input: the server waited
    for an end of input that came only when they exited (``stop()`` failed after 30 s with persistent workers
    alive). It now stops on a line."""
    import multiprocessing

    (tmp_path / "x").write_bytes(b"12345")
    server = HttpStoreProcess(tmp_path, asyncio=True).start()
    assert urllib.request.urlopen(f"{server.url}/x", timeout=30).read() == b"12345"
    release = multiprocessing.get_context("fork").Event()
    holder = multiprocessing.get_context("fork").Process(target=release.wait, args=(60,), daemon=True)
    holder.start()  # holds every descriptor of this process, the server's input among them
    try:
        server.stop()
        assert server.requests == {"x": 1}
    finally:
        release.set()
        holder.join(10)
