"""Pods the API server refuses, against the real operator and the local Job and Deployment
controllers: the CR says why within seconds, once, and heals when the cause goes away.

The local API refuses a pod whose ServiceAccount does not exist, as kube-apiserver's ServiceAccount
admission plugin does; its controllers then post the FailedCreate Event a real cluster's do.
The pods run a stand-in image whose every command waits, so "training starts" is the Job's pod
running, without training anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import stat
from pathlib import Path

from gemma_devcluster.agent import NodeAgent
from gemma_devcluster.client import NodeKube
from gemma_devcluster.kubelet import Node
from gemma_operator import pod_creation
from gemma_operator.conditions import condition
from gemma_operator.kube import Kube
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune, serve
from tests.support.operator import settled

NS = "default"
MISSING = 'error looking up service account default/{sa}: serviceaccount "{sa}" not found'


@contextlib.asynccontextmanager
async def local_node(apiserver, tmp_path: Path):
    """The local node agent, every default image a folder whose `python`, `python3` and `vllm` wait."""
    images = tmp_path / "image"
    images.mkdir()
    for command in ("python", "python3", "vllm"):
        script = images / command
        script.write_text("#!/bin/sh\nexec sleep 600\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    defaults = OperatorSettings().images
    node = Node(tmp_path / "node", {defaults.workloads: images, defaults.serving_cpu: images}, {"data": tmp_path})
    kube = NodeKube.local(str(apiserver.url))
    stop = asyncio.Event()
    task = asyncio.create_task(NodeAgent(kube, apiserver, node, interval=0.05).run(stop))
    try:
        yield kube
    finally:
        stop.set()
        await task


async def refused(cluster, kind: str, name: str) -> dict | None:
    obj = await cluster.get(kind, NS, name)
    c = condition((obj.get("status") or {}).get("conditions"), pod_creation.CONDITION)
    return obj if c and c["status"] == "False" else None


async def warnings(cluster, name: str) -> list[dict]:
    return [
        e
        for e in await cluster.kube.list("Event", NS)
        if e["involvedObject"]["name"] == name and e["reason"] == pod_creation.REFUSED
    ]


async def service_account(kube: Kube, name: str) -> None:
    await kube.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": NS}})


async def test_a_job_refused_for_its_service_account_says_why_and_heals(operator, cluster, apiserver, tmp_path):
    async with local_node(apiserver, tmp_path) as kube:
        await cluster.apply(finetune("nosa").cpu_tiny().obj())
        gft = await cluster.wait_for(lambda: refused(cluster, "GemmaFineTune", "nosa"), 15, "PodsCreated=False")
        c = condition(gft["status"]["conditions"], pod_creation.CONDITION)
        job = gft["status"]["children"]["training"]
        assert c["reason"] == pod_creation.REFUSED
        # The API server's own words, the object they concern and what to do.
        assert c["message"].startswith(f'Job {job} cannot create pods: pods "{job}-" is forbidden: ')
        assert MISSING.format(sa="gemma-trainer") in c["message"]
        assert "create ServiceAccount default/gemma-trainer" in c["message"]
        assert gft["status"]["phase"] == "Pending" and gft["status"]["message"] == c["message"]
        for _ in range(2):  # two more reconciles, each reading the CR after the condition was written
            await settled(cluster, operator, "GemmaFineTune", NS, "nosa")
        [event] = await warnings(cluster, "nosa")
        assert event["type"] == "Warning" and event["message"] == c["message"]

        await service_account(kube, "gemma-trainer")
        gft = await cluster.phase("GemmaFineTune", NS, "nosa", "Training")
        c = condition(gft["status"]["conditions"], pod_creation.CONDITION)
        assert (c["status"], c["reason"]) == ("True", pod_creation.CREATED)
        assert len(await warnings(cluster, "nosa")) == 1


async def test_a_deployment_refused_for_its_service_account_says_why_and_heals(operator, cluster, apiserver, tmp_path):
    async with local_node(apiserver, tmp_path) as kube:
        b = serve("chat").tpu("cpu").set("model", {"uri": "/data/model"})
        b.set("storage", {"persistentVolumeClaim": "data", "mountPath": "/data"})
        await cluster.apply(b.obj())
        gsv = await cluster.wait_for(lambda: refused(cluster, "GemmaServe", "chat"), 15, "PodsCreated=False")
        c = condition(gsv["status"]["conditions"], pod_creation.CONDITION)
        assert c["message"].startswith('Deployment chat-vllm cannot create pods: pods "chat-vllm-')
        assert MISSING.format(sa="gemma-server") in c["message"]
        assert "create ServiceAccount default/gemma-server" in c["message"]
        assert gsv["status"]["phase"] == "Deploying"
        assert len(await warnings(cluster, "chat")) == 1

        await service_account(kube, "gemma-server")

        async def healed():
            obj = await cluster.get("GemmaServe", NS, "chat")
            found = condition((obj.get("status") or {}).get("conditions"), pod_creation.CONDITION)
            return obj if found and found["status"] == "True" else None

        gsv = await cluster.wait_for(healed, 15, "PodsCreated=True")
        assert gsv["status"]["phase"] == "Deploying" and "cannot create pods" not in gsv["status"]["message"]
        pods = await cluster.kube.list("Pod", NS)
        assert [p["spec"]["serviceAccountName"] for p in pods] == ["gemma-server"]
