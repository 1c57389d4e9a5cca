"""The operator's requests carried by aiohttp in the event loop (transport.py): TLS as the
official client configures it, the answers' errors, and sessions closed with their loop.
Verified against kube-apiserver over TLS with a token by tests/control_plane."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import re
import socket
import ssl
import threading
import time
import warnings
from collections.abc import AsyncIterator

import kmock
import kubernetes
import pytest
from aiohttp import web
from kubernetes.utils.keepalive import tcp_keepalive_socket_options

from gemma_devcluster.faults import FaultyApiServer
from gemma_operator import transport
from gemma_operator.kube import UNREACHABLE, ApiError, Kube, answer_error

TIMEOUT = (1.0, 5.0, 10.0)


def _config(host: str, **fields: object) -> kubernetes.client.Configuration:
    cfg = kubernetes.client.Configuration()
    cfg.host = host
    for name, value in fields.items():
        setattr(cfg, name, value)
    return cfg


def test_tls_verifies_the_server_unless_the_configuration_says_not_to():
    # kubernetes/client/rest.py: verify_ssl -> CERT_REQUIRED or CERT_NONE; assert_hostname False
    # turns off the hostname check alone.
    verified = transport.ssl_context(_config("https://example:6443"))
    assert verified.verify_mode == ssl.CERT_REQUIRED and verified.check_hostname
    insecure = transport.ssl_context(_config("https://example:6443", verify_ssl=False))
    assert insecure.verify_mode == ssl.CERT_NONE and not insecure.check_hostname
    no_hostname = transport.ssl_context(_config("https://example:6443", assert_hostname=False))
    assert no_hostname.verify_mode == ssl.CERT_REQUIRED and not no_hostname.check_hostname


def test_a_socks_proxy_is_refused_by_name():
    with pytest.raises(ValueError, match="SOCKS proxy"):
        transport.Transport(_config("https://example:6443", proxy="socks5://proxy:1080"), TIMEOUT)


def test_an_error_answer_keeps_the_status_reason_message_and_retry_after():
    body = '{"kind": "Status", "reason": "TooManyRequests", "message": "slow down", "code": 429}'
    e = answer_error(429, body, {"Retry-After": "3"}, "POST /x")
    assert (e.status, e.reason, e.message, e.retry_after, e.transient) == (
        429,
        "TooManyRequests",
        "slow down",
        3.0,
        True,
    )
    plain = answer_error(502, "<html>bad gateway</html>", {}, "GET /y")
    assert (plain.status, plain.message, plain.retry_after) == (502, "<html>bad gateway</html>", None)


async def _served_kube() -> tuple[Kube, int, ApiError]:
    """Reads through one Kube from this loop and from a second loop in a thread, then one after
    the server is gone."""
    async with FaultyApiServer() as api, kmock.Server(api):
        api.register_defaults()
        kube = Kube.from_url(str(api.url))
        await kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "ns"}})
        seen: list[int] = []
        thread = threading.Thread(target=lambda: seen.append(len(asyncio.run(kube.list("ConfigMap", "ns")))))
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.02)
        seen.append(len(await kube.list("ConfigMap", "ns")))
    try:
        await kube.list("ConfigMap", "ns")
    except ApiError as e:
        return kube, sum(seen), e
    raise AssertionError("a request to a stopped server answered")


def test_each_loop_has_its_session_closed_when_the_loop_ends():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kube, found, unreachable = asyncio.run(_served_kube())
        gc.collect()
    assert found == 2  # the ConfigMap, read from both loops
    assert unreachable.status == UNREACHABLE and "ClientConnectorError" in unreachable.message
    sessions = list(kube._transport._sessions.values())
    assert len(sessions) == 2 and all(s.closed for s in sessions)  # one per loop, each closed with it
    assert not any(s in held for held in transport._SESSIONS.values() for s in sessions)
    assert not [w for w in caught if "Unclosed" in str(w.message)]


@contextlib.asynccontextmanager
async def served(route) -> AsyncIterator[str]:
    """An HTTP server in this loop answering every method and path with `route`; its URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", route)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    finally:
        await runner.cleanup()


async def test_a_body_already_encoded_goes_as_it_is_and_any_other_as_json():
    # kubernetes/client/rest.py sends a str or bytes body unchanged (server-side apply's YAML or
    # JSON text) and dumps any other as JSON.
    received: list[tuple[str, str]] = []

    async def echo(request: web.Request) -> web.Response:
        received.append((request.headers["Content-Type"], await request.text()))
        return web.json_response({})

    async with served(echo) as url:
        sender = transport.Transport(_config(url), TIMEOUT)
        yaml_type = {"Content-Type": "application/apply-patch+yaml"}
        await sender.request("PATCH", f"{url}/a", yaml_type, '{"kind": "X"}')
        merge_type = {"Content-Type": "application/merge-patch+json"}
        await sender.request("PATCH", f"{url}/b", merge_type, {"kind": "X"})
    assert received == [
        ("application/apply-patch+yaml", '{"kind": "X"}'),
        ("application/merge-patch+json", '{"kind": "X"}'),
    ]


# ---------------------------------------------------------------------------------------- the configuration


def configuration_attributes() -> set[str]:
    """Every attribute a kubernetes.client.Configuration has, its properties under their own names."""
    cfg = kubernetes.client.Configuration()
    names = {n for n in vars(cfg) if not n.startswith("_")}
    properties = {n for n, v in vars(kubernetes.client.Configuration).items() if isinstance(v, property)}
    return names | {p for p in properties if not p.startswith("_")}


def test_every_configuration_attribute_is_honoured_or_refused():
    """A new client release's new attribute fails here until the transport decides on it."""
    assert configuration_attributes() == set(transport.CONFIGURATION)
    for name, (how, _) in transport.CONFIGURATION.items():
        if how == transport.REFUSED:
            cfg = _config("https://example:6443", **{name: 3})
            with pytest.raises(ValueError, match=f"Configuration.{name} is not supported"):
                transport.Transport(cfg, TIMEOUT)
    with pytest.raises(ValueError, match="assert_hostname as a name"):
        transport.Transport(_config("https://example:6443", assert_hostname="apiserver"), TIMEOUT)


def test_socket_options_and_keep_alive_are_set_on_every_socket():
    # kubernetes/client/rest.py hands socket_options (or, with keep_alive, client-go's keepalive
    # options) to urllib3, which sets them on each new socket.
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1), (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 77)]
    addr = (socket.AF_INET, socket.SOCK_STREAM, 0, "", ("127.0.0.1", 0))
    with transport.socket_factory(_config("http://x", socket_options=options))(addr) as sock:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 77
    with transport.socket_factory(_config("http://x", keep_alive=True))(addr) as sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)) in (
            tcp_keepalive_socket_options()
        )
    assert transport.socket_factory(_config("http://x")) is None


async def test_connection_pool_maxsize_bounds_the_requests_in_flight():
    at_once, most = 0, 0

    async def slow(request: web.Request) -> web.Response:
        nonlocal at_once, most
        at_once += 1
        most = max(most, at_once)
        await asyncio.sleep(0.1)
        at_once -= 1
        return web.json_response({})

    async with served(slow) as url:
        sender = transport.Transport(_config(url, connection_pool_maxsize=2), TIMEOUT)
        await asyncio.gather(*(sender.request("GET", f"{url}/{i}", {}) for i in range(5)))
    assert most == 2


async def test_headers_are_read_whatever_their_case():
    # A proxy may lower-case header names (HTTP/2 always does): Retry-After is found all the same.
    async def throttled(request: web.Request) -> web.Response:
        return web.Response(status=429, text="{}", headers={"retry-after": "7"})

    async with served(throttled) as url:
        answer = await transport.Transport(_config(url), TIMEOUT).request("GET", f"{url}/x", {})
    assert answer.headers["Retry-After"] == "7"
    assert answer_error(answer.status, answer.text, answer.headers).retry_after == 7.0


# ---------------------------------------------------------------------------------------- deadlines


async def test_a_write_is_not_sent_once_its_deadline_passed_while_it_waited_for_a_connection():
    """The deadline is asked when the request has its connection: one that passed while the request
    waited behind a full pool stops it there, and the server never sees it."""
    seen: list[str] = []

    async def slow(request: web.Request) -> web.Response:
        seen.append(request.path)
        await asyncio.sleep(0.5)
        return web.json_response({})

    async with served(slow) as url:
        sender = transport.Transport(_config(url, connection_pool_maxsize=1), TIMEOUT)
        holding = asyncio.create_task(sender.request("GET", f"{url}/holding", {}))
        await asyncio.sleep(0.1)  # the one connection is taken
        until = time.monotonic() + 0.2
        with pytest.raises(transport.DeadlinePassed):
            await sender.request("POST", f"{url}/write", {}, {}, deadline=lambda: until)
        await holding
        with pytest.raises(transport.DeadlinePassed):  # and one whose deadline passed goes nowhere
            await sender.request("POST", f"{url}/late", {}, {}, deadline=lambda: until)
        with pytest.raises(transport.DeadlinePassed):  # nor one of a replica that does not lead
            await sender.request("POST", f"{url}/none", {}, {}, deadline=lambda: None)
    assert seen == ["/holding"]


async def test_a_write_is_cut_off_at_its_deadline():
    """A write still unanswered at its deadline is given up then (its answer would have come later)."""
    answered = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(1)
        answered.set()
        return web.json_response({})

    async with served(slow) as url:
        sender = transport.Transport(_config(url), TIMEOUT)
        until = time.monotonic() + 0.3
        with pytest.raises(transport.DeadlinePassed):
            await sender.request("POST", f"{url}/write", {}, {}, deadline=lambda: until)
        assert not answered.is_set(), "given up before the server answered"


# ---------------------------------------------------------------------------------------- dropped connections


class ClosingServer:
    """A server in a thread of its own that answers each request with a keep-alive response, then
    closes the connection: the client's pooled connection is dead before it is used again."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.requests: list[str] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                with conn:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(65536)
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1]) if b"ength" in head else 0
                    while len(body) < length:
                        body += conn.recv(65536)
                    self.requests.append(head.split(b"\r\n")[0].decode())
                    conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n{}")

    def close(self) -> None:
        self.listener.close()


async def test_a_write_after_the_server_closed_its_keep_alive_connection_goes_on_a_new_one():
    """urllib3 checks a pooled connection before it sends on it (is_connection_dropped) and opens another
    when the server closed it: so does the transport, even when its loop was too busy to see the close."""
    server = ClosingServer()
    try:
        official = kubernetes.client.ApiClient(_config(server.url))
        for name in ("a", "b"):
            official.call_api("POST", f"{server.url}/urllib3/{name}", {"Content-Type": "application/json"}, "{}")
            time.sleep(0.2)  # the server closes the connection meanwhile
        sender = transport.Transport(_config(server.url), TIMEOUT)
        answers = []
        for name in ("a", "b"):
            answers.append(await sender.request("POST", f"{server.url}/aiohttp/{name}", {}, {}))
            time.sleep(0.2)  # the loop is busy (blocked): it has not seen the close when the next write goes
    finally:
        server.close()
    assert [a.status for a in answers] == [201, 201]
    assert server.requests == [f"POST /{who}/{n} HTTP/1.1" for who in ("urllib3", "aiohttp") for n in ("a", "b")]
