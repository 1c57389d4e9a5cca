"""What scales and watches the servers: a HorizontalPodAutoscaler on a per-pod vLLM metric
(waiting requests by default, the signal that grows before latency does), and a PodMonitor
(prometheus-operator) or PodMonitoring (GKE Managed Prometheus) that scrapes vLLM's /metrics."""

from __future__ import annotations

from typing import Any

from gemma_operator.children import common, serving
from gemma_operator.plan import ServePlan


def autoscaler(plan: ServePlan, owner: dict | None) -> dict[str, Any] | None:
    a = plan.spec.autoscaling
    if a is None:
        return None
    target = "LeaderWorkerSet" if plan.multi_host else "Deployment"
    api_version = "leaderworkerset.x-k8s.io/v1" if plan.multi_host else "apps/v1"
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": common.metadata(serving.name(plan), plan.namespace, serving.resource_labels(plan), owner),
        "spec": {
            "scaleTargetRef": {"apiVersion": api_version, "kind": target, "name": serving.name(plan)},
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": a.metric},
                        "target": {"type": "AverageValue", "averageValue": _quantity(a.target_average_value)},
                    },
                }
            ],
            # A replica takes minutes to compile before it helps: do not scale down on a dip.
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}},
        },
    }


def pod_monitor(plan: ServePlan, owner: dict | None) -> dict[str, Any] | None:
    if not plan.spec.metrics.pod_monitor:
        return None
    return _monitor(plan, owner, "monitoring.coreos.com/v1", "PodMonitor", "podMetricsEndpoints")


def pod_monitoring(plan: ServePlan, owner: dict | None) -> dict[str, Any] | None:
    """GKE Managed Prometheus scrapes what a PodMonitoring (monitoring.googleapis.com/v1) selects."""
    if not plan.spec.metrics.pod_monitoring:
        return None
    return _monitor(plan, owner, "monitoring.googleapis.com/v1", "PodMonitoring", "endpoints")


def _monitor(plan: ServePlan, owner: dict | None, api_version: str, kind: str, endpoints: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": common.metadata(serving.name(plan), plan.namespace, serving.resource_labels(plan), owner),
        "spec": {
            "selector": {"matchLabels": serving.selector(plan)},
            endpoints: [{"port": "http", "path": "/metrics", "interval": "30s"}],
        },
    }


def _quantity(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{int(value * 1000)}m"
