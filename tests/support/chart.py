"""The Helm chart as the tests see it: rendered objects, and what its roles grant."""

from __future__ import annotations

from collections.abc import Iterable

import yaml
from scripts.manifests import CHART, NAMESPACE, render

from gemma_devcluster.apiserver import Call

__all__ = ["CHART", "NAMESPACE", "grants", "objects", "one", "role_grants"]


def objects(values: dict | None = None, namespace: str = NAMESPACE) -> list[dict]:
    """Every object the chart renders with these values (`helm template`)."""
    return [doc for text in render(values, namespace).values() for doc in yaml.safe_load_all(text) if doc]


def one(objs: Iterable[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def grants(rule: dict, call: Call) -> bool:
    """Whether one RBAC rule allows one request (no wildcards: the chart uses none)."""
    names = rule.get("resourceNames")
    return (
        call.group in rule["apiGroups"]
        and call.resource in rule["resources"]
        and call.verb in rule["verbs"]
        and (not names or call.name in names)
    )


def role_grants(role: dict, call: Call) -> bool:
    """A ClusterRole (bound by a ClusterRoleBinding) grants in every namespace and cluster-wide;
    a Role only in its own namespace."""
    if role["kind"] == "Role" and call.namespace != role["metadata"]["namespace"]:
        return False
    return any(grants(rule, call) for rule in role["rules"])
