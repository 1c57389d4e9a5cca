"""Where `gemma-tpu dev` runs: the in-process API, or a real API server.

Either way the demo gets a cluster with the CRDs, the operator running and ready, the local node
agent registered as its node, and the workload ServiceAccounts the chart would create; it applies
the quickstart and follows it through the same client calls.

- In process (`make demo`): the project's own API (apiserver.py), the operator as tasks of this
  process, and the node agent also playing the Job and Deployment controllers.
- A real API server (`--kubeconfig FILE`, or `--real`, which starts the control plane of
  control_plane.py first): the CRDs and the chart's RBAC installed (install.py), the operator as its
  own process under its ServiceAccount's token (operator_process.py), watching the demo's namespaces,
  the real Job, ReplicaSet and Deployment controllers, and the agent as a tainted node that runs only
  the demo's pods (confinement.py). On `--real`'s own control plane the demo's namespaces enforce Pod
  Security's restricted level.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import kmock

from gemma_devcluster import confinement, control_plane, install, operator_process
from gemma_devcluster.agent import NODE_NAME, NodeAgent
from gemma_devcluster.apiserver import ApiServer, write_kubeconfig
from gemma_devcluster.client import NodeKube
from gemma_devcluster.kubelet import LocalPod, Node, log_text
from gemma_operator import runner
from gemma_operator.kube import ApiError
from gemma_operator.settings import OperatorSettings

DEMO_AGENT = "gemma-tpu-dev"  # the User-Agent of the demo's own requests


class BackendError(RuntimeError):
    """The cluster could not be set up; the message says what to do."""


@dataclass
class Cluster:
    """What the demo works with while it runs."""

    kube: NodeKube  # the demo's own client
    agent: NodeAgent
    url: str
    kubeconfig: Path  # for kubectl meanwhile
    apply: Callable[[dict], Awaitable[dict]]  # how the demo applies an object
    kind: str  # in words, for what it prints
    operator_log: Path | None = None

    def pod_log(self, prefix: str, lines: int = 25) -> tuple[str, str] | None:
        """(pod name, last log lines) of the newest local pod whose name starts with `prefix`."""
        found: list[LocalPod] = [p for p in self.agent.pods.values() if p.name.startswith(prefix)]
        if not found:
            return None
        pod = max(found, key=lambda p: p.started_at)
        return pod.name, "\n".join(log_text(pod).splitlines()[-lines:])


@contextlib.asynccontextmanager
async def _running(agent: NodeAgent) -> AsyncIterator[NodeAgent]:
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        yield agent
    finally:
        stop.set()
        await task


@contextlib.asynccontextmanager
async def in_process(
    workdir: Path, port: int, settings: OperatorSettings, node: Node, docs: list[dict]
) -> AsyncIterator[Cluster]:
    async with ApiServer() as apiserver, kmock.Server(apiserver, port=port or None) as server:
        apiserver.register_defaults()
        url = str(server.url).rstrip("/")
        op_stop, ready = asyncio.Event(), asyncio.Event()
        _, op_tasks = await runner.spawn(url, settings, op_stop, ready)
        kube = NodeKube.local(url, user_agent=DEMO_AGENT)
        agent_ = NodeAgent(
            NodeKube.local(url), apiserver, node, 0.25, namespaces=install.namespaces(docs), taint=confinement.TAINT
        )
        try:
            async with _running(agent_) as agent:
                await asyncio.wait_for(ready.wait(), 30)
                for account in install.workload_accounts(docs, settings):
                    await kube.create(account)
                config = write_kubeconfig(workdir / "kubeconfig", url)
                yield Cluster(kube, agent, url, config, kube.create, f"the local cluster at {url}")
        finally:
            await runner.stop(op_tasks, op_stop)


@contextlib.asynccontextmanager
async def on_server(
    kubeconfig: Path,
    workdir: Path,
    settings: OperatorSettings,
    node: Node,
    docs: list[dict],
    *,
    shared: bool = False,
    restricted: bool = False,
) -> AsyncIterator[Cluster]:
    """The demo on the API server `kubeconfig` names, whose credentials may install CRDs and RBAC: refused
    where the cluster has schedulable Nodes of its own unless `shared` (confinement.py); with `restricted`,
    the demo's namespaces enforce Pod Security's restricted level first."""
    kube = NodeKube.from_kubeconfig(kubeconfig, user_agent=DEMO_AGENT)
    url, namespaces = kube.host, install.namespaces(docs)
    try:
        await kube.get_path("/version")
        others = confinement.other_nodes(await kube.list("Node", None), NODE_NAME)
    except ApiError as e:
        raise BackendError(f"cannot reach the API server of {kubeconfig} ({url}): {e}") from None
    if others and not shared:
        raise BackendError(confinement.shared_cluster_message(str(kubeconfig), others, namespaces, NODE_NAME))
    if restricted:
        await install.enforce_restricted(kube, namespaces)
    await install.crds(kube)
    await install.operator_identity(kube, docs, settings)
    token_config = await install.operator_kubeconfig(kube, kubeconfig, workdir / "operator.kubeconfig")
    # Before the node runs anything: an earlier run's server must not get a new pod meanwhile.
    removed = await install.delete_earlier(kube, docs)
    agent_ = NodeAgent(
        NodeKube.from_kubeconfig(kubeconfig), None, node, 0.25, namespaces=namespaces, taint=confinement.TAINT
    )
    async with _running(agent_) as agent:
        if removed:
            print(f"deleting what an earlier run left: {', '.join(removed)}", flush=True)
            await install.wait_children_gone(kube, docs)
        operator = await operator_process.start(token_config, settings, workdir, namespaces=namespaces)
        try:
            yield Cluster(kube, agent, url, kubeconfig, kube.apply, f"the API server at {url}", operator.log_path)
        finally:
            await asyncio.to_thread(operator.stop)


@contextlib.asynccontextmanager
async def started_control_plane(state: Path) -> AsyncIterator[control_plane.ControlPlane]:
    """A control plane of its own (`--real`), in a fresh state folder, stopped at the end."""
    try:
        control_plane.scripts_dir()
    except control_plane.ControlPlaneMissing as e:
        raise BackendError(str(e)) from None
    started = time.monotonic()
    plane = await asyncio.to_thread(control_plane.start, state)
    print(
        f"started kube-apiserver and kube-controller-manager at {plane.url} in {time.monotonic() - started:.1f} s "
        f"(logs in {state})",
        flush=True,
    )
    try:
        yield plane
    finally:
        await asyncio.to_thread(control_plane.stop, plane)
