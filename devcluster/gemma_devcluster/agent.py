"""The local node agent: one node of the API server it is given, with that node's scheduler and kubelet.

- The node: it registers a Node (this machine's CPUs, memory and disk, no TPU), renews its Lease in
  kube-node-lease as the kubelet does, and marks itself gone when it stops.
- The scheduler: it binds the pending pods it can run through their `pods/binding` subresource (there
  is no other scheduler), and leaves the others Pending with the reason kube-scheduler gives
  (scheduling.py: a pod asking for TPUs, or for a TPU node pool).
- The kubelet: it runs each pod bound to it as local processes (kubelet.py), probes it, restarts it in
  place where its restartPolicy says so, writes its status as the kubelet does, and finalises its
  deletion: the containers stopped within the grace period, the last status written, then the pod
  deleted with grace period 0.

On the in-process API (`apiserver` given) it also plays the Job and Deployment controllers
(controllers.py) and hands the pods' logs to that API. On a real API server the real controllers run,
and the API server reads pod logs from the node's kubelet endpoint (kubelet_api.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from gemma_devcluster import confinement, node_status, scheduling, services
from gemma_devcluster.client import NodeKube
from gemma_devcluster.controllers import Controllers
from gemma_devcluster.kubelet import LocalPod, Node, PodStartError, addresses, log_text, waiting_status
from gemma_devcluster.kubelet_api import KubeletApi
from gemma_operator.clock import now, timestamp
from gemma_operator.kube import ApiError

log = logging.getLogger("gemma_devcluster")

NODE_NAME = "gemma-local-node"
# The kubelet's words for a container it has no trace of (pkg/kubelet/kubelet_pods.go): here, a pod an
# earlier run of the agent started.
LOST = {
    "exitCode": 137,
    "reason": "ContainerStatusUnknown",
    "message": "The container could not be located when the pod was terminated",
}


class NodeAgent:
    def __init__(
        self,
        kube: NodeKube,
        apiserver: Any | None,
        node: Node,
        interval: float = 0.2,
        *,
        name: str = NODE_NAME,
        namespaces: list[str] | None = None,
        taint: dict[str, str] | None = None,
    ) -> None:
        """`apiserver`: the in-process API this agent runs against, or None for a real API server.
        `namespaces`: schedule only the pods of these (every namespace when None). `taint`: the Node's,
        and the agent touches only the pods that tolerate it (confinement.py)."""
        self.kube, self.apiserver, self.node, self.interval = kube, apiserver, node, interval
        self.name, self.namespaces, self.taint = name, namespaces, taint
        self.controllers = Controllers(kube) if apiserver is not None else None
        self.pods: dict[str, LocalPod] = {}  # by pod uid: the pods whose containers this node runs
        self._settled: set[str] = set()  # uids of pods this node has started or found lost: never again
        self._fixed: dict[str, dict] = {}  # by uid: the status of a pod this node cannot run, until written
        self._terminating: dict[str, asyncio.Task] = {}  # uids of pods being finalised
        self._last_status: dict[str, str] = {}
        self._machine = node_status.machine(node.workdir)
        self._node: dict[str, Any] = {}  # the Node as registered
        self._kubelet_api: KubeletApi | None = None
        self._port = 0  # of the kubelet endpoint
        self._renewed = self._reported = 0.0
        self.registered = asyncio.Event()  # set once the Node, its status and its Lease are written

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self.register()
            while not stop.is_set():
                try:
                    await self.step()
                except ApiError as e:
                    log.warning("node agent: %s", e)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval)
        finally:
            await self.shutdown()

    async def shutdown(self) -> None:
        """Stop every process this node started (SIGTERM, then SIGKILL after a short grace), then say
        the node is gone, as the node lifecycle controller would once its Lease expired."""
        pods, self.pods = list(self.pods.values()), {}
        await asyncio.gather(*(asyncio.to_thread(p.stop, 5) for p in pods))
        if self._kubelet_api is not None:
            await self._kubelet_api.stop()
        if self._node:
            with contextlib.suppress(ApiError):
                await self._write_node_status(node_status.gone_conditions())

    def local_pod(self, namespace: str, name: str) -> LocalPod | None:
        """The pod of that name this node runs, if any (the kubelet endpoint's lookup)."""
        return next((p for p in self.pods.values() if (p.namespace, p.name) == (namespace, name)), None)

    # ------------------------------------------------------------------ the node

    async def register(self) -> None:
        """Register the Node (or take over the one of that name), its status, its Lease."""
        if self.apiserver is None and self._kubelet_api is None:  # a real API server reads pod logs from the node
            self._kubelet_api = KubeletApi(self.local_pod, self.node.workdir / "kubelet", self.name)
            self._port = await self._kubelet_api.start()
        wanted = node_status.node_object(self.name, self._machine)
        if self.taint:
            wanted["spec"]["taints"] = [dict(self.taint)]
        try:
            self._node = await self.kube.create(wanted)
        except ApiError as e:
            if e.status != 409:
                raise
            taken = {"metadata": wanted["metadata"], "spec": wanted["spec"]}
            self._node = await self.kube.patch_cluster_scoped("Node", self.name, taken)
        await self._write_node_status()
        taints = (self._node.get("spec") or {}).get("taints") or []
        if any(t["key"] == node_status.NOT_READY_TAINT for t in taints):  # the node is Ready now
            kept = [t for t in taints if t["key"] != node_status.NOT_READY_TAINT]
            self._node = await self.kube.patch_cluster_scoped("Node", self.name, {"spec": {"taints": kept or None}})
        await self._renew_lease()
        self.registered.set()

    async def _write_node_status(self, conditions: dict | None = None) -> None:
        status = node_status.node_status(self._machine, self._port, now(), conditions)
        self._node = await self.kube.patch_status("Node", None, self.name, status)
        self._reported = time.monotonic()

    async def _renew_lease(self) -> None:
        lease = node_status.lease(self.name, self._node["metadata"]["uid"], now())
        try:
            await self.kube.create(lease)
        except ApiError as e:
            if e.status != 409:
                raise
            await self.kube.patch("Lease", node_status.LEASE_NAMESPACE, self.name, {"spec": lease["spec"]})
        self._renewed = time.monotonic()

    async def _heartbeat(self) -> None:
        if time.monotonic() - self._renewed >= node_status.RENEW_SECONDS:
            await self._renew_lease()
        if time.monotonic() - self._reported >= node_status.REPORT_SECONDS:
            await self._write_node_status()

    # ------------------------------------------------------------------ one pass

    async def step(self) -> None:
        pods = [p for p in await self._pods() if confinement.ours(p, self.namespaces, self.taint)]
        for pod in pods:
            if scheduling.schedules(pod):
                await self._schedule(pod)
        await self._kubelet([p for p in pods if p["spec"].get("nodeName") == self.name])
        if self.controllers is not None:
            await self.controllers.step(pods)
        await self._heartbeat()

    async def _pods(self) -> list[dict]:
        if self.namespaces is None:
            return await self.kube.list("Pod", None)
        return [p for ns in self.namespaces for p in await self.kube.list("Pod", ns)]

    # ------------------------------------------------------------------ scheduler

    async def _schedule(self, pod: dict) -> None:
        uid = pod["metadata"]["uid"]
        why = scheduling.fit_error(pod, self._node)
        if why is None:
            try:
                await self.kube.bind(pod, self.name)
            except ApiError as e:
                if e.status not in (404, 409):  # deleted meanwhile, or bound by someone else
                    raise
        else:
            condition = scheduling.unschedulable_condition(why, timestamp(now()))
            old = self._fixed.get(uid, {}).get("conditions", [{}])[0]
            if old.get("message") != why:  # the reason changed (or was never written): now
                self._fixed[uid] = {"conditions": [condition]}
            await self._set_status(pod, self._fixed[uid])

    # ------------------------------------------------------------------ kubelet

    async def _kubelet(self, pods: list[dict]) -> None:
        present = {p["metadata"]["uid"] for p in pods}
        for uid in [u for u in self.pods if u not in present and u not in self._terminating]:
            local = self.pods.pop(uid)  # deleted at once (no grace): stop within the pod's own
            asyncio.create_task(asyncio.to_thread(local.stop, local.grace))
        for pod in pods:
            meta = pod["metadata"]
            uid, phase = meta["uid"], (pod.get("status") or {}).get("phase")
            if meta.get("deletionTimestamp"):
                self._terminate(pod)
            elif uid in self.pods:
                await self._tend(pod, self.pods[uid])
            elif uid in self._fixed:  # rewritten until written (a 409 answer leaves it for later)
                await self._set_status(pod, self._fixed[uid])
            elif uid not in self._settled and phase in (None, "Pending"):
                self._settled.add(uid)
                await self._start(pod)
            elif uid not in self._settled and phase == "Running":
                self._settled.add(uid)
                await self._lost(pod)

    async def _start(self, pod: dict) -> None:
        meta = pod["metadata"]
        container = pod["spec"]["containers"][0]
        config_maps, secrets_ = await self._config(pod)
        routes = services.routes(
            await self.kube.list("Service", meta["namespace"]), await self.kube.list("Pod", meta["namespace"])
        )
        try:
            local = await asyncio.to_thread(LocalPod.start, pod, self.node, config_maps, secrets_, routes)
        except PodStartError as e:
            self._fixed[meta["uid"]] = waiting_status(container, e.reason, str(e))
            await self._set_status(pod, self._fixed[meta["uid"]])
            return
        self.pods[meta["uid"]] = local
        if local.host_port:
            annotations = {"gemma-tpu.dev/host-port": str(local.host_port)}
            pod = await self.kube.patch(
                "Pod", meta["namespace"], meta["name"], {"metadata": {"annotations": annotations}}
            )
        await self._set_status(pod, local.status())

    async def _tend(self, pod: dict, local: LocalPod) -> None:
        """Probes, restarts in place, logs and status of a pod this node runs."""
        if self.apiserver is not None:
            self.apiserver.pod_logs[(local.namespace, local.name)] = log_text(local)
        code = local.exit_code()
        if code is None and not local.ready:
            local.ready = bool(await asyncio.to_thread(local.probe, "readinessProbe"))
        if code is not None and pod["spec"].get("restartPolicy", "Always") == "Always":
            # The container restarts in place, after a growing back-off (CrashLoopBackOff).
            if local.restart_at is None:
                local.status()  # fix the terminated state the back-off reports as lastState
                local.restart_at = time.monotonic() + min(300, 10 * 2**local.restarts)
            elif time.monotonic() >= local.restart_at:
                restarted = await asyncio.to_thread(local.restarted, pod, self.node, *await self._config(pod))
                self.pods[local.uid] = local = restarted
        await self._set_status(pod, local.status())

    async def _lost(self, pod: dict) -> None:
        """A running pod of this node that this agent never started: its container is gone, the pod failed."""
        container = pod["spec"]["containers"][0]
        t = timestamp(now())
        terminated = {**LOST, "startedAt": t, "finishedAt": t}
        status = {
            "phase": "Failed",
            **addresses((pod.get("status") or {}).get("startTime") or t),
            "containerStatuses": [
                {
                    "name": container["name"],
                    "ready": False,
                    "started": False,
                    "restartCount": 0,
                    "state": {"terminated": terminated},
                    "image": container["image"],
                    "imageID": "",
                }
            ],
        }
        self._fixed[pod["metadata"]["uid"]] = status
        await self._set_status(pod, status)

    def _terminate(self, pod: dict) -> None:
        uid = pod["metadata"]["uid"]
        if uid not in self._terminating:
            self._terminating[uid] = asyncio.create_task(self._finalise(pod, self.pods.get(uid)))

    async def _finalise(self, pod: dict, local: LocalPod | None) -> None:
        """A pod being deleted: its containers stopped within the grace period, its last status
        written (a terminal phase, which the Job controller waits for), then the pod deleted for good."""
        meta = pod["metadata"]
        try:
            if local is not None:
                grace = float(meta.get("deletionGracePeriodSeconds", local.grace))
                await asyncio.to_thread(local.stop, grace)
                local.restart_at = None
                status = local.status()
                if status["phase"] == "Running":  # stopped before the back-off ended: it failed
                    status["phase"] = "Failed"
                fresh = await self.kube.get("Pod", meta["namespace"], meta["name"])
                if fresh is not None and fresh["metadata"]["uid"] == meta["uid"]:
                    await self._set_status(fresh, status)
            await self.kube.delete_now(pod)
        except ApiError as e:
            log.warning("node agent: finalising pod %s/%s: %s", meta["namespace"], meta["name"], e)
            self._terminating.pop(meta["uid"], None)  # tried again at the next pass
        finally:
            self.pods.pop(meta["uid"], None)

    async def _config(self, pod: dict) -> tuple[dict, dict]:
        ns = pod["metadata"]["namespace"]
        return (
            {c["metadata"]["name"]: c for c in await self.kube.list("ConfigMap", ns)},
            {s["metadata"]["name"]: s for s in await self.kube.list("Secret", ns)},
        )

    async def _set_status(self, pod: dict, status: dict) -> None:
        """Write the pod's status where it changed, keeping the conditions others own (PodScheduled,
        DisruptionTarget). The write names the resourceVersion read: a pod changed meanwhile answers
        409 and is written at the next pass, from what it is then."""
        meta = pod["metadata"]
        mine = {c["type"] for c in status.get("conditions") or []}
        others = [c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] not in mine]
        status = {**status, "conditions": [*(status.get("conditions") or []), *others]}
        text = json.dumps(status, sort_keys=True)
        if self._last_status.get(meta["uid"]) == text:
            return
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status}
        try:
            await self.kube.patch("Pod", meta["namespace"], meta["name"], patch, status=True)
        except ApiError as e:
            if e.status not in (404, 409):
                raise
            return
        self._last_status[meta["uid"]] = text
