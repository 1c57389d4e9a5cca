"""The operator's requests carried by aiohttp in the event loop (transport.py): TLS as the
official client configures it, the answers' errors, and sessions closed with their loop.
Verified against kube-apiserver over TLS with a token by tests/control_plane."""

from __future__ import annotations

import asyncio
import gc
import ssl
import threading
import warnings

import kmock
import kubernetes
import pytest
from aiohttp import web

from gemma_devcluster.faults import FaultyApiServer
from gemma_operator import transport
from gemma_operator.kube import UNREACHABLE, ApiError, Kube, answer_error


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
        transport.Transport(_config("https://example:6443", proxy="socks5://proxy:1080"), 4, (1.0, 1.0))


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


async def test_a_body_already_encoded_goes_as_it_is_and_any_other_as_json():
    # kubernetes/client/rest.py sends a str or bytes body unchanged (server-side apply's YAML or
    # JSON text) and dumps any other as JSON.
    received: list[tuple[str, str]] = []

    async def echo(request: web.Request) -> web.Response:
        received.append((request.headers["Content-Type"], await request.text()))
        return web.json_response({})

    app = web.Application()
    app.router.add_route("PATCH", "/{tail:.*}", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        sender = transport.Transport(_config(f"http://127.0.0.1:{port}"), 2, (1.0, 5.0))
        yaml_type = {"Content-Type": "application/apply-patch+yaml"}
        await sender.request("PATCH", f"http://127.0.0.1:{port}/a", yaml_type, '{"kind": "X"}')
        merge_type = {"Content-Type": "application/merge-patch+json"}
        await sender.request("PATCH", f"http://127.0.0.1:{port}/b", merge_type, {"kind": "X"})
    finally:
        await runner.cleanup()
    assert received == [
        ("application/apply-patch+yaml", '{"kind": "X"}'),
        ("application/merge-patch+json", '{"kind": "X"}'),
    ]
