"""The bare stand-in server (``zarrtorch.course.bare_http``) speaks HTTP/1.1 as a bucket does and never answers a
request before its delay: driven here over a raw connection on one event loop, byte for byte."""

from __future__ import annotations

import asyncio
import socket

import pytest

from zarrtorch.course import bare_http


@pytest.fixture
def root(tmp_path):
    (tmp_path / "s.zarr").mkdir()
    (tmp_path / "s.zarr" / "a").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "s.zarr" / "b").write_bytes(b"the second object")
    return tmp_path


def request(method: str, key: str, *headers: str) -> bytes:
    return "\r\n".join([f"{method} /{key} HTTP/1.1", "Host: 127.0.0.1", *headers, "", ""]).encode()


async def read_answer(reader: asyncio.StreamReader, head_only: bool = False) -> tuple[int, dict, bytes, float]:
    """Status, headers (lower-case names), body and the loop's time when it had all of it."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    line, *fields = head.strip().split("\r\n")
    headers = {n.strip().lower(): v.strip() for n, _, v in (f.partition(":") for f in fields)}
    body = b"" if head_only else await reader.readexactly(int(headers["content-length"]))
    return int(line.split(" ")[1]), headers, body, asyncio.get_running_loop().time()


def talk(root, delay_s: float, conversation) -> dict[str, int]:
    """Run ``conversation(reader, writer)`` against a server on a fresh loop; the requests it counted per key."""
    counted: dict[str, int] = {}

    async def main():
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        server = await bare_http.start(sock, root, delay_s, counted)
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        try:
            await asyncio.wait_for(conversation(reader, writer), 30)
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    asyncio.run(main())
    return counted


def test_requests_sent_together_on_one_connection_are_answered_in_their_order_each_as_a_bucket_would(root):
    """GET, HEAD, a byte range, a missing key and another method, written at once: five answers in that order, each
    its own (a 206 with its Content-Range, a HEAD's length without its bytes, 404, 405), and every request counted
    by its key."""
    whole_a, whole_b = (root / "s.zarr" / "a").read_bytes(), (root / "s.zarr" / "b").read_bytes()
    got = []

    async def conversation(reader, writer):
        writer.write(
            request("GET", "s.zarr/a")
            + request("HEAD", "s.zarr/b")
            + request("GET", "s.zarr/a", "Range: bytes=10-19")
            + request("GET", "s.zarr/none")
            + request("DELETE", "s.zarr/b")
        )
        for head_only in (False, True, False, False, False):
            got.append((await read_answer(reader, head_only))[:3])

    counted = talk(root, 0.01, conversation)
    assert got[0] == (200, got[0][1], whole_a) and got[0][1]["content-length"] == str(len(whole_a))
    assert got[1][0] == 200 and got[1][1]["content-length"] == str(len(whole_b)) and got[1][2] == b""
    assert got[2][0] == 206 and got[2][2] == whole_a[10:20]
    assert got[2][1]["content-range"] == f"bytes 10-19/{len(whole_a)}"
    assert [g[0] for g in got[3:]] == [404, 405] and all(g[2] == b"" for g in got[3:])
    assert counted == {"s.zarr/a": 2, "s.zarr/b": 2, "s.zarr/none": 1}


def test_a_request_that_arrives_in_several_pieces_is_answered_once(root):
    """A request head split over three writes (as TCP may deliver it) is one request: one answer, counted once."""
    answers = []

    async def conversation(reader, writer):
        whole = request("GET", "s.zarr/b")
        for piece in (whole[:5], whole[5:20], whole[20:]):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.02)
        answers.append(await read_answer(reader))
        writer.write(request("GET", "s.zarr/b", "Connection: close"))
        answers.append(await read_answer(reader))
        answers.append(await reader.read())  # and nothing more: the connection closed as asked

    counted = talk(root, 0.0, conversation)
    assert [a[0] for a in answers[:2]] == [200, 200] and answers[0][2] == b"the second object"
    assert answers[2] == b""
    assert counted == {"s.zarr/b": 2}


def test_no_answer_leaves_before_the_delay_after_its_request(root):
    """The rule that makes it an honest stand-in for an object store's latency: a request is answered no earlier
    than the delay after it was sent (a lower bound only, which a busy machine can only make later), the second of
    two requests on one connection too, its delay counted from its own arrival."""
    delay = 0.15
    sent, answered = [], []

    async def conversation(reader, writer):
        loop = asyncio.get_running_loop()
        sent.append(loop.time())
        writer.write(request("GET", "s.zarr/a"))
        await asyncio.sleep(delay / 2)
        sent.append(loop.time())
        writer.write(request("GET", "s.zarr/b"))
        answered.extend([(await read_answer(reader))[3], (await read_answer(reader))[3]])

    talk(root, delay, conversation)
    assert all(done - start >= delay for start, done in zip(sent, answered, strict=True)), (sent, answered)
