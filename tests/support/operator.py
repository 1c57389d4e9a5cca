"""A fresh in-process API server and operator, for tests that run several scenarios in turn."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Collection

import kmock

from gemma_devcluster.apiserver import ApiServer, Call
from gemma_operator import runner
from gemma_operator.kube import USER_AGENT
from gemma_operator.settings import OperatorSettings


@contextlib.asynccontextmanager
async def api_server() -> AsyncIterator[ApiServer]:
    async with ApiServer() as api, kmock.Server(api):
        api.register_defaults()
        yield api


@contextlib.asynccontextmanager
async def operator(api: ApiServer, namespaces: Collection[str] = ()) -> AsyncIterator[object]:
    """The real kopf operator in this event loop, watching every namespace or only these."""
    stop, ready = asyncio.Event(), asyncio.Event()
    settings = OperatorSettings(progress_poll_seconds=0.3)
    controller, tasks = await runner.spawn(str(api.url), settings, stop, ready, namespaces)
    await asyncio.wait_for(ready.wait(), 15)
    try:
        yield controller
    finally:
        await runner.stop(tasks, stop)


def operator_calls(api: ApiServer) -> collections.Counter[Call]:
    """The requests of the operator's own client and of kopf's, not those of the tests."""
    out: collections.Counter[Call] = collections.Counter()
    for agent, calls in api.calls_by_agent.items():
        if agent.startswith((USER_AGENT, "kopf/")):
            out.update(calls)
    return out


async def settled(cluster, controller, kind: str, namespace: str, name: str, timeout: float = 15) -> None:
    """Return once the operator has completed a reconcile that read the CR after this call began:
    the way to say "and nothing more happens" without a sleep a loaded machine may cut short.
    The CR is touched (an annotation no one reads), so a finished one is reconciled too."""
    touched = await cluster.kube.patch(kind, namespace, name, {"metadata": {"annotations": {"tests/touched": "x"}}})
    version = int(touched["metadata"]["resourceVersion"])
    key = (kind, namespace, name)

    async def acted() -> bool:
        return int(controller.reconciled.get(key) or 0) >= version

    await cluster.wait_for(acted, timeout, f"a reconcile of {kind} {namespace}/{name} at resourceVersion {version}")
