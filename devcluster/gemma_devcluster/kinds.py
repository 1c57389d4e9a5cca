"""What the local node agent and the demo's own client may touch: the operator's kinds and the
ones only they use (never the operator, so not in its RBAC role): the demo creates the workload
ServiceAccounts the chart would."""

from __future__ import annotations

from gemma_operator.kinds import KINDS, KindInfo

LOCAL_KINDS: dict[str, KindInfo] = {
    **KINDS,
    "Secret": KindInfo("v1", "secrets", frozenset({"list"})),
    "Namespace": KindInfo("v1", "namespaces", frozenset({"create"})),
    "ServiceAccount": KindInfo("v1", "serviceaccounts", frozenset({"create"})),
}
