"""Playing the cluster's controllers in tests: Jobs start, pods finish, Deployments get ready.

There is no Job controller or kubelet here, so tests move children through their lifecycle
with the same API calls those controllers make (status subresource patches, pod objects).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gemma_operator.clock import now, timestamp
from gemma_operator.kube import Kube

# How long a test waits for something that must happen. Generous on purpose: a wait that passes
# returns as soon as its condition holds, and one that only proves "eventually" must not fail
# because the machine was busy (CI has two cores; the operator, the API server and the test
# share them). Bounds that are part of the behaviour (a Lease's duration, say) are asserted
# separately, with the bound they come from.
PATIENCE = 60.0

TEST_AGENT = "gemma-tpu-tests"  # the API server records calls per User-Agent: these are the test's


async def wait_for(what: Callable[[], Awaitable[Any]], timeout: float = PATIENCE, message: str = "") -> Any:
    """Poll until `what()` returns something truthy; fail with its last value."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = await what()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {message or what}: last value {value!r}")


class Cluster:
    def __init__(self, apiserver) -> None:
        self.api = apiserver
        self.kube = Kube.from_url(str(apiserver.url), user_agent=TEST_AGENT)

    async def apply(self, obj: dict) -> dict:
        return await self.kube.create(obj)

    async def get(self, kind: str, namespace: str, name: str) -> dict | None:
        return await self.kube.get(kind, namespace, name)

    async def wait_for(self, what: Callable[[], Awaitable[Any]], timeout: float = PATIENCE, message: str = "") -> Any:
        return await wait_for(what, timeout, message)

    async def phase(self, kind: str, namespace: str, name: str, phase: str, timeout: float = PATIENCE) -> dict:
        async def check():
            obj = await self.get(kind, namespace, name)
            return obj if obj and (obj.get("status") or {}).get("phase") == phase else None

        last = None

        async def check_and_keep():
            nonlocal last
            last = await self.get(kind, namespace, name)
            return await check()

        try:
            return await self.wait_for(check_and_keep, timeout, f"{kind} {name} phase {phase}")
        except AssertionError:
            raise AssertionError(f"{kind} {name} never reached {phase}: status {(last or {}).get('status')}") from None

    async def job(self, namespace: str, name: str, timeout: float = PATIENCE) -> dict:
        return await self.wait_for(lambda: self.get("Job", namespace, name), timeout, f"Job {name}")

    # ------------------------------------------------------------------ the Job controller and kubelet

    async def _pod(
        self,
        namespace: str,
        job: str,
        index: int,
        phase: str,
        container: str,
        state: dict | None = None,
        conditions: list | None = None,
    ) -> dict:
        name = f"{job}-{index}-{int(time.monotonic() * 1e6) % 100000}"
        pod = await self.kube.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": {
                        "batch.kubernetes.io/job-name": job,
                        "batch.kubernetes.io/job-completion-index": str(index),
                    },
                },
                "spec": {"containers": [{"name": container, "image": "img"}]},
            }
        )
        status = {
            "phase": phase,
            "conditions": conditions or [],
            "containerStatuses": [{"name": container, "state": state or {"running": {"startedAt": timestamp(now())}}}],
        }
        await self.kube.patch("Pod", namespace, pod["metadata"]["name"], {"status": status}, status=True)
        return pod

    async def job_running(self, namespace: str, job: str, container: str = "trainer", log: str = "") -> dict:
        pod = await self._pod(namespace, job, 0, "Running", container)
        self.api.pod_logs[(namespace, pod["metadata"]["name"])] = log
        await self.kube.patch(
            "Job", namespace, job, {"status": {"active": 1, "ready": 1, "startTime": timestamp(now())}}, status=True
        )
        return pod

    async def job_succeeded(self, namespace: str, job: str, result: dict, container: str = "trainer") -> None:
        state = {"terminated": {"exitCode": 0, "reason": "Completed", "message": json.dumps(result)}}
        await self._pod(namespace, job, 0, "Succeeded", container, state)
        t = timestamp(now())
        await self.kube.patch(
            "Job",
            namespace,
            job,
            {
                "status": {
                    "active": 0,
                    "ready": 0,
                    "succeeded": 1,
                    "completionTime": t,
                    "conditions": [
                        {"type": "Complete", "status": "True", "reason": "CompletionsReached", "lastTransitionTime": t}
                    ],
                }
            },
            status=True,
        )

    async def pod_failed(
        self,
        namespace: str,
        job: str,
        exit_code: int,
        message: str = "",
        container: str = "trainer",
        preempted: bool = False,
    ) -> None:
        state = {"terminated": {"exitCode": exit_code, "reason": "Error", "message": message}}
        conditions = (
            [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}] if preempted else []
        )
        await self._pod(namespace, job, 0, "Failed", container, state, conditions)

    async def job_failed(self, namespace: str, job: str, reason: str, message: str, failed: int = 1) -> None:
        t = timestamp(now())
        await self.kube.patch(
            "Job",
            namespace,
            job,
            {
                "status": {
                    "active": 0,
                    "ready": 0,
                    "failed": failed,
                    "conditions": [
                        {
                            "type": "Failed",
                            "status": "True",
                            "reason": reason,
                            "message": message,
                            "lastTransitionTime": t,
                        }
                    ],
                }
            },
            status=True,
        )

    async def deployment_ready(self, namespace: str, name: str, replicas: int = 1) -> None:
        dep = await self.get("Deployment", namespace, name)
        await self.kube.patch(
            "Deployment",
            namespace,
            name,
            {
                "status": {
                    "observedGeneration": dep["metadata"]["generation"],
                    "replicas": replicas,
                    "readyReplicas": replicas,
                    "updatedReplicas": replicas,
                    "availableReplicas": replicas,
                    "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}],
                }
            },
            status=True,
        )
