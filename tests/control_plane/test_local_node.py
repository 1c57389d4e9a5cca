"""The local node of `gemma-tpu dev` on a real API server that has Nodes and pods of its own
(confinement.py): `dev --kubeconfig` refuses such a cluster, naming its Nodes and the flag that accepts
the risk; with the flag, the node registers tainted and the agent binds and runs the demo's pod while a
pod of another namespace, a pod of the demo's namespace without the toleration, and one bound to the node
by name are never bound, run or written to."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

from gemma_devcluster import backends, confinement
from gemma_devcluster.agent import NODE_NAME
from gemma_devcluster.client import NodeKube
from gemma_operator.settings import OperatorSettings
from tests.support.cluster import wait_for
from tests.support.node import IMAGE, local_node

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"


def pod(name: str, namespace: str, *, tolerate: bool, node: str | None = None) -> dict:
    spec: dict = {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": IMAGE, "command": ["python", "-c", "print('ran')"]}],
    }
    if tolerate:
        spec["tolerations"] = [confinement.TOLERATION.manifest()]
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def quickstart_in(namespace: str) -> list[dict]:
    docs = [d for f in sorted(QUICKSTART.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    return [{**d, "metadata": {**d["metadata"], "namespace": namespace}} for d in docs]


async def test_dev_refuses_a_cluster_with_nodes_and_with_the_flag_runs_only_its_own_pods(
    control_plane, namespace, tmp_path
):
    elsewhere, other = f"elsewhere-{uuid.uuid4().hex[:8]}", f"other-{namespace}"
    control_plane.create_namespace(elsewhere)
    node_doc = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": other}}
    control_plane.kubectl("create", "-f", "-", stdin=yaml.safe_dump(node_doc))
    admin = NodeKube.from_kubeconfig(control_plane.kubeconfig, "gemma-tpu-tests")
    docs, settings = quickstart_in(namespace), OperatorSettings(pod_tolerations=[confinement.TOLERATION])
    try:
        with pytest.raises(backends.BackendError) as refused:
            async with backends.on_server(control_plane.kubeconfig, tmp_path, settings, local_node(tmp_path), docs):
                pass
        message = str(refused.value)
        # Other tests of this process's control plane may have left Nodes too: the message counts them all.
        nodes = json.loads(control_plane.kubectl("get", "nodes", "-o", "json").stdout)["items"]
        others = confinement.other_nodes(nodes, NODE_NAME)
        assert other in others and f"has {len(others)} schedulable Node(s) of its own" in message, message
        assert confinement.ALLOW_FLAG in message and namespace in message, message
        assert await admin.get("ServiceAccount", namespace, "gemma-trainer") is None, "nothing installed"

        foreign = [
            pod("foreign-elsewhere", elsewhere, tolerate=True),
            pod("foreign-untolerating", namespace, tolerate=False),
            pod("foreign-bound", namespace, tolerate=False, node=NODE_NAME),
        ]
        for p in foreign:
            await admin.create(p)
        node = local_node(tmp_path)
        async with backends.on_server(control_plane.kubeconfig, tmp_path, settings, node, docs, shared=True) as cluster:
            await admin.create(pod("demo", namespace, tolerate=True))

            async def demo_done():
                got = await admin.get("Pod", namespace, "demo")
                return got if (got.get("status") or {}).get("phase") == "Succeeded" else None

            demo = await wait_for(demo_done, 60, "the demo's pod run to its end")
            after = [await admin.get("Pod", p["metadata"]["namespace"], p["metadata"]["name"]) for p in foreign]
            local = {p.name for p in cluster.agent.pods.values()}
        assert demo["spec"]["nodeName"] == NODE_NAME
        for got in after:
            status, name = got.get("status") or {}, got["metadata"]["name"]
            assert status.get("phase") == "Pending" and not status.get("conditions"), (name, status)
            assert got["spec"].get("nodeName") in (None, *([NODE_NAME] if name == "foreign-bound" else [])), name
            assert not status.get("containerStatuses") and name not in local, name
        registered = await admin.get_cluster_scoped("Node", NODE_NAME)
        assert confinement.TAINT in registered["spec"]["taints"]
    finally:
        for name in (other, NODE_NAME):
            control_plane.kubectl("delete", "node", name, "--wait=false", check=False)
        control_plane.kubectl("delete", "namespace", elsewhere, "--wait=false", check=False)
