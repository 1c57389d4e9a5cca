"""Carrying out the reads a lifecycle declares (`lifecycle.reads`), in order, each through the API
unless the reconcile already knows the answer (`Given`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gemma_operator import addons, failure_policy, pod_creation, reasons
from gemma_operator.kube import ApiError, Kube
from gemma_operator.lifecycle.reads import AddOns, Found, Get, Listed, Pods, ProgressLog, Read, Refusal
from gemma_workloads.config import Progress

COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


@dataclass
class Given:
    """What a reconcile knows of its children without reading them: the one a watch event just
    delivered, or, for a CR without a status, that none exists yet (those presumed are noted)."""

    child: Mapping[str, Any] | None = None
    presume_absent: bool = False
    presumed: set[tuple[str, str]] = field(default_factory=set)

    def absent(self, kind: str, name: str) -> bool:
        """Whether this child is presumed absent (it is then noted)."""
        if self.presume_absent:
            self.presumed.add((kind, name))
        return self.presume_absent

    def get(self, kind: str, namespace: str, name: str) -> tuple[bool, dict | None]:
        """(known, the object or None when absent) for a Get of this child."""
        if self.child is not None:
            meta = self.child["metadata"]
            if (self.child["kind"], meta["namespace"], meta["name"]) == (kind, namespace, name):
                return True, dict(self.child)
        return (True, None) if self.absent(kind, name) else (False, None)


class Reader:
    """The reads of one operator, against its API client and its add-on detector."""

    def __init__(self, kube: Kube, detector: addons.Detector) -> None:
        self.kube, self.addons = kube, detector

    async def read_all(
        self, namespace: str, declared: list[Read[Any]], found: Found, given: Given | None = None
    ) -> None:
        """Each declared read in order, into `found` (a read may use what an earlier one found)."""
        for read in declared:
            found[read] = await self._read(namespace, read, found, given or Given())

    async def _read(self, namespace: str, read: Read[Any], found: Found, given: Given) -> Any:
        match read:
            case Get(kind, name):
                known, obj = given.get(kind, namespace, name)
                return obj if known else await self.kube.get(kind, namespace, name)
            case Pods(owner, selector):
                return await self.kube.list("Pod", namespace, selector) if found[owner] is not None else []
            case ProgressLog(workload, pods, container):
                return await self._progress(found[workload], found[pods], container)
            case Refusal(workload, pods):
                return await self._refusal(found[workload], found[pods])
            case Listed(kinds, selector):
                return [
                    {**o, "kind": kind} for kind in kinds for o in await self._list_or_empty(kind, namespace, selector)
                ]
            case AddOns(wanted):
                return await self.addons.missing(dict(wanted))
        raise TypeError(f"no reader for {read!r}")

    async def _list_or_empty(self, kind: str, namespace: str, selector: str) -> list[dict]:
        try:
            return await self.kube.list(kind, namespace, selector)
        except ApiError as e:  # JobSet not installed: nothing of that kind can exist
            if e.status == 404:
                return []
            raise

    async def _refusal(self, workload: dict | None, pods: list[dict]) -> pod_creation.Refusal | None:
        """Why the API server refuses the workload's pods: the FailedCreate Events of its namespace
        are read only while it has fewer pods than it runs."""
        events = []
        if workload is not None and pod_creation.may_be_refused(workload, pods):
            events = await self._failed_create_events(workload["metadata"]["namespace"])
        return pod_creation.refusal(workload, pods, events)

    async def _failed_create_events(self, namespace: str) -> list[dict]:
        """The namespace's FailedCreate Warning Events, selected by the API server (`reason` and
        `type` are selectable fields of core/v1 Events: pkg/registry/core/event/strategy.go)."""
        return await self.kube.list(
            "Event", namespace, field_selector=f"reason={pod_creation.FAILED_CREATE},type=Warning"
        )

    async def _progress(self, workload: dict | None, pods: list[dict], container: str) -> Progress | None:
        """The latest progress line of the coordinating (index 0) pod's log, while the workload runs."""
        if workload is None or failure_policy.outcome(workload).state != reasons.RUNNING:
            return None
        running = [p for p in pods if (p.get("status") or {}).get("phase") == reasons.POD_RUNNING]
        running.sort(
            key=lambda p: (
                p["metadata"].get("labels", {}).get(COMPLETION_INDEX_LABEL, "0") != "0",
                p["metadata"].get("creationTimestamp", ""),
            )
        )
        if not running:
            return None
        pod = running[0]["metadata"]
        return Progress.last_in(await self.kube.pod_log(pod["namespace"], pod["name"], container, 20))
