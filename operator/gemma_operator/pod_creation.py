"""Pods the API server refuses to create: what the CR says about it, as pure functions.

A Job, JobSet, Deployment or LeaderWorkerSet whose pods are refused at admission (a missing
ServiceAccount, an exceeded ResourceQuota, Pod Security, a LimitRange, a validating webhook)
shows nothing in its own status: no pod exists, so nothing fails. The controller that owns the
pods says it elsewhere, always with reason `FailedCreate` and the API server's own message:
- the Job controller, and the StatefulSet controller (LeaderWorkerSet's groups), in a Warning
  Event on the Job or StatefulSet (kubernetes pkg/controller/controller_utils.go, FailedCreatePodReason);
- the ReplicaSet controller in its ReplicaFailure condition, which the deployment controller
  copies onto the Deployment (pkg/controller/deployment/sync.go, getReplicaFailures).

It heals by itself when the cause goes away (the controllers keep trying), so the CR's phase
does not change: a condition and one Warning Event say why, until pods appear.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

from gemma_operator import reasons
from gemma_operator.clock import parse_time

FAILED_CREATE = reasons.FAILED_CREATE  # the controllers' Event and condition reason
CONDITION = reasons.PODS_CREATED  # False while the workload's pods are refused; True once they exist again
REFUSED = reasons.POD_CREATION_FAILED  # its reason while False, and the reason of the CR's Warning Event
CREATED = reasons.PODS_CREATED  # its reason once pods exist again
# The kinds whose controllers create the pods of each workload kind (LeaderWorkerSet: its StatefulSets).
_NEVER = datetime.datetime.min.replace(tzinfo=datetime.UTC)
POD_OWNERS = {"Job": ("Job",), "JobSet": ("Job",), "LeaderWorkerSet": ("StatefulSet",)}


@dataclass(frozen=True)
class Refusal:
    """Why the pods of a workload cannot be created, and what to do about it."""

    kind: str  # the object the refusal was reported on (Job, StatefulSet, Deployment)
    name: str
    message: str  # the API server's own words
    hint: str | None = None

    def describe(self) -> str:
        return f"{self.kind} {self.name} cannot create pods: {self.message}" + (f"; {self.hint}" if self.hint else "")


# What to do, by what the API server said: (pattern over its message, advice). First match wins.
# The messages are kube-apiserver's admission plugins' own (plugin/pkg/admission/serviceaccount,
# resourcequota, limitranger; staging/src/k8s.io/pod-security-admission; the webhook dispatcher).
HINTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r'error looking up service account (?P<ns>[^/\s]+)/(?P<sa>[^:\s]+): serviceaccount "[^"]*" not found'
        ),
        "create ServiceAccount {ns}/{sa} (the chart creates the workload ServiceAccounts in each of "
        "workloads.namespaces) or set spec.serviceAccountName to one that exists",
    ),
    (
        re.compile(r"exceeded quota: (?P<quota>[^,\s]+)"),
        "raise ResourceQuota {quota} in this namespace or lower what the workload asks for",
    ),
    (
        re.compile(r'violates PodSecurity "(?P<level>[^"]+)"'),
        'the namespace enforces Pod Security level "{level}": run the workload in a namespace whose '
        "pod-security.kubernetes.io/enforce label allows it",
    ),
    (
        re.compile(r"(?P<what>(?:maximum|minimum) \S+ usage per (?:Container|Pod) is [^,\s]+)"),
        "the namespace's LimitRange refuses the pod's resources ({what}): change the LimitRange or the settings' resources",
    ),
    (
        re.compile(r'admission webhook "(?P<hook>[^"]+)" denied the request'),
        "the validating admission webhook {hook} refused the pod: see that policy",
    ),
)


def hint(message: str) -> str | None:
    """What the project knows to do about an API server's refusal, or None."""
    for pattern, advice in HINTS:
        if m := pattern.search(message):
            return advice.format(**m.groupdict())
    return None


def expected_pods(workload: dict) -> int:
    """How many pods the workload runs at once when nothing is wrong."""
    spec = workload.get("spec") or {}
    if workload["kind"] == "Job":
        return int(spec.get("parallelism", 1))
    if workload["kind"] == "JobSet":
        return sum(
            int(r.get("replicas", 1)) * int(((r.get("template") or {}).get("spec") or {}).get("parallelism", 1))
            for r in spec.get("replicatedJobs") or []
        )
    if workload["kind"] == "LeaderWorkerSet":
        return int(spec.get("replicas", 1)) * int((spec.get("leaderWorkerTemplate") or {}).get("size", 1))
    return int(spec.get("replicas", 1))


def may_be_refused(workload: dict | None, pods: list[dict]) -> bool:
    """Whether refusals are worth reading: an unfinished workload with fewer live pods than it runs."""
    if workload is None or workload["kind"] == "Deployment":  # a Deployment says it in its own status
        return False
    done = (reasons.JOB_COMPLETE, reasons.JOBSET_COMPLETED, reasons.JOB_FAILED, reasons.JOB_SUSPENDED)
    if any(
        c.get("type") in done and c.get("status") == "True"
        for c in (workload.get("status") or {}).get("conditions") or []
    ):
        return False
    if (workload.get("spec") or {}).get("suspend"):
        return False
    live = [p for p in pods if (p.get("status") or {}).get("phase") not in (reasons.POD_SUCCEEDED, reasons.POD_FAILED)]
    return len(live) < expected_pods(workload)


def _owned_by(event: dict, workload: dict) -> bool:
    """Whether an Event concerns the workload itself or the objects its controller makes for it
    (a JobSet's Jobs `<jobset>-<job>-<index>`, a LeaderWorkerSet's StatefulSets `<lws>[-<group>]`)."""
    involved, meta = event.get("involvedObject") or {}, workload["metadata"]
    if involved.get("kind") == workload["kind"]:
        return involved.get("uid") == meta.get("uid")
    name = involved.get("name") or ""
    return involved.get("kind") in POD_OWNERS.get(workload["kind"], ()) and (
        name == meta["name"] or name.startswith(meta["name"] + "-")
    )


def _event_time(event: dict) -> datetime.datetime:
    """When the Event was last seen, in whole seconds like object timestamps (core/v1 Events carry
    lastTimestamp; those written through events.k8s.io carry eventTime and series instead)."""
    series = event.get("series") or {}
    seen = series.get("lastObservedTime") or event.get("lastTimestamp") or event.get("eventTime")
    return (parse_time(seen or event.get("firstTimestamp")) or _NEVER).replace(microsecond=0)


def refusal(workload: dict | None, pods: list[dict], events: list[dict]) -> Refusal | None:
    """Why the workload's pods are refused now, or None.

    A Deployment's ReplicaFailure condition says it while it lasts. For the other kinds, the
    newest FailedCreate Event on the workload (or on the Jobs or StatefulSets it is made of) counts
    while it is newer than the newest pod: Events outlive their cause (an hour by default), and a
    pod created after the last refusal shows that the cause went away."""
    if workload is None:
        return None
    if workload["kind"] == "Deployment":
        for c in (workload.get("status") or {}).get("conditions") or []:
            if (
                c.get("type") == reasons.DEPLOYMENT_REPLICA_FAILURE
                and c.get("status") == "True"
                and c.get("reason") == FAILED_CREATE
            ):
                message = c.get("message") or ""
                return Refusal("Deployment", workload["metadata"]["name"], message, hint(message))
        return None
    refused = sorted(
        (e for e in events if e.get("reason") == FAILED_CREATE and _owned_by(e, workload)),
        key=_event_time,
    )
    if not refused:
        return None
    newest_pod = max((parse_time(p["metadata"].get("creationTimestamp")) or _NEVER for p in pods), default=_NEVER)
    last = refused[-1]
    if pods and newest_pod >= _event_time(last):
        return None
    message = (last.get("message") or "").removeprefix("Error creating: ")
    involved = last.get("involvedObject") or {}
    return Refusal(involved.get("kind", workload["kind"]), involved.get("name", ""), message, hint(message))
