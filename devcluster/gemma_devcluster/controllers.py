"""The Job and Deployment controllers of the in-process API, where no kube-controller-manager runs.

They work through the same API as everything else (lists, creates, patches /status), so the
operator sees what it would see on a cluster: Jobs create their pod, complete or fail by their
podFailurePolicy and backoffLimit; Deployments roll out and report ready replicas. A pod the API
server refuses (a missing ServiceAccount, say) is reported as those controllers report it: a
Warning Event `FailedCreate` on the owner, and on a Deployment the ReplicaFailure condition its
ReplicaSet would carry (there are no ReplicaSets here). The pods they create are placed and run by
the local node (agent.py), as on a real API server the real controllers' pods are.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from gemma_operator.clock import now, parse_time, timestamp
from gemma_operator.kube import ApiError, Kube

JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
HASH_LABEL = "pod-template-hash"
# The reason Job, ReplicaSet and StatefulSet controllers give a pod the API server refused
# (kubernetes pkg/controller/controller_utils.go, FailedCreatePodReason).
FAILED_CREATE = "FailedCreate"


def _cond(obj: dict, type_: str) -> dict | None:
    return next(
        (
            c
            for c in (obj.get("status") or {}).get("conditions") or []
            if c.get("type") == type_ and c.get("status") == "True"
        ),
        None,
    )


def failure_action(policy: dict | None, pod: dict) -> tuple[str, int | None]:
    """(action, rule index) of a Job's podFailurePolicy for a failed pod; ("Count", None) if none matches."""
    terminated: dict[str, Any] = next(
        (
            cs["state"]["terminated"]
            for cs in pod["status"].get("containerStatuses") or []
            if "terminated" in cs.get("state", {})
        ),
        {},
    )
    code = terminated.get("exitCode")
    for i, rule in enumerate((policy or {}).get("rules") or []):
        on = rule.get("onExitCodes")
        if on and code is not None and (code in on["values"]) == (on["operator"] == "In"):
            return rule["action"], i
        for pattern in rule.get("onPodConditions") or []:
            if any(
                c["type"] == pattern["type"] and c["status"] == pattern.get("status", "True")
                for c in pod["status"].get("conditions") or []
            ):
                return rule["action"], i
    return "Count", None


def _failures(policy: dict | None, pods: list[dict]) -> tuple[int, tuple[str, str] | None]:
    """(failed pods counted against the backoff limit, the (reason, message) of a FailJob rule that matched)."""
    counted, verdict = 0, None
    for pod in pods:
        if (pod.get("status") or {}).get("phase") != "Failed":
            continue
        action, index = failure_action(policy, pod)
        if action == "FailJob":
            verdict = ("PodFailurePolicy", _failure_message(pod, action, index))
        elif action == "Count":
            counted += 1
    return counted, verdict


def _failure_message(pod: dict, action: str, index: int | None) -> str:
    meta = pod["metadata"]
    terminated = next(
        (cs for cs in pod["status"].get("containerStatuses") or [] if "terminated" in cs.get("state", {})), None
    )
    if terminated:
        code = terminated["state"]["terminated"]["exitCode"]
        return (
            f"Container {terminated['name']} for pod {meta['namespace']}/{meta['name']} failed with exit code "
            f"{code} matching {action} rule at index {index}"
        )
    return (
        f"Pod {meta['namespace']}/{meta['name']} has condition DisruptionTarget matching {action} rule at index {index}"
    )


class Controllers:
    """One pass of both controllers over the cluster's Jobs, Deployments and pods."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    async def step(self, pods: list[dict]) -> None:
        by_owner: dict[str, list[dict]] = {}
        for pod in pods:
            for ref in pod["metadata"].get("ownerReferences") or []:
                by_owner.setdefault(ref["uid"], []).append(pod)
        for job in await self.kube.list("Job", None):
            await self._job(job, by_owner.get(job["metadata"]["uid"], []))
        for dep in await self.kube.list("Deployment", None):
            await self._deployment(dep, by_owner.get(dep["metadata"]["uid"], []))

    # ------------------------------------------------------------------ Job controller

    async def _job(self, job: dict, pods: list[dict]) -> None:
        meta, spec = job["metadata"], job["spec"]
        if _cond(job, "Complete") or _cond(job, "Failed"):
            for pod in pods:
                if (pod.get("status") or {}).get("phase") in ("Pending", "Running"):
                    await self._delete_pod(pod)
            return
        active = [p for p in pods if (p.get("status") or {}).get("phase") in (None, "Pending", "Running")]
        status: dict[str, Any] = {"startTime": (job.get("status") or {}).get("startTime") or timestamp(now())}
        if spec.get("suspend"):
            for pod in active:
                await self._delete_pod(pod)
            status.update(
                active=0, ready=0, conditions=[{"type": "Suspended", "status": "True", "reason": "JobSuspended"}]
            )
            status.pop("startTime")  # a resumed Job starts again
            await self._job_status(job, status)
            return
        counted, verdict = _failures(spec.get("podFailurePolicy"), pods)
        succeeded = sum((p.get("status") or {}).get("phase") == "Succeeded" for p in pods)
        t = timestamp(now())
        if succeeded:
            status.update(
                completionTime=t,
                conditions=[
                    {
                        "type": "SuccessCriteriaMet",
                        "status": "True",
                        "reason": "CompletionsReached",
                        "lastTransitionTime": t,
                    },
                    {"type": "Complete", "status": "True", "reason": "CompletionsReached", "lastTransitionTime": t},
                ],
            )
        elif verdict or counted > int(spec.get("backoffLimit", 6)):
            reason, message = verdict or ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
            status["conditions"] = [
                {"type": "Failed", "status": "True", "reason": reason, "message": message, "lastTransitionTime": t}
            ]
        elif not active:
            # A NonIndexed Job's pod: no completion index, as the Job controller makes it.
            # Refused: reported in an Event, tried again at the next step, the Job's status unchanged.
            await self._create_pod(job, {label: meta["name"] for label in JOB_NAME_LABELS})
        ready = sum(
            1
            for p in active
            if any(
                c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or []
            )
        )
        status.update(
            active=len(active) if not status.get("conditions") else 0, ready=ready, succeeded=succeeded, failed=counted
        )
        await self._job_status(job, status)

    async def _job_status(self, job: dict, status: dict) -> None:
        current = job.get("status") or {}
        if all(current.get(k) == v for k, v in status.items()):
            return
        await self.kube.patch(
            "Job", job["metadata"]["namespace"], job["metadata"]["name"], {"status": status}, status=True
        )

    # ------------------------------------------------------------------ Deployment controller

    async def _deployment(self, dep: dict, pods: list[dict]) -> None:
        meta, spec = dep["metadata"], dep["spec"]
        template_hash = hashlib.sha256(json.dumps(spec["template"], sort_keys=True).encode()).hexdigest()[:10]
        replicas = int(spec.get("replicas", 1))
        live = [p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        current = [p for p in live if p["metadata"].get("labels", {}).get(HASH_LABEL) == template_hash]
        old = [p for p in live if p not in current]
        rolling = (spec.get("strategy") or {}).get("rollingUpdate") or {}
        surge, unavailable = int(rolling.get("maxSurge", 0)), max(1, int(rolling.get("maxUnavailable", 1)))
        for pod in old[:unavailable]:  # replace in place: an old pod goes before its successor starts
            await self._delete_pod(pod)
        room = replicas - len(current) - max(0, len(old) - unavailable - surge)
        refused = None
        for _ in range(max(0, room)):
            # Named as its ReplicaSet's pods are: <deployment>-<template hash>-<random>.
            refused = (
                await self._create_pod(dep, {HASH_LABEL: template_hash}, f"{meta['name']}-{template_hash}") or refused
            )
        for pod in current[replicas:]:
            await self._delete_pod(pod)

        def ready(p: dict) -> bool:
            return any(
                c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or []
            )

        ready_count = sum(ready(p) for p in live)
        updated_ready = sum(ready(p) for p in current)
        deadline = int(spec.get("progressDeadlineSeconds", 600))
        started = min((t for p in current if (t := parse_time(p["metadata"].get("creationTimestamp")))), default=None)
        if current and updated_ready >= replicas:
            progressing = {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}
        elif started and (now() - started).total_seconds() > deadline:
            progressing = {
                "type": "Progressing",
                "status": "False",
                "reason": "ProgressDeadlineExceeded",
                "message": f'ReplicaSet "{meta["name"]}-{template_hash}" has timed out progressing.',
            }
        else:
            progressing = {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}
        status = {
            "observedGeneration": meta.get("generation", 1),
            "replicas": len(live),
            "updatedReplicas": len(current),
            "readyReplicas": ready_count,
            "availableReplicas": ready_count,
            "conditions": [
                {
                    "type": "Available",
                    "status": str(ready_count >= max(1, replicas - unavailable) if replicas else True),
                },
                progressing,
            ],
        }
        if refused:  # what the deployment controller copies from its ReplicaSet (deployment/sync.go)
            status["conditions"].append(
                {"type": "ReplicaFailure", "status": "True", "reason": FAILED_CREATE, "message": refused}
            )
        if {k: (dep.get("status") or {}).get(k) for k in status} != status:
            await self.kube.patch("Deployment", meta["namespace"], meta["name"], {"status": status}, status=True)

    # ------------------------------------------------------------------ pods

    async def _create_pod(self, owner: dict, extra_labels: dict[str, str], prefix: str | None = None) -> str | None:
        """Create a pod of `owner`; when the API server refuses it, post the controllers' Warning
        Event on the owner and return the API server's message."""
        meta, template = owner["metadata"], owner["spec"]["template"]
        pod_meta = template.get("metadata") or {}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{(prefix or meta['name'])[:52]}-",
                "namespace": meta["namespace"],
                "labels": {**(pod_meta.get("labels") or {}), **extra_labels},
                "annotations": dict(pod_meta.get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": owner["apiVersion"],
                        "kind": owner["kind"],
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": template["spec"],
        }
        try:
            await self.kube.create(pod)
        except ApiError as e:
            if e.status not in (403, 422):
                raise
            await self._failed_create_event(owner, f"Error creating: {e.message}")
            return e.message
        return None

    async def _failed_create_event(self, owner: dict, message: str) -> None:
        """The controller's Warning Event on the owner; the same refusal again is the same Event
        (the API server's event correlator counts repeats instead of adding Events)."""
        meta = owner["metadata"]
        key = hashlib.sha256(f"{meta['uid']}/{message}".encode()).hexdigest()[:16]
        t = timestamp(now())
        controller = {"Job": "job-controller", "Deployment": "replicaset-controller"}.get(owner["kind"], "controller")
        try:
            await self.kube.create(
                {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"name": f"{meta['name']}.{key}", "namespace": meta["namespace"]},
                    "involvedObject": {
                        "apiVersion": owner["apiVersion"],
                        "kind": owner["kind"],
                        "name": meta["name"],
                        "namespace": meta["namespace"],
                        "uid": meta["uid"],
                    },
                    "type": "Warning",
                    "reason": FAILED_CREATE,
                    "message": message,
                    "count": 1,
                    "firstTimestamp": t,
                    "lastTimestamp": t,
                    "source": {"component": controller},
                }
            )
        except ApiError as e:
            if e.status != 409:
                raise

    async def _delete_pod(self, pod: dict) -> None:
        """Delete a pod; the node stops its process within the pod's grace period."""
        meta = pod["metadata"]
        await self.kube.delete("Pod", meta["namespace"], meta["name"])
