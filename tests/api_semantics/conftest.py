"""One suite, two API servers: the in-process one (kmock and gemma_devcluster.apiserver, what the fast
tests and `make demo` run on) and a real kube-apiserver 1.36. Each test here runs on both; where the
in-process one cannot do as the real one does, the test says so and why."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import kmock
import kubernetes
import pytest
import pytest_asyncio

from gemma_devcluster.apiserver import ApiServer

IN_PROCESS, REAL = "in-process", "real"


@dataclass
class Backend:
    name: str
    client: kubernetes.client.ApiClient
    new_namespace: Callable[[str], str]
    restart_watch_cache: Callable[[], Awaitable[None]]
    created: list[str] = field(default_factory=list)

    def namespace(self, prefix: str = "t") -> str:
        """A namespace of its own for this test (with its `default` ServiceAccount)."""
        name = self.new_namespace(f"{prefix}-{uuid.uuid4().hex[:8]}")
        self.created.append(name)
        return name


def _in_process_client(url: str) -> kubernetes.client.ApiClient:
    cfg = kubernetes.client.Configuration()
    cfg.host = url.rstrip("/")
    return kubernetes.client.ApiClient(cfg)


@pytest_asyncio.fixture(params=[IN_PROCESS, pytest.param(REAL, marks=pytest.mark.control_plane)])
async def backend(request):
    if request.param == REAL:
        plane = request.getfixturevalue("control_plane")

        async def restart() -> None:  # the server process goes, and comes back with empty watch caches
            await asyncio.to_thread(lambda: plane.start_apiserver(plane.kill_apiserver()))

        with plane.client() as client:
            b = Backend(REAL, client, lambda name: plane.create_namespace(name) or name, restart)
            yield b
        for name in b.created:
            plane.kubectl("delete", "namespace", name, "--wait=false", check=False)
        return
    async with ApiServer() as api, kmock.Server(api):
        api.register_defaults()

        async def forget() -> None:
            api.restart_watch_cache()

        yield Backend(IN_PROCESS, _in_process_client(str(api.url)), lambda name: name, forget)
