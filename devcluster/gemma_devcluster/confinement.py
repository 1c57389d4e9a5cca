"""What keeps the local node of `gemma-tpu dev` to the demo's own pods on an API server it may share.

- The node is tainted (TAINT, NoSchedule): kube-scheduler and the DaemonSet controller place on it only
  pods that tolerate the taint, and the demo's operator puts the toleration on every pod it creates
  (settings.pod_tolerations).
- The node agent binds, runs and writes to only the pods of the demo's namespaces that tolerate the taint
  (`ours`): another namespace's pods are never even listed, and a pod of the demo's namespace without the
  toleration is left to whatever else schedules there.
- `dev --kubeconfig` refuses a cluster with schedulable Nodes of its own (`other_nodes`) unless told it
  may share it (ALLOW_FLAG): such a cluster runs other people's workloads, and the demo is for a control
  plane without nodes.
"""

from __future__ import annotations

from typing import Any

from gemma_devcluster import scheduling
from gemma_operator.settings import Toleration

TAINT = {"key": "gemma-tpu.dev/local-node", "value": "demo", "effect": "NoSchedule"}
TOLERATION = Toleration(key=TAINT["key"], operator="Equal", value=TAINT["value"], effect="NoSchedule")
ALLOW_FLAG = "--allow-shared-cluster"


def tolerates(pod: dict[str, Any], taint: dict[str, str] = TAINT) -> bool:
    """Whether one of the pod's tolerations tolerates `taint` (core/v1 Toleration.ToleratesTaint)."""
    return any(scheduling.tolerates(t, taint) for t in pod["spec"].get("tolerations") or [])


def ours(pod: dict[str, Any], namespaces: list[str] | None, taint: dict[str, str] | None) -> bool:
    """Whether the node agent may bind, run and write to this pod: one of `namespaces` (any when None)
    that tolerates `taint` (any pod when None)."""
    in_namespace = namespaces is None or pod["metadata"].get("namespace") in namespaces
    return in_namespace and (taint is None or tolerates(pod, taint))


def other_nodes(nodes: list[dict[str, Any]], own: str) -> list[str]:
    """The Nodes besides `own` that could take pods: not cordoned (spec.unschedulable)."""
    return sorted(
        n["metadata"]["name"]
        for n in nodes
        if n["metadata"]["name"] != own and not (n.get("spec") or {}).get("unschedulable")
    )


def shared_cluster_message(kubeconfig: str, nodes: list[str], namespaces: list[str], node: str) -> str:
    """Why `dev --kubeconfig` stops on a cluster with Nodes of its own, and what it would touch there."""
    shown = ", ".join(nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
    return (
        f"the cluster of {kubeconfig} has {len(nodes)} schedulable Node(s) of its own ({shown}): it runs other "
        "workloads, and the demo is meant for a control plane without nodes (start-control-plane's, or --real). "
        f"Pass {ALLOW_FLAG} to run it there anyway: it installs the CRDs and the operator's RBAC, adds the Node "
        f"{node} tainted {TAINT['key']}={TAINT['value']}:{TAINT['effect']} so that only the demo's pods land on "
        f"it, and runs only pods of namespace(s) {', '.join(namespaces)} that tolerate that taint"
    )
