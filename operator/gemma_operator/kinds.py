"""Every kind the operator touches, one row each: what it may do with it and what part it plays.

A new child kind is one row here (and its builder in children/): the RBAC role (`rbac.py`), the
re-applied fields (`reconcile`), the watches that wake its owner and the serving children read
back on every GemmaServe reconcile all come from this table. The role is checked against it
(tests/packaging) and against the calls a running operator really makes.
"""

from __future__ import annotations

from dataclasses import dataclass

from gemma_operator import api


@dataclass(frozen=True)
class KindInfo:
    api_version: str
    plural: str
    verbs: frozenset[str]
    # Spec fields re-applied when what the CR wants of them changes; None: not a child the operator writes.
    mutable: tuple[str, ...] | None = None
    wakes_owner: bool = False  # its events reconcile the CR that controls it
    serving: bool = False  # a GemmaServe child, read back on every GemmaServe reconcile
    status: bool = False  # one of ours: the operator writes its /status

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]


READ = frozenset({"get", "list", "watch"})
OWN = frozenset({"get", "create", "patch"})  # a child made once and re-applied
RUN = OWN | {"list", "watch", "delete"}  # a child that runs, is watched and is replaced with a new run
OPTIONAL = OWN | {"delete"}  # a child that comes and goes with the spec

# Job templates are immutable and a Job's suspend is the lifecycle's business: nothing is re-applied.
KINDS: dict[str, KindInfo] = {
    api.FINETUNE.kind: KindInfo(api.API_VERSION, api.FINETUNE.plural, READ, status=True),
    api.SERVE.kind: KindInfo(api.API_VERSION, api.SERVE.plural, READ, status=True),
    # Watched so that a changed config is put back at once, not at the next poll.
    "ConfigMap": KindInfo("v1", "configmaps", OWN | {"list", "watch"}, mutable=(), wakes_owner=True),
    "Job": KindInfo("batch/v1", "jobs", RUN, mutable=(), wakes_owner=True),
    "JobSet": KindInfo("jobset.x-k8s.io/v1alpha2", "jobsets", RUN, mutable=(), wakes_owner=True),
    "Deployment": KindInfo(
        "apps/v1",
        "deployments",
        RUN,
        wakes_owner=True,
        serving=True,
        mutable=("replicas", "template", "strategy", "progressDeadlineSeconds"),
    ),
    "Service": KindInfo("v1", "services", OWN, mutable=("ports", "selector", "type")),
    "LeaderWorkerSet": KindInfo(
        "leaderworkerset.x-k8s.io/v1",
        "leaderworkersets",
        RUN,
        wakes_owner=True,
        serving=True,
        mutable=("replicas", "leaderWorkerTemplate", "rolloutStrategy"),
    ),
    "HorizontalPodAutoscaler": KindInfo(
        "autoscaling/v2",
        "horizontalpodautoscalers",
        OPTIONAL,
        serving=True,
        mutable=("scaleTargetRef", "minReplicas", "maxReplicas", "metrics", "behavior"),
    ),
    "PodMonitor": KindInfo(
        "monitoring.coreos.com/v1", "podmonitors", OPTIONAL, serving=True, mutable=("selector", "podMetricsEndpoints")
    ),
    "PodMonitoring": KindInfo(
        "monitoring.googleapis.com/v1", "podmonitorings", OPTIONAL, serving=True, mutable=("selector", "endpoints")
    ),
    "Pod": KindInfo("v1", "pods", frozenset({"list"})),
    # Created on our CRs; listed for the FailedCreate Events of the children's pods (pod_creation.py).
    "Event": KindInfo("v1", "events", frozenset({"create", "list"})),
}
POD_LOG = "pods/log"  # read for live training progress


def where(**column: bool) -> tuple[str, ...]:
    """The kinds whose row has these values, in table order: `where(serving=True)`."""
    return tuple(k for k, info in KINDS.items() if all(getattr(info, c) == v for c, v in column.items()))
