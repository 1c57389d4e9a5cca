"""How `Kube`'s requests travel: aiohttp, in the event loop that makes them.

The official client still reads the kubeconfig or the in-cluster account, and makes each
request's URL and headers (its token refreshed when it expires); aiohttp carries them, with the
client's TLS, proxy and socket settings. Every attribute of the client's Configuration is either
honoured here as the official client honours it, used by the official client itself while it makes
the URL and headers, or refused when set (CONFIGURATION, `check_configuration`): none is dropped in
silence. In the client's own way, a pool of threads, a burst of 1,000 CRs cost the operator a median
5.89 ms of CPU per CR in process and 7.32 ms on kube-apiserver; in the loop, 4.56 and 6.73 ms
(benchmarks/operator_scale.py, three runs each): no hop to a thread and back for each request, no
interpreter lock handed among 32 threads.

A request may carry a deadline (`Deadline`): the leader's Lease for a write (leader.py). It is asked
when the request has its connection, just before anything is sent, and bounds the whole request: no
write leaves after the deadline, and none is still in flight then.

Each event loop gets its own session per client (aiohttp's sessions belong to one loop). They are
closed when their loop shuts its asynchronous generators down, as `asyncio.run`, pytest-asyncio
and kopf do on the way out.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import select
import socket
import ssl
import time
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
import kubernetes
from kubernetes.client.rest import is_socks_proxy_url, should_bypass_proxies
from kubernetes.utils.keepalive import tcp_keepalive_socket_options
from multidict import CIMultiDict

# What a request raised when no answer came: refused, reset, timed out, TLS failed.
UNANSWERED = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
# When a request may still be sent and must be done by, in time.monotonic(); None: not at all.
Deadline = Callable[[], float | None]

# Every attribute of kubernetes.client.Configuration, and what becomes of it (tests/operator/test_transport.py
# lists the class's attributes against this table, so a new one in a new client release is decided on).
HONOURED, OFFICIAL, UNUSED, REFUSED = "honoured here", "the official client's", "unused by any request", "refused"
CONFIGURATION: dict[str, tuple[str, str]] = {
    "host": (OFFICIAL, "the URL"),
    "api_key": (OFFICIAL, "the Authorization header"),
    "api_key_prefix": (OFFICIAL, "the Authorization header"),
    "refresh_api_key_hook": (OFFICIAL, "the token refreshed before a request"),
    "safe_chars_for_path_param": (OFFICIAL, "the URL"),
    "server_index": (OFFICIAL, "the URL"),
    "server_variables": (OFFICIAL, "the URL"),
    "server_operation_index": (OFFICIAL, "the URL"),
    "server_operation_variables": (OFFICIAL, "the URL"),
    "ignore_operation_servers": (OFFICIAL, "the URL"),
    "verify_ssl": (HONOURED, "the server's certificate checked, or not"),
    "ssl_ca_cert": (HONOURED, "the CA file"),
    "ca_cert_data": (HONOURED, "the CA data"),
    "cert_file": (HONOURED, "the client certificate"),
    "key_file": (HONOURED, "the client certificate's key"),
    "assert_hostname": (HONOURED, "False: no hostname check; a name to check instead is refused"),
    "tls_server_name": (HONOURED, "the name sent and checked in TLS"),
    "connection_pool_maxsize": (HONOURED, "the connections kept, and the most requests in flight per loop"),
    "proxy": (HONOURED, "an HTTP proxy (from the environment unless set); a SOCKS one is refused"),
    "no_proxy": (HONOURED, "the hosts reached without the proxy"),
    "proxy_headers": (HONOURED, "headers sent to the proxy"),
    "proxy_ssl_context": (REFUSED, "TLS to the proxy is aiohttp's, from the same settings as the server's"),
    "socket_options": (HONOURED, "set on every connection's socket"),
    "keep_alive": (HONOURED, "client-go's TCP keepalive options, unless socket_options are set"),
    "retries": (REFUSED, "urllib3's Retry: a write goes once, on a connection checked alive as urllib3 checks it"),
    "client_go_retries": (REFUSED, "the operator's reconciles retry, after Retry-After"),
    "client_go_retry_backoff": (REFUSED, "the operator's reconciles retry, after Retry-After"),
    "username": (UNUSED, "the official client sends no basic auth to the Kubernetes API (BearerToken only)"),
    "password": (UNUSED, "the official client sends no basic auth to the Kubernetes API (BearerToken only)"),
    "access_token": (UNUSED, "not among the Kubernetes API's auth settings (api_key holds the token)"),
    "temp_folder_path": (UNUSED, "files downloaded into models; bodies here are JSON"),
    "client_side_validation": (UNUSED, "the generated models' checks; bodies here are dicts"),
    "datetime_format": (UNUSED, "the generated models' dates; bodies here are dicts"),
    "date_format": (UNUSED, "the generated models' dates; bodies here are dicts"),
    "logger": (UNUSED, "urllib3's and the client's loggers"),
    "logger_format": (UNUSED, "urllib3's and the client's loggers"),
    "logger_formatter": (UNUSED, "urllib3's and the client's loggers"),
    "logger_stream_handler": (UNUSED, "urllib3's and the client's loggers"),
    "logger_file_handler": (UNUSED, "urllib3's and the client's loggers"),
    "logger_file": (UNUSED, "urllib3's and the client's loggers"),
    "debug": (UNUSED, "urllib3's and the client's loggers"),
}
# The value each refused attribute has when it is not set.
_UNSET: dict[str, Any] = {
    "proxy_ssl_context": None,
    "retries": None,
    "client_go_retries": False,
    "client_go_retry_backoff": None,
}


class DeadlinePassed(Exception):
    """A request with a deadline that was not sent (its deadline had passed when it had a connection),
    or not answered before its deadline (it was cut off then)."""


class Answer:
    """An HTTP answer: its status, headers (case-insensitive, as HTTP has them) and body as text."""

    def __init__(self, status: int, headers: Mapping[str, str], text: str) -> None:
        self.status, self.headers, self.text = status, CIMultiDict(headers), text


def check_configuration(cfg: kubernetes.client.Configuration) -> None:
    """Refuse, naming it, a setting of the client that this transport does not carry out."""
    for name, unset in _UNSET.items():
        if getattr(cfg, name, unset) != unset:
            raise ValueError(
                f"Configuration.{name} is not supported by the operator's client: {CONFIGURATION[name][1]}"
            )
    if isinstance(cfg.assert_hostname, str):
        raise ValueError(
            "Configuration.assert_hostname as a name to check is not supported by the operator's client: set "
            "tls_server_name (a kubeconfig's clusters[].cluster.tls-server-name) instead"
        )
    proxy = cfg.proxy
    if proxy and is_socks_proxy_url(proxy):
        raise ValueError(f"a SOCKS proxy ({proxy}) is not supported: use an HTTP proxy")


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


def socket_factory(cfg: kubernetes.client.Configuration) -> Callable[[Any], socket.socket] | None:
    """Sockets with the configuration's socket options (or client-go's keepalive ones, with keep_alive),
    as the official client passes them to urllib3; None: aiohttp's own."""
    options = cfg.socket_options
    if options is None and getattr(cfg, "keep_alive", False):
        options = tcp_keepalive_socket_options()
    if options is None:
        return None

    def make(addr_info: Any) -> socket.socket:
        family, type_, proto, _, _ = addr_info
        sock = socket.socket(family=family, type=type_, proto=proto)
        for option in options:
            sock.setsockopt(*option)
        return sock

    return make


# The deadline of the request this task is sending, for the connector to ask once it has a connection.
_DEADLINE: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("deadline", default=None)


def _open(deadline: Deadline) -> float | None:
    """Seconds left before `deadline`, or None when it has passed or the request may not go at all."""
    until = deadline()
    return None if until is None or until <= time.monotonic() else until - time.monotonic()


def _dropped(connection: aiohttp.client_reqrep.Connection) -> bool:
    """urllib3's is_connection_dropped: an idle keep-alive connection with something to read has been
    closed by the server (or holds what no request asked for), though the loop may not have seen it yet."""
    transport = connection.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return transport is None
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


class _Connector(aiohttp.TCPConnector):
    """aiohttp's connector, with a pooled connection checked alive before it is used again (as urllib3
    checks it, so that a write is never sent into a connection the server closed) and the request's
    deadline asked once it has its connection."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._used: weakref.WeakSet[Any] = weakref.WeakSet()  # the protocols of connections used before

    async def connect(self, req: Any, traces: Any, timeout: Any) -> aiohttp.client_reqrep.Connection:
        while True:
            connection = await super().connect(req, traces, timeout)
            # Only a connection used before: a new one may already hold what TLS 1.3 sends after its handshake.
            if connection.protocol not in self._used or not _dropped(connection):
                break
            connection.close()
        self._used.add(connection.protocol)
        deadline = _DEADLINE.get()
        if deadline is not None and _open(deadline) is None:
            connection.release()  # unused, back to the pool
            raise DeadlinePassed(f"{req.method} {req.url.path}: its deadline passed before it was sent")
        return connection


class Transport:
    """One client's requests, `connection_pool_maxsize` at most in flight per event loop, each giving
    up after `timeout` (seconds to connect, then between reads, then in all)."""

    def __init__(self, cfg: kubernetes.client.Configuration, timeout: tuple[float, float, float]) -> None:
        check_configuration(cfg)
        self._cfg, self._in_flight = cfg, cfg.connection_pool_maxsize or 1
        self._total = timeout[2]
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout[0], sock_read=timeout[1])
        proxy = cfg.proxy if cfg.proxy and not should_bypass_proxies(cfg.host, cfg.no_proxy or "") else None
        # What every request passes besides its own method, URL, headers and body.
        self._extra: dict[str, Any] = {"proxy": proxy, "proxy_headers": cfg.proxy_headers} if proxy else {}
        if cfg.tls_server_name:
            self._extra["server_hostname"] = cfg.tls_server_name
        self._ssl: ssl.SSLContext | bool = ssl_context(cfg) if cfg.host.startswith("https") else False
        self._socket_factory = socket_factory(cfg)
        # A session per loop; a closed loop's entry keeps its closed session until a new one replaces it.
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}

    async def request(
        self, method: str, url: str, headers: Mapping[str, str], body: Any = None, deadline: Deadline | None = None
    ) -> Answer:
        """Send one request; raises one of UNANSWERED when no answer came, DeadlinePassed when `deadline`
        passed before it was sent or before its answer came."""
        # A body already encoded (server-side apply's YAML or JSON text) goes as it is, as the
        # official client sends it; any other is JSON.
        data = body if body is None or isinstance(body, str | bytes) else json.dumps(body)
        limit, cut = self._total, False
        if deadline is not None:
            left = _open(deadline)
            if left is None:
                raise DeadlinePassed(f"{method} {url}: its deadline had passed")
            # Cut off at the deadline known now: a renewal meanwhile does not lengthen a request under way.
            limit, cut = min(limit, left), left < limit
        session = await self._session()
        token = _DEADLINE.set(deadline)
        try:
            async with asyncio.timeout(limit):
                async with session.request(method, url, headers=headers, data=data, **self._extra) as response:
                    return Answer(response.status, response.headers, await response.text())
        except TimeoutError:
            if cut:
                raise DeadlinePassed(f"{method} {url}: not answered before its deadline") from None
            raise
        finally:
            _DEADLINE.reset(token)

    async def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            connector = _Connector(limit=self._in_flight, ssl=self._ssl, socket_factory=self._socket_factory)
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
