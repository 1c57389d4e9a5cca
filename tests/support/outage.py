"""An API server that goes away: a TCP relay in front of the in-process API that can be cut
(open connections reset, new ones refused, as when a control plane restarts) and restored on the
same address, so that clients, in this process or in others, meet a real refused connection."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections.abc import AsyncIterator


class Relay:
    def __init__(self, upstream: str) -> None:
        target = urllib.parse.urlsplit(upstream)
        self._target = (target.hostname or "127.0.0.1", target.port or 80)
        self._server: asyncio.Server | None = None
        self._port = 0
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self._port, reuse_address=True)
        self._port = self._server.sockets[0].getsockname()[1]

    async def restore(self) -> None:
        """Accept connections again, on the same address."""
        await self.start()

    async def cut(self) -> None:
        """Refuse new connections and reset the open ones."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._open |= {writer, up_writer}
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True)
        self._open -= {writer, up_writer}


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()


@contextlib.asynccontextmanager
async def relay(upstream: str) -> AsyncIterator[Relay]:
    r = Relay(upstream)
    await r.start()
    try:
        yield r
    finally:
        await r.cut()
