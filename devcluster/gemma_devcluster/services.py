"""Cluster DNS and kube-proxy for the local node: a pod that calls a Service reaches a ready pod
behind it.

Pods share this machine's network and each container port moved to a free host port
(kubelet.HOST_PORT_ANNOTATION), so `http://<service>.<namespace>.svc:<port>` in a container's
command is rewritten, when the pod starts, to the host port of a ready pod the Service selects
(its spec.selector, its port's targetPort); the names the cluster DNS answers are the Service's
`<service>.<namespace>.svc` and `.svc.cluster.local` forms.
"""

from __future__ import annotations

from typing import Any

from gemma_devcluster.kubelet import HOST_PORT_ANNOTATION

CLUSTER_DOMAIN = "cluster.local"


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _selects(selector: dict[str, str], pod: dict[str, Any]) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def routes(services: list[dict[str, Any]], pods: list[dict[str, Any]]) -> dict[str, str]:
    """`<service>.<namespace>.svc[.cluster.local]:<port>` -> `127.0.0.1:<host port>` for every
    Service port with a ready pod behind it (the first, by name: one replica answers)."""
    out: dict[str, str] = {}
    for svc in services:
        meta, spec = svc["metadata"], svc.get("spec") or {}
        behind = sorted(
            (p for p in pods if p["metadata"].get("namespace") == meta["namespace"] and _ready(p)),
            key=lambda p: p["metadata"]["name"],
        )
        ported = [
            p
            for p in behind
            if _selects(spec.get("selector") or {}, p)
            and HOST_PORT_ANNOTATION in (p["metadata"].get("annotations") or {})
        ]
        if not ported:
            continue
        host_port = ported[0]["metadata"]["annotations"][HOST_PORT_ANNOTATION]
        for port in spec.get("ports") or []:
            for host in (
                f"{meta['name']}.{meta['namespace']}.svc",
                f"{meta['name']}.{meta['namespace']}.svc.{CLUSTER_DOMAIN}",
            ):
                out[f"{host}:{port['port']}"] = f"127.0.0.1:{host_port}"
    return out
