"""The RBAC rules the operator needs, derived from `kinds.KINDS` and what kopf itself calls.

The chart's roles are generated from these (`make manifests`), and the tests check them both ways
against the requests a running operator really makes: nothing it calls is missing, nothing
granted goes unused.
"""

from __future__ import annotations

from gemma_operator import api
from gemma_operator.kinds import KINDS, POD_LOG, where

# kopf watches CustomResourceDefinitions to notice kinds installed after it started (JobSet, say).
# Namespaced installs turn that off (runner.configure) rather than ask for a cluster-scoped grant.
KOPF_CLUSTER_RULES = [
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
]


def _grants() -> dict[tuple[str, str], set[str]]:
    """(api group, resource) -> verbs, from the table of kinds the operator touches."""
    grants: dict[tuple[str, str], set[str]] = {}
    for info in KINDS.values():
        grants.setdefault((info.group, info.plural), set()).update(info.verbs)
    for kind in where(status=True):
        grants[(api.GROUP, f"{KINDS[kind].plural}/status")] = {"patch"}
    grants[("", POD_LOG)] = {"get"}
    return grants


def namespaced_rules() -> list[dict]:
    """Rules on namespaced resources: a ClusterRole's, or a Role's in each watched namespace.
    Resources of one group with the same verbs share a rule."""
    merged: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (group, resource), verbs in sorted(_grants().items()):
        merged.setdefault((group, tuple(sorted(verbs))), []).append(resource)
    return [
        {"apiGroups": [group], "resources": resources, "verbs": list(verbs)}
        for (group, verbs), resources in sorted(merged.items())
    ]


def cluster_rules() -> list[dict]:
    """Everything a cluster-wide operator needs."""
    return namespaced_rules() + KOPF_CLUSTER_RULES
