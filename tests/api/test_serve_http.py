"""``hetsched serve``'s HTTP protocol (api/core/http.py): an answer leaves in one send,
and no answer is cut, reordered or held back for it (keep-alive, pipelining, a streamed
download, a closing answer)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from api.core.http import FLUSH_AT_BYTES, BatchedWrites, OneSendHttpProtocol
from tests.support import free_port

STREAMED_BYTES = 40 * FLUSH_AT_BYTES


class Recorded(asyncio.Transport):
    """A transport that keeps what it was asked to send, one entry per send."""

    def __init__(self) -> None:
        super().__init__()
        self.sends: list[bytes] = []
        self.closed = self.aborted = False

    def writelines(self, data: Any) -> None:
        self.sends.append(b"".join(data))

    def write(self, data: Any) -> None:
        self.sends.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True


def test_writes_of_one_turn_leave_in_one_send_and_closing_sends_them_first() -> None:
    async def scenario() -> Recorded:
        transport = Recorded()
        batched = BatchedWrites(transport, asyncio.get_running_loop())
        batched.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        batched.write(b"{}")
        assert transport.sends == []  # held until the loop's turn ends
        await asyncio.sleep(0)
        assert transport.sends == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
        batched.write(b"bye")
        batched.close()
        assert transport.sends[-1] == b"bye" and transport.closed
        await asyncio.sleep(0)  # the scheduled flush finds nothing more to send
        assert len(transport.sends) == 2
        return transport

    asyncio.run(scenario())


def test_a_large_write_is_not_held_and_an_abort_drops_what_is() -> None:
    async def scenario() -> None:
        transport = Recorded()
        batched = BatchedWrites(transport, asyncio.get_running_loop())
        batched.write(b"x" * FLUSH_AT_BYTES)
        assert transport.sends == [b"x" * FLUSH_AT_BYTES]  # back-pressure sees it at once
        batched.write(b"never sent")
        batched.abort()
        await asyncio.sleep(0)
        assert transport.aborted and len(transport.sends) == 1

    asyncio.run(scenario())


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    """``/n/<k>``: ``k`` as the body; ``/stream``: STREAMED_BYTES in chunks; ``/close``:
    an answer that ends the connection."""
    if scope["type"] != "http":
        return
    path: str = scope["path"]
    if path == "/stream":
        chunk = b"0123456789abcdef" * 1024
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(STREAMED_BYTES // len(chunk)):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = path.rsplit("/", 1)[-1].encode()
    headers = [(b"content-length", b"%d" % len(body))]
    if path == "/close":
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(
        _app, host="127.0.0.1", port=port, log_level="warning", http=OneSendHttpProtocol
    )
    service = uvicorn.Server(config)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not service.started:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.02)
    yield port
    service.should_exit = True
    thread.join(30)


def _read_all(sock: socket.socket) -> bytes:
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_pipelined_requests_get_their_answers_whole_and_in_order(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=10) as sock:
        sock.sendall(b"".join(b"GET /n/%d HTTP/1.1\r\nHost: x\r\n\r\n" % k for k in range(20)))
        sock.sendall(b"GET /close HTTP/1.1\r\nHost: x\r\n\r\n")
        received = _read_all(sock)  # the last answer closes the connection
    answers = received.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert [a.rsplit(b"\r\n\r\n", 1)[1] for a in answers] == [
        *(b"%d" % k for k in range(20)),
        b"close",
    ]
    assert b"connection: close" in answers[-1]


def test_a_streamed_answer_arrives_whole(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=10) as sock:
        sock.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        received = _read_all(sock)
    head, _, chunked = received.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head
    body, rest = b"", chunked
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        body, rest = body + rest[:size], rest[size + 2 :]
    assert len(body) == STREAMED_BYTES and body[:16] == b"0123456789abcdef"


TCPI_DATA_SEGS_IN = 152
"""Offset of ``tcpi_data_segs_in`` in Linux's ``struct tcp_info`` (include/uapi/linux/tcp.h,
Linux 4.6 on): the segments with data this socket received."""


def _data_segments_in(sock: socket.socket) -> int:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return int.from_bytes(info[TCPI_DATA_SEGS_IN : TCPI_DATA_SEGS_IN + 4], "little")


@pytest.mark.skipif(not hasattr(socket, "TCP_INFO"), reason="Linux TCP_INFO")
def test_a_small_answer_is_one_segment(server: int) -> None:
    """Headers and body in one send, so the client is woken once (uvicorn's own protocol
    sends them as two segments)."""
    with socket.create_connection(("127.0.0.1", server), timeout=10) as sock:
        for k in range(3):
            before = _data_segments_in(sock)
            sock.sendall(b"GET /n/%d HTTP/1.1\r\nHost: x\r\n\r\n" % k)
            time.sleep(0.2)  # the whole answer is in, however many segments it took
            assert sock.recv(65536).endswith(b"\r\n\r\n%d" % k)
            assert _data_segments_in(sock) - before == 1
