"""How `Kube`'s requests travel: aiohttp, in the event loop that makes them.

The official client still reads the kubeconfig or the in-cluster account, and makes each
request's URL and headers (its token refreshed when it expires); aiohttp carries them, with the
client's TLS settings. In the client's own way, a pool of threads, a burst of 1,000 CRs cost the
operator a median 5.89 ms of CPU per CR in process and 7.32 ms on kube-apiserver; in the loop,
4.56 and 6.73 ms (benchmarks/operator_scale.py, three runs each): no hop to a thread and back
for each request, no interpreter lock handed among 32 threads.

Each event loop gets its own session per client (aiohttp's sessions belong to one loop). They are
closed when their loop shuts its asynchronous generators down, as `asyncio.run`, pytest-asyncio
and kopf do on the way out.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import kubernetes
from kubernetes.client.rest import is_socks_proxy_url, should_bypass_proxies

# What a request raised when no answer came: refused, reset, timed out, TLS failed.
UNANSWERED = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


class Answer:
    """An HTTP answer: its status, headers and body as text."""

    def __init__(self, status: int, headers: Mapping[str, str], text: str) -> None:
        self.status, self.headers, self.text = status, headers, text


def ssl_context(cfg: kubernetes.client.Configuration) -> ssl.SSLContext:
    """TLS as the official client sets it up from the same configuration (kubernetes/client/rest.py):
    the cluster's CA, the client certificate, verification and the hostname check."""
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None, cadata=cfg.ca_cert_data or None)
    if not cfg.verify_ssl:
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    elif cfg.assert_hostname is False:
        ctx.check_hostname = False
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return ctx


class Transport:
    """One client's requests, `in_flight` at most at once per event loop, each giving up after
    `timeout` (seconds to connect, then between reads)."""

    def __init__(self, cfg: kubernetes.client.Configuration, in_flight: int, timeout: tuple[float, float]) -> None:
        self._cfg, self._in_flight = cfg, in_flight
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout[0], sock_read=timeout[1])
        proxy = cfg.proxy if cfg.proxy and not should_bypass_proxies(cfg.host, cfg.no_proxy or "") else None
        if proxy and is_socks_proxy_url(proxy):
            raise ValueError(f"a SOCKS proxy ({proxy}) is not supported: use an HTTP proxy")
        # What every request passes besides its own method, URL, headers and body.
        self._extra: dict[str, Any] = {"proxy": proxy, "proxy_headers": cfg.proxy_headers} if proxy else {}
        if cfg.tls_server_name:
            self._extra["server_hostname"] = cfg.tls_server_name
        self._ssl: ssl.SSLContext | bool = ssl_context(cfg) if cfg.host.startswith("https") else False
        # A session per loop; a closed loop's entry keeps its closed session until a new one replaces it.
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}

    async def request(self, method: str, url: str, headers: Mapping[str, str], body: Any = None) -> Answer:
        """Send one request; raises one of UNANSWERED when no answer came."""
        # A body already encoded (server-side apply's YAML or JSON text) goes as it is, as the
        # official client sends it; any other is JSON.
        data = body if body is None or isinstance(body, str | bytes) else json.dumps(body)
        session = await self._session()
        async with session.request(method, url, headers=headers, data=data, **self._extra) as response:
            return Answer(response.status, dict(response.headers), await response.text())

    async def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(limit=self._in_flight, ssl=self._ssl)
            # The official client sends no Accept-Encoding: neither does this one (no gzip on loopback).
            session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, skip_auto_headers=("Accept-Encoding",)
            )
            self._sessions[loop] = session
            await _close_with_the_loop(session)
        return session


# Each loop's sessions, until the loop shuts its asynchronous generators down: held here, a
# session outlives the client that made it and is never collected unclosed.
_SESSIONS: dict[asyncio.AbstractEventLoop, list[aiohttp.ClientSession]] = {}
_CLOSERS: dict[asyncio.AbstractEventLoop, AsyncIterator[None]] = {}


async def _close_with_the_loop(session: aiohttp.ClientSession) -> None:
    loop = asyncio.get_running_loop()
    if loop not in _SESSIONS:
        _SESSIONS[loop] = []
        closer = _closer(loop)
        await anext(closer)  # first iterated in this loop: the loop finalizes it at shutdown
        _CLOSERS[loop] = closer
    _SESSIONS[loop].append(session)


async def _closer(loop: asyncio.AbstractEventLoop) -> AsyncIterator[None]:
    try:
        yield
    finally:
        _CLOSERS.pop(loop, None)
        for session in _SESSIONS.pop(loop, []):
            await session.close()
