"""`gemma-tpu dev --real` end to end: the demo on a real kube-apiserver and kube-controller-manager 1.36
that it starts itself, the local node agent its one node. It must end as the in-process demo does
(tests/e2e/test_dev.py), and meanwhile the cluster must show that only the node was ours: the Node
Ready, every pod bound to it, the training and merge pods made by the real Job controller and the
vLLM pod by a real ReplicaSet (kube-controller-manager is the manager that created them), and the
operator never refused a request under its ServiceAccount's RBAC."""

import asyncio
import json

import pytest

from gemma_devcluster import control_plane, dev
from gemma_devcluster.agent import NODE_NAME
from gemma_devcluster.client import NodeKube
from tests.support import tiers
from tests.support.demo import (
    NS,
    Printed,
    arguments,
    ask_live_servers,
    check_outcome,
    kubectl,
    kubectl_wait_ready,
    until,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.control_plane,
    pytest.mark.usefixtures("vllm_python", "kubectl_path"),
]
CONTROLLERS = "kube-controller-manager"  # the field manager of what the real controllers create


@pytest.fixture
def scripts():
    try:
        return control_plane.scripts_dir()
    except control_plane.ControlPlaneMissing as e:
        tiers.unavailable(str(e))


def created_by(obj: dict) -> set[str]:
    """The field managers of `obj`'s spec: who wrote it, when it was created (a pod's spec is immutable)."""
    return {m["manager"] for m in obj["metadata"]["managedFields"] if "f:spec" in m.get("fieldsV1", {})}


def get(config, home, *args) -> list[dict]:
    done = kubectl(config, home, "get", *args, "--show-managed-fields", "-o", "json", timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["items"]


async def test_dev_real_runs_the_pods_of_the_real_controllers_on_the_local_node(scripts, tmp_path, capsys):
    workdir = tmp_path / "demo"
    config = workdir / "control-plane" / "kubeconfig"
    stop = asyncio.Event()
    demo = asyncio.create_task(dev.run(arguments(workdir, real=True), stop))
    try:
        printed = Printed(capsys)
        await until(lambda: printed.has(Printed.APPLIED), demo, "the quickstart applied")
        waited = await asyncio.to_thread(kubectl_wait_ready, config, tmp_path)
        assert waited.returncode == 0 and waited.stdout.count("condition met") == 2, waited.stderr
        await until(lambda: printed.has(Printed.ANSWERED), demo, "answers")
        asked = await ask_live_servers(NodeKube.from_kubeconfig(config, "gemma-tpu-tests"))
        nodes = get(config, tmp_path, "nodes")
        pods = get(config, tmp_path, "pods", "-n", NS)
        replica_sets = {r["metadata"]["name"]: r for r in get(config, tmp_path, "replicasets", "-n", NS)}
        await until(lambda: printed.has(Printed.BENCHMARK), demo, "the serving benchmark's figures")
    finally:
        stop.set()
        out = await demo
    check_outcome(out, asked)

    [node] = nodes
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert node["metadata"]["name"] == NODE_NAME and ready["status"] == "True"
    assert {p["spec"]["nodeName"] for p in pods} == {NODE_NAME}
    owners = {p["metadata"]["labels"]["app.kubernetes.io/component"]: p["metadata"]["ownerReferences"][0] for p in pods}
    assert {owners[c]["kind"] for c in ("training", "merge")} == {"Job"}
    assert owners["serving"]["kind"] == "ReplicaSet"
    assert replica_sets[owners["serving"]["name"]]["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    assert set().union(*(created_by(p) for p in pods)) == {CONTROLLERS}
    assert created_by(replica_sets[owners["serving"]["name"]]) == {CONTROLLERS}
    operator_log = (workdir / "operator.log").read_text()
    assert "Forbidden" not in operator_log and " 403" not in operator_log, operator_log[-3000:]
