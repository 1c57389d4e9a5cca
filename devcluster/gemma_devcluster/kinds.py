"""What the local node agent and the demo's own client may touch: the operator's kinds and the
ones only they use (never the operator, so not in its RBAC role): the node registers its Node and
Lease, and the demo installs the CRDs and the operator's RBAC and creates the workload
ServiceAccounts the chart would."""

from __future__ import annotations

from gemma_operator.kinds import KINDS, KindInfo

LOCAL_KINDS: dict[str, KindInfo] = {
    **KINDS,
    "Secret": KindInfo("v1", "secrets", frozenset({"list"})),
    "Namespace": KindInfo("v1", "namespaces", frozenset({"create", "patch"})),
    "ServiceAccount": KindInfo("v1", "serviceaccounts", frozenset({"create"})),
    "Node": KindInfo("v1", "nodes", frozenset({"get", "list", "create", "patch"})),
    "Lease": KindInfo("coordination.k8s.io/v1", "leases", frozenset({"get", "create", "patch"})),
    "CustomResourceDefinition": KindInfo(
        "apiextensions.k8s.io/v1", "customresourcedefinitions", frozenset({"get", "patch"})
    ),
    "ClusterRole": KindInfo("rbac.authorization.k8s.io/v1", "clusterroles", frozenset({"patch"})),
    "ClusterRoleBinding": KindInfo("rbac.authorization.k8s.io/v1", "clusterrolebindings", frozenset({"patch"})),
}
