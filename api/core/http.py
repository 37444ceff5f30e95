"""How ``hetsched serve`` writes HTTP answers: one send per answer, not one per ASGI message.

uvicorn writes each ASGI message to its socket as it comes: the status line and
headers, then the body, each a ``send()`` system call (uvloop's ``write`` sends at
once while the socket takes it) and each a TCP segment that wakes the client. With
fifty dashboards polling one job, those calls were about half of the event loop's
time (py-spy, ``GET /jobs/{id}`` answered from memory). :class:`OneSendHttpProtocol`
is uvicorn's httptools protocol with writes made in one turn of the event loop sent
together (``writelines``: one ``writev``), the way a server that builds the whole
answer before writing it sends it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

FLUSH_AT_BYTES = 64 * 1024
"""Held writes past this are sent at once: a streamed download's chunks reach the
transport (and its back-pressure, which pauses the sender) as before."""


class BatchedWrites:
    """A transport whose writes are held until the end of the event loop's current turn
    and then sent as one; everything else is the wrapped transport's.

    Closing sends what is held first, so an answer is never cut off; aborting drops it,
    as the wrapped transport drops its own buffer.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._held_bytes = 0

    def write(self, data: bytes) -> None:
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(data)
        self._held_bytes += len(data)
        if self._held_bytes >= FLUSH_AT_BYTES:
            self.flush()

    def flush(self) -> None:
        """Send what is held (a no-op when nothing is, or the transport is closing)."""
        held, self._held, self._held_bytes = self._held, [], 0
        if held and not self._transport.is_closing():
            self._transport.writelines(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held, self._held_bytes = [], 0
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class OneSendHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (``uvicorn.run(http=...)``) writing through
    :class:`BatchedWrites`: an answer's headers and body leave in one send."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = BatchedWrites(transport, self.loop)  # type: ignore[assignment]
