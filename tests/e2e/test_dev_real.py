"""`gemma-tpu dev --real` end to end: the demo on a real kube-apiserver and kube-controller-manager 1.36
that it starts itself, the local node agent its one node. It must end as the in-process demo does
(tests/e2e/test_dev.py), and meanwhile the cluster must show that only the node was ours: the Node
Ready, every pod bound to it, the training and merge pods made by the real Job controller and the
vLLM pod by a real ReplicaSet (kube-controller-manager is the manager that created them), and the
operator never refused a request under its ServiceAccount's RBAC.

The whole pipeline runs in a namespace that enforces Pod Security's `restricted` level, and on a
cluster that gains, once the quickstart is applied, a Node and pods of its own (in another namespace,
and one in the demo's namespace without the local node's toleration): those are never bound or run."""

import asyncio
import json

import pytest

from gemma_devcluster import confinement, control_plane, dev
from gemma_devcluster.agent import NODE_NAME
from gemma_devcluster.client import NodeKube
from gemma_operator.kube import ApiError
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


def foreign_pod(name: str, namespace: str, tolerations: list[dict]) -> dict:
    """A pod that is not the demo's, fit for a namespace enforcing `restricted`."""
    container = {
        "name": "main",
        "image": "registry.example/other:1",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    security = {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
    spec = {"containers": [container], "securityContext": security, "tolerations": tolerations}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


async def share_the_cluster(kube: NodeKube) -> list[tuple[str, str]]:
    """Another Node, and pods the demo must leave alone: (namespace, name) of each."""
    await kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "other-node"}})
    await kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "elsewhere"}})
    pods = [
        foreign_pod("other-team", "elsewhere", [confinement.TOLERATION.manifest()]),
        foreign_pod("not-the-demos", NS, []),
    ]
    for pod in pods:
        await until_created(kube, pod)
    return [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods]


async def until_created(kube: NodeKube, obj: dict) -> None:
    """Create `obj`; a fresh namespace has no default ServiceAccount for a moment, and refuses pods meanwhile."""
    for _ in range(100):
        try:
            await kube.create(obj)
            return
        except ApiError as e:
            if "serviceaccount" not in e.message:
                raise
            await asyncio.sleep(0.1)
    raise AssertionError(f"{obj['metadata']} was never admitted")


async def test_dev_real_runs_the_pods_of_the_real_controllers_on_the_local_node(scripts, tmp_path, capsys):
    workdir = tmp_path / "demo"
    config = workdir / "control-plane" / "kubeconfig"
    stop = asyncio.Event()
    demo = asyncio.create_task(dev.run(arguments(workdir, real=True), stop))
    try:
        printed = Printed(capsys)
        await until(lambda: printed.has(Printed.APPLIED), demo, "the quickstart applied")
        foreign = await share_the_cluster(NodeKube.from_kubeconfig(config, "gemma-tpu-tests"))
        waited = await asyncio.to_thread(kubectl_wait_ready, config, tmp_path)
        assert waited.returncode == 0 and waited.stdout.count("condition met") == 2, waited.stderr
        await until(lambda: printed.has(Printed.ANSWERED), demo, "answers")
        asked = await ask_live_servers(NodeKube.from_kubeconfig(config, "gemma-tpu-tests"))
        nodes = get(config, tmp_path, "nodes")
        pods = get(config, tmp_path, "pods", "-n", NS, "-l", "app.kubernetes.io/managed-by=gemma-tpu-operator")
        namespace = json.loads(kubectl(config, tmp_path, "get", "namespace", NS, "-o", "json").stdout)
        left_alone = [
            get(config, tmp_path, "pods", "-n", ns, "--field-selector", f"metadata.name={n}") for ns, n in foreign
        ]
        replica_sets = {r["metadata"]["name"]: r for r in get(config, tmp_path, "replicasets", "-n", NS)}
        await until(lambda: printed.has(Printed.BENCHMARK), demo, "the serving benchmark's figures")
    finally:
        stop.set()
        out = await demo
    check_outcome(out, asked)

    [node] = [n for n in nodes if n["metadata"]["name"] == NODE_NAME]
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and confinement.TAINT in node["spec"]["taints"]
    assert {p["spec"]["nodeName"] for p in pods} == {NODE_NAME}
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for [pod] in left_alone:
        status = pod.get("status") or {}
        assert "nodeName" not in pod["spec"] and status.get("phase") == "Pending" and not status.get("conditions"), pod
    owners = {p["metadata"]["labels"]["app.kubernetes.io/component"]: p["metadata"]["ownerReferences"][0] for p in pods}
    assert {owners[c]["kind"] for c in ("training", "merge")} == {"Job"}
    assert owners["serving"]["kind"] == "ReplicaSet"
    assert replica_sets[owners["serving"]["name"]]["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    assert set().union(*(created_by(p) for p in pods)) == {CONTROLLERS}
    assert created_by(replica_sets[owners["serving"]["name"]]) == {CONTROLLERS}
    operator_log = (workdir / "operator.log").read_text()
    assert "Forbidden" not in operator_log and " 403" not in operator_log, operator_log[-3000:]
