"""Add-ons a spec may need that a cluster may lack, or have too old: JobSet (multi-host training),
LeaderWorkerSet (multi-host serving), the prometheus-operator's PodMonitor and GKE Managed
Prometheus' PodMonitoring (metrics).

What the API server serves is read from discovery, and a version, where only a field tells it,
from the kind's OpenAPI v3 schema: both are non-resource URLs every authenticated client may read
(Kubernetes RBAC, default ClusterRole system:discovery), so this needs no role. A missing add-on
becomes a DependencyMissing condition naming the fix, never a failed create retried forever.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gemma_operator.kinds import KINDS
from gemma_operator.kube import ApiError, Kube


@dataclass(frozen=True)
class Addon:
    kind: str
    requirement: str  # what must be installed, with its minimum version
    needed_for: str
    fix: str
    # A field of the kind's schema that only the required version has: older controllers prune it.
    schema_field: str | None = None


ADDONS = {
    a.kind: a
    for a in (
        # onJobFailureMessagePatterns (kubernetes-sigs/jobset#1033) tells preemptions from application
        # errors; an older JobSet prunes it, and every application error then restarts the gang forever.
        Addon(
            "JobSet",
            "JobSet >= v0.10.0",
            "multi-host training slices",
            "install JobSet v0.10.0 or later (kubernetes-sigs/jobset releases)",
            "onJobFailureMessagePatterns",
        ),
        Addon(
            "LeaderWorkerSet",
            "LeaderWorkerSet (leaderworkerset.x-k8s.io/v1)",
            "multi-host serving",
            "install LeaderWorkerSet (kubernetes-sigs/lws releases)",
        ),
        Addon(
            "PodMonitor",
            "the prometheus-operator CRDs (monitoring.coreos.com/v1 PodMonitor)",
            "metrics.podMonitor",
            "install the prometheus-operator, or on GKE Managed Prometheus use metrics.podMonitoring",
        ),
        Addon(
            "PodMonitoring",
            "GKE Managed Service for Prometheus (monitoring.googleapis.com/v1 PodMonitoring)",
            "metrics.podMonitoring",
            "enable Managed Service for Prometheus on the cluster, or use metrics.podMonitor",
        ),
    )
}


@dataclass(frozen=True)
class Missing:
    kind: str
    message: str
    blocking: bool  # the resource cannot progress without it (an optional monitor is not)


def message(addon: Addon, found_older: bool) -> str:
    what = "an older version is installed" if found_older else "it is not installed"
    return f"{addon.requirement} is required for {addon.needed_for}: {what}; {addon.fix}"


class Detector:
    """Which add-ons the API serves, re-read at most every `ttl` seconds (an install is noticed
    by the next reconcile after that)."""

    def __init__(self, kube: Kube, ttl: float) -> None:
        self.kube, self.ttl = kube, ttl
        self._seen: dict[str, tuple[float, str | None]] = {}

    async def missing(self, kinds: dict[str, bool]) -> list[Missing]:
        """The kinds asked for (kind -> blocking) that are absent or too old."""
        out = []
        for kind, blocking in kinds.items():
            problem = await self._problem(kind)
            if problem:
                out.append(Missing(kind, problem, blocking))
        return out

    async def _problem(self, kind: str) -> str | None:
        at, problem = self._seen.get(kind, (float("-inf"), None))
        if time.monotonic() - at >= self.ttl:
            problem = await self._detect(ADDONS[kind])
            self._seen[kind] = (time.monotonic(), problem)
        return problem

    async def _detect(self, addon: Addon) -> str | None:
        info = KINDS[addon.kind]
        served = await self.kube.get_path(f"/apis/{info.api_version}")
        if not served or info.plural not in {r.get("name") for r in served.get("resources") or []}:
            return message(addon, found_older=False)
        if addon.schema_field:
            try:
                schema = await self.kube.get_path(f"/openapi/v3/apis/{info.api_version}", raw=True)
            except ApiError as e:  # not published to this client: the version cannot be told
                if e.status not in (401, 403, 503):
                    raise
                schema = None
            if schema is not None and addon.schema_field not in schema:
                return message(addon, found_older=True)
        return None
