"""Whether a pod can run on the local node, decided as kube-scheduler's filters decide it, and the
scheduler's words when it cannot.

There is one node, so the answer is the node's: bind the pod to it, or leave the pod Pending with a
PodScheduled=False condition, reason Unschedulable, and the message kube-scheduler writes there
(pkg/scheduler/framework/types.go, FitError.Error: `0/<nodes> nodes are available: <count> <reason>, ....`).
The filters run in the default profile's order and the first that fails gives the node's reasons, as
the scheduler's framework stops at the first failing filter plugin of a node:
NodeUnschedulable, TaintToleration, NodeAffinity, then NodeResourcesFit.

CPU and memory requests are not counted against the node: its pods are processes sharing this
machine, so it runs every pod whose resources it has at all. A resource it does not have (TPU chips)
is insufficient, whatever the amount.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SCHEDULER_NAME = "default-scheduler"  # the pods this node schedules: those of the default scheduler
UNSCHEDULABLE = "Unschedulable"  # PodScheduled's reason (k8s.io/api/core/v1, PodReasonUnschedulable)
# The reasons of the filter plugins, in kube-scheduler's words (pkg/scheduler/framework/plugins/...):
CORDONED = "node(s) were unschedulable"  # nodeunschedulable, ErrReasonUnschedulable
UNTOLERATED = "node(s) had untolerated taint {{{key}: {value}}}"  # tainttoleration, Filter
AFFINITY = "node(s) didn't match Pod's node affinity/selector"  # nodeaffinity, ErrReasonPod
INSUFFICIENT = "Insufficient {resource}"  # noderesources/fit.go, insufficientResource reason
COUNTED = frozenset({"cpu", "memory", "pods", "ephemeral-storage"})  # shared with the machine: not counted


def fit_error(pod: dict[str, Any], node: dict[str, Any]) -> str | None:
    """The scheduler's message why `pod` cannot run on `node` (the only node), or None when it can."""
    for check in FILTERS:
        if reasons := check(pod, node):
            return f"0/1 nodes are available: {', '.join(sorted(f'1 {r}' for r in reasons))}."
    return None


def _unschedulable(pod: dict[str, Any], node: dict[str, Any]) -> list[str]:
    if not (node.get("spec") or {}).get("unschedulable"):
        return []
    tolerated = any(
        t.get("key") == "node.kubernetes.io/unschedulable" and t.get("operator") == "Exists"
        for t in pod["spec"].get("tolerations") or []
    )
    return [] if tolerated else [CORDONED]


def tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """core/v1 Toleration.ToleratesTaint: the effect matches (or is empty), and the key (empty with
    Exists tolerates every key) with Exists, or Equal and the same value."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return bool(toleration.get("key")) and toleration.get("value", "") == taint.get("value", "")


def _untolerated(pod: dict[str, Any], node: dict[str, Any]) -> list[str]:
    """The first NoSchedule or NoExecute taint the pod does not tolerate (PreferNoSchedule only scores)."""
    tolerations = pod["spec"].get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(tolerates(t, taint) for t in tolerations):
            return [UNTOLERATED.format(key=taint["key"], value=taint.get("value", ""))]
    return []


def _requirement_holds(requirement: dict[str, Any], labels: dict[str, str]) -> bool:
    """A NodeSelectorRequirement over the node's labels (Gt and Lt compare integers)."""
    key, operator, values = requirement["key"], requirement["operator"], requirement.get("values") or []
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    try:
        have, bound = int(labels[key]), int(values[0])
    except (KeyError, IndexError, ValueError):
        return False
    return have > bound if operator == "Gt" else have < bound


def _affinity(pod: dict[str, Any], node: dict[str, Any]) -> list[str]:
    """spec.nodeSelector, all of it, and the required node affinity: one of its terms, all of a term."""
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (pod["spec"].get("nodeSelector") or {}).items()):
        return [AFFINITY]
    required = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is None:
        return []
    fields = {"metadata.name": node["metadata"]["name"]}
    for term in required.get("nodeSelectorTerms") or []:
        if all(_requirement_holds(r, labels) for r in term.get("matchExpressions") or []) and all(
            _requirement_holds(r, fields) for r in term.get("matchFields") or []
        ):
            return []
    return [AFFINITY]


def _requested(pod: dict[str, Any]) -> set[str]:
    """The resources the pod asks for: a container's requests, or its limits where it states no request
    (the API server defaults a request to its limit)."""
    names: set[str] = set()
    for container in [*(pod["spec"].get("initContainers") or []), *pod["spec"]["containers"]]:
        resources = container.get("resources") or {}
        for bound in ("requests", "limits"):
            names |= {r for r, q in (resources.get(bound) or {}).items() if str(q).strip() not in ("0", "")}
    return names


def _insufficient(pod: dict[str, Any], node: dict[str, Any]) -> list[str]:
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return [INSUFFICIENT.format(resource=r) for r in sorted(_requested(pod) - COUNTED) if r not in allocatable]


# In the default profile's order (pkg/scheduler/apis/config/v1/default_plugins.go).
FILTERS: tuple[Callable[[dict[str, Any], dict[str, Any]], list[str]], ...] = (
    _unschedulable,
    _untolerated,
    _affinity,
    _insufficient,
)


def schedules(pod: dict[str, Any]) -> bool:
    """Whether this node's scheduler is the one to place the pod: unbound, not gated, not being
    deleted, and left to the default scheduler."""
    spec, meta = pod["spec"], pod["metadata"]
    return (
        not spec.get("nodeName")
        and not spec.get("schedulingGates")
        and not meta.get("deletionTimestamp")
        and spec.get("schedulerName", SCHEDULER_NAME) == SCHEDULER_NAME
        and (pod.get("status") or {}).get("phase") in (None, "Pending")
    )


def unschedulable_condition(message: str, at: str) -> dict[str, Any]:
    """The PodScheduled condition the scheduler writes on a pod no node can take."""
    return {
        "type": "PodScheduled",
        "status": "False",
        "reason": UNSCHEDULABLE,
        "message": message,
        "lastProbeTime": None,
        "lastTransitionTime": at,
    }
