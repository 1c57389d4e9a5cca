"""A test's hands on a real control plane: read objects, and do the kubelet's part for the pods the
real controllers create (there is no kubelet: a pod's phase and container states are the test's to write,
through the status subresource, in the shape a kubelet writes them)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from gemma_operator import api
from gemma_operator.clock import now, timestamp
from tests.support.cluster import PATIENCE

NODE = "test-node"  # the node name written on pods the test runs (no Node object: nothing schedules here)


class RealCluster:
    """One namespace of a real API server, through an admin client."""

    def __init__(self, client: kubernetes.client.ApiClient, namespace: str) -> None:
        self.ns = namespace
        self.core = kubernetes.client.CoreV1Api(client)
        self.batch = kubernetes.client.BatchV1Api(client)
        self.apps = kubernetes.client.AppsV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.client = client

    # ---------------------------------------------------------------------------------------- reading

    def wait_for(self, what: Callable[[], Any], message: str, timeout: float = PATIENCE) -> Any:
        deadline, value = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            value = what()
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {message}: last value {value!r}")

    def cr(self, kind: str, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(
                api.GROUP, api.VERSION, self.ns, api.KINDS[kind].plural, name
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def apply_cr(self, obj: dict) -> dict:
        obj = {**obj, "metadata": {**obj["metadata"], "namespace": self.ns}}
        plural = api.KINDS[obj["kind"]].plural
        return self.custom.create_namespaced_custom_object(api.GROUP, api.VERSION, self.ns, plural, obj)

    def patch_cr(self, kind: str, name: str, patch: dict) -> dict:
        plural = api.KINDS[kind].plural
        return self.custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, self.ns, plural, name, patch)

    def phase(self, kind: str, name: str, phase: str, timeout: float = PATIENCE) -> dict:
        last: dict = {}

        def reached() -> dict | None:
            nonlocal last
            last = self.cr(kind, name) or {}
            return last if (last.get("status") or {}).get("phase") == phase else None

        try:
            return self.wait_for(reached, f"{kind} {name} phase {phase}", timeout)
        except AssertionError:
            raise AssertionError(f"{kind} {name} never reached {phase}: status {last.get('status')}") from None

    def job(self, name: str) -> Any:
        return self.wait_for(lambda: self._get(self.batch.read_namespaced_job, name), f"Job {name}")

    def _get(self, read: Callable[..., Any], name: str) -> Any:
        try:
            return read(name, self.ns)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def pods(self, selector: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.ns, label_selector=selector).items)

    def new_pod(self, selector: str, seen: set[str] | None = None) -> Any:
        """The next pod `selector` matches that is not in `seen` (the controllers name pods themselves)."""
        seen = seen or set()

        def fresh() -> Any:
            return next((p for p in self.pods(selector) if p.metadata.name not in seen), None)

        return self.wait_for(fresh, f"a new pod matching {selector}")

    def events(self, name: str) -> list[Any]:
        found = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={name}").items
        return list(found)

    # ---------------------------------------------------------------------------------------- the kubelet's part

    def _status(self, pod: Any, phase: str, state: dict, ready: bool, extra: list[dict] | None = None) -> Any:
        t = timestamp(now())
        containers = pod.spec.containers
        conditions = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": t},
            {"type": "Initialized", "status": "True", "lastTransitionTime": t},
            {"type": "ContainersReady", "status": str(ready), "lastTransitionTime": t},
            {"type": "Ready", "status": str(ready), "lastTransitionTime": t},
            *(extra or []),
        ]
        status = {
            "phase": phase,
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "startTime": t,
            "conditions": conditions,
            "containerStatuses": [
                {
                    "name": c.name,
                    "image": c.image,
                    "imageID": "",
                    "ready": ready,
                    "restartCount": 0,
                    "started": "running" in state,
                    "state": state,
                }
                for c in containers
            ],
        }
        return self.core.patch_namespaced_pod_status(pod.metadata.name, self.ns, {"status": status})

    def run(self, pod: Any, ready: bool = False) -> Any:
        return self._status(pod, "Running", {"running": {"startedAt": timestamp(now())}}, ready)

    def finish(self, pod: Any, exit_code: int, message: str | dict = "", disruption: str | None = None) -> Any:
        """The pod's containers ended with `exit_code` and termination `message` (a dict goes as JSON);
        `disruption` adds the DisruptionTarget condition a preemption or eviction sets, with that reason."""
        text = json.dumps(message) if isinstance(message, dict) else message
        t = timestamp(now())
        state = {
            "terminated": {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
                "message": text,
                "startedAt": t,
                "finishedAt": t,
            }
        }
        extra = [{"type": "DisruptionTarget", "status": "True", "reason": disruption}] if disruption else []
        return self._status(pod, "Succeeded" if exit_code == 0 else "Failed", state, False, extra)
