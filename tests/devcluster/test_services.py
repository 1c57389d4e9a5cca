"""The local node's cluster DNS: a Service's names reach the host port of a ready pod it selects."""

from gemma_devcluster import services
from gemma_devcluster.kubelet import HOST_PORT_ANNOTATION

SVC = {
    "metadata": {"name": "chat-vllm", "namespace": "ml"},
    "spec": {"selector": {"app": "chat"}, "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]},
}


def pod(name: str, ready: bool, port: str | None, labels: dict | None = None, namespace: str = "ml") -> dict:
    annotations = {HOST_PORT_ANNOTATION: port} if port else {}
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels or {"app": "chat"},
            "annotations": annotations,
        },
        "status": {"conditions": [{"type": "Ready", "status": str(ready)}]},
    }


def test_both_dns_names_of_a_service_route_to_a_ready_pod():
    table = services.routes([SVC], [pod("a", False, "4001"), pod("b", True, "4002")])
    assert table == {
        "chat-vllm.ml.svc:8000": "127.0.0.1:4002",
        "chat-vllm.ml.svc.cluster.local:8000": "127.0.0.1:4002",
    }


def test_no_route_without_a_ready_selected_pod_in_the_namespace():
    others = [pod("x", True, "4003", {"app": "other"}), pod("y", True, "4004", namespace="dev"), pod("z", True, None)]
    assert services.routes([SVC], others) == {}
