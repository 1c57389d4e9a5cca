"""The local node's kubelet endpoint, for what the API server asks of a node: pod logs (`kubectl logs`,
and the operator's live training progress).

kube-apiserver reads a container's log from `https://<node address>:<kubelet port>/containerLogs/
<namespace>/<pod>/<container>` with the query it was given (pkg/registry/core/pod/strategy.go,
LogLocation), the address and port being the Node's status.addresses and daemonEndpoints. It checks
the node's serving certificate only when started with --kubelet-certificate-authority
(pkg/kubelet/client/kubelet_client.go): this node serves a throwaway self-signed one, made with openssl.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from gemma_devcluster.kubelet import LocalPod, log_text
from gemma_devcluster.node_status import ADDRESS

ALL_LINES = 10**9
FOLLOW_POLL_SECONDS = 0.5


class NoCertificate(RuntimeError):
    """The node cannot make the certificate its kubelet endpoint serves."""


def self_signed(folder: Path, name: str) -> ssl.SSLContext:
    """A server context with a new self-signed certificate for 127.0.0.1, kept in `folder`."""
    if shutil.which("openssl") is None:
        raise NoCertificate(
            "the local node serves pod logs over HTTPS and makes its certificate with openssl: install it"
        )
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "kubelet.crt", folder / "kubelet.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", f"/CN={name}"]
        + ["-keyout", str(key), "-out", str(cert), "-addext", f"subjectAltName=IP:{ADDRESS}"],
        check=True,
        capture_output=True,
    )
    key.chmod(0o600)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


class KubeletApi:
    """The HTTPS endpoint; `find(namespace, name)` is the local pod of that name, if this node runs it."""

    def __init__(self, find: Callable[[str, str], LocalPod | None], folder: Path, name: str) -> None:
        self.find, self.folder, self.name = find, folder, name
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        """Serve on a free port of 127.0.0.1 and return it."""
        context = await asyncio.to_thread(self_signed, self.folder, self.name)
        app = web.Application()
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._logs)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind((ADDRESS, 0))  # a free port, known before serving
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock, ssl_context=context).start()
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        namespace, name, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
        local = self.find(namespace, name)
        if local is None or local.container["name"] != container:
            raise web.HTTPNotFound(text=f'container "{container}" in pod "{name}" is not on this node')
        if request.query.get("previous") == "true":
            raise web.HTTPBadRequest(text=f'previous terminated container "{container}" in pod "{name}" not found')
        tail = int(request.query.get("tailLines") or ALL_LINES)
        text = await asyncio.to_thread(log_text, local, tail)
        if request.query.get("follow") != "true":
            return web.Response(text=text, content_type="text/plain")
        return await self._follow(request, local, text)

    async def _follow(self, request: web.Request, local: LocalPod, text: str) -> web.StreamResponse:
        """The log so far, then each new line until the container has exited (`kubectl logs -f`)."""
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(text.encode())
        path = local.group.log_path
        offset = path.stat().st_size if path.exists() else 0
        while True:
            exited = local.exit_code() is not None
            data = path.read_bytes()[offset:] if path.exists() else b""
            complete = data[: data.rfind(b"\n") + 1] if not exited else data
            if complete:
                offset += len(complete)
                await response.write(local.mounts.untranslate(complete.decode(errors="replace")).encode())
            if exited:
                break
            await asyncio.sleep(FOLLOW_POLL_SECONDS)
        await response.write_eof()
        return response
