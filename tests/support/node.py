"""Workloads for the local node agent in tests: Jobs and Deployments of plain Python commands, run
with this interpreter as their image, and the node that runs them."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from gemma_devcluster.agent import NodeAgent
from gemma_devcluster.kubelet import Node
from gemma_operator.failure_policy import job_pod_failure_policy
from tests.support.cluster import PATIENCE

IMAGE = "local/python"
CLAIM = "data"


def local_node(folder: Path) -> Node:
    """A node whose one image is this Python, with the claim `data` a folder."""
    return Node(folder / "node", {IMAGE: Path(sys.executable).parent}, {CLAIM: folder / "pvc"})


@contextlib.asynccontextmanager
async def running(agent: NodeAgent) -> AsyncIterator[NodeAgent]:
    """The agent running, its node registered."""
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        registered = asyncio.create_task(agent.registered.wait())
        await asyncio.wait([registered, task], timeout=PATIENCE, return_when=asyncio.FIRST_COMPLETED)
        registered.cancel()
        if task.done():
            task.result()  # its error, if registering failed
        assert agent.registered.is_set(), f"the node did not register within {PATIENCE} s"
        yield agent
    finally:
        stop.set()
        await task


def job(name: str, script: str, *, namespace: str = "default", backoff: int = 2, policy: bool = True, extra=None):
    """A Job of one `python -c script` pod, with the operator's podFailurePolicy unless `policy` is False."""
    container = {
        "name": "trainer",
        "image": IMAGE,
        "command": ["python", "-c", script],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        **(extra or {}),
    }
    spec: dict[str, Any] = {
        "backoffLimit": backoff,
        "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
    }
    if policy:
        spec["podFailurePolicy"] = job_pod_failure_policy("trainer")
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def deployment(name: str, container: dict, *, namespace: str = "default", annotations: dict | None = None) -> dict:
    """A Deployment of one replica of `container`, its pods labelled app=<name>."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations or {}},
                "spec": {"containers": [container]},
            },
        },
    }


def finished(job_: dict | None) -> dict | None:
    """The Job, once Complete or Failed."""
    conditions = ((job_ or {}).get("status") or {}).get("conditions") or []
    done = any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conditions)
    return job_ if done else None
