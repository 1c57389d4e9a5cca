"""The kopf handlers and the I/O around the pure lifecycles: one reconcile for every kind, read ->
plan -> read -> decide -> apply; what each kind reads and how it decides is declared beside its
lifecycle (`lifecycle.wiring`), and this module only carries it out.

Reconciles are level-based: any event of a CR or of one of its children (found through the
child's controller ownerReference) re-reads the CR and its children and lets the lifecycle
decide. Reconciles of one CR never overlap (a lock per CR). A reconcile that fails runs again
after a back-off (`retries`), whatever the CR's phase; a poller re-visits unfinished CRs, which
reads live training progress. The status is derived from the children observed on every
reconcile, so a status write that was lost is made good by the next one.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from gemma_operator import addons, api, failure_policy, pod_creation, prometheus_metrics, reasons, retries
from gemma_operator.children import common
from gemma_operator.clock import now
from gemma_operator.kinds import KINDS, where
from gemma_operator.kube import UNREAD, ApiError, Kube, status_patch
from gemma_operator.lifecycle.common import Decision
from gemma_operator.lifecycle.reads import AddOns, Found, Get, Listed, Pods, ProgressLog, Read, Refusal
from gemma_operator.lifecycle.wiring import LIFECYCLES, fine_tune_ref
from gemma_operator.settings import OperatorSettings
from gemma_workloads.config import Progress

log = logging.getLogger("gemma_operator")

COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
Seen = dict[tuple[str, str], dict | None]  # children read in this reconcile by (kind, name); None: absent
ACTIVE = (
    reasons.PENDING,
    reasons.TRAINING,
    reasons.MERGING,
    reasons.SUSPENDED,
    reasons.WAITING_FOR_MODEL,
    reasons.DEPLOYING,
)


class Controller:
    """Reconciles GemmaFineTunes and GemmaServes through the Kubernetes API."""

    def __init__(self, kube: Kube, settings: OperatorSettings, namespaces: list[str] | None = None) -> None:
        self.kube, self.settings, self.namespaces = kube, settings, namespaces or None
        self._locks: dict[tuple[str, str, str], asyncio.Lock] = collections.defaultdict(asyncio.Lock)
        self.tracker = prometheus_metrics.PhaseTracker()
        self.retries = retries.Retries()
        self.addons = addons.Detector(kube, settings.progress_poll_seconds)
        # The resourceVersion of each CR as read by its latest completed reconcile: whoever changed
        # a CR can tell when the operator has acted on that change, and on nothing older.
        self.reconciled: dict[tuple[str, str, str], str] = {}
        # ... and as that reconcile left it (its own status write's version, if it wrote one).
        self._latest: dict[tuple[str, str, str], str] = {}
        self.watched_children = WatchedChildren()
        self.broken: str | None = None  # why a background task died, if one did
        self.on_fatal: Callable[[], None] | None = None  # stops the operator (runner.py)

    def must_not_end(self, task: asyncio.Task) -> None:
        """A background task that ends, other than by being cancelled at shutdown, leaves the operator
        half alive: say so loudly, fail liveness, and stop the operator (`on_fatal`)."""
        if task.cancelled():
            return
        error = task.exception()
        self.broken = f"{task.get_name()} ended: {error!r}" if error else f"{task.get_name()} ended"
        log.critical("the operator stops: %s", self.broken, exc_info=error)
        if self.on_fatal is not None:
            self.on_fatal()

    def liveness(self) -> str:
        """kopf's liveness probe: fails once a task the operator needs has died (it then stops too)."""
        if self.broken:
            raise kopf.PermanentError(self.broken)
        return "ok"

    def forget(self, kind: str, namespace: str, name: str) -> None:
        self._locks.pop((kind, namespace, name), None)
        self.reconciled.pop((kind, namespace, name), None)
        self._latest.pop((kind, namespace, name), None)
        self.retries.forget((kind, namespace, name))
        self.tracker.forget(kind, namespace, name)

    async def reconcile(
        self,
        kind: str,
        namespace: str,
        name: str,
        body: dict | None = None,
        *,
        watched: Mapping[str, Any] | None = None,
    ) -> None:
        """Reconcile one CR; a failure is logged with the CR it concerns and retried after a back-off.
        `body` is the CR as just listed, when the caller has it: it saves a read, and is used only
        if it is the version this operator last read or wrote (otherwise it may be older).
        `watched` is the CR as a watch event delivered it: when that is only the echo of this
        operator's own last write, nothing changed that it has not decided on, and it is skipped."""
        key = (kind, namespace, name)
        started = time.perf_counter()
        try:
            async with self._locks[key]:
                if watched is not None and self._is_own_write(key, watched):
                    return
                if body is not None and not self._is_own_write(key, body):
                    body = None
                try:
                    version = await self._reconcile_one(kind, namespace, name, body)
                except ApiError as e:
                    if e.status not in (409, 422):
                        raise
                    # Another writer changed a child (409) or the CR's conditions (422, the status
                    # patch's test) between our read and our write: decide again on what it wrote,
                    # at once (a second conflict goes to the back-off).
                    log.info("%s %s/%s changed while reconciling, reading it again", kind, namespace, name)
                    version = await self._reconcile_one(kind, namespace, name, None)
        except Exception as e:  # any failure: logged, counted and retried
            if isinstance(e, ApiError) and e.status == 404 and await self._gone(kind, namespace, name):
                return  # the resource was deleted while being reconciled: nothing left to do
            prometheus_metrics.RECONCILES.labels(kind, "error").inc()
            wait = self.retries.failed(key, e, lambda: self.reconcile(kind, namespace, name))
            log.warning(
                "reconcile of %s %s/%s failed, retrying in %.1f s: %s",
                kind,
                namespace,
                name,
                wait,
                e,
                exc_info=not isinstance(e, ApiError),
            )
        else:
            self.retries.succeeded(key)
            if version:
                self.reconciled[key] = version[0]
                self._latest[key] = version[1]
            prometheus_metrics.RECONCILES.labels(kind, "ok").inc()
        finally:
            prometheus_metrics.RECONCILE_SECONDS.labels(kind).observe(time.perf_counter() - started)

    def _is_own_write(self, key: tuple[str, str, str], body: Mapping[str, Any]) -> bool:
        """Whether `body` is the CR as this operator's latest reconcile read or wrote it."""
        version = (body.get("metadata") or {}).get("resourceVersion")
        return version is not None and self._latest.get(key) == version

    async def _reconcile_one(self, kind: str, namespace: str, name: str, body: dict | None) -> tuple[str, str] | None:
        """Read, plan, read, view, decide, apply: the same for every kind (each kind's lifecycle
        says what to read and how, `lifecycle.wiring`). Returns the resourceVersion the CR was read
        at and the one its status write produced (the same when it wrote none)."""
        if body is None:
            body = await self.kube.get(kind, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        lifecycle, found = LIFECYCLES[kind], Found()
        await self._read_all(namespace, lifecycle.inputs(body), found)
        plan, problems = lifecycle.plan(body, found, self.settings)
        if plan is not None:
            await self._read_all(namespace, lifecycle.reads(body.get("status") or {}, plan), found)
        view = lifecycle.view(_observed(body, lifecycle.kind), body, plan, problems, found)
        decision = lifecycle.decide(view, self.settings)
        written = await self._apply(body, decision, found.objects())
        self.tracker.observe(kind, namespace, name, decision.status_model.phase)
        lifecycle.record(self.tracker, body, view, decision)
        read = body["metadata"]["resourceVersion"]
        return read, written or read

    async def _gone(self, kind: str, namespace: str, name: str) -> bool:
        try:
            return await self.kube.get(kind, namespace, name) is None
        except ApiError:
            return False

    # ------------------------------------------------------------------ reading

    async def _read_all(self, namespace: str, declared: list[Read[Any]], found: Found) -> None:
        """Each declared read in order, into `found` (a read may use what an earlier one found)."""
        for read in declared:
            found[read] = await self._read(namespace, read, found)

    async def _read(self, namespace: str, read: Read[Any], found: Found) -> Any:
        match read:
            case Get(kind, name):
                return await self.kube.get(kind, namespace, name)
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

    # ------------------------------------------------------------------ applying

    async def _apply(self, body: dict, d: Decision[Any], seen: Seen) -> str | None:
        """Write what the decision asks, children first. Its Events go before the status that
        records the phase change, so a failed reconcile (retried) posts them again, once. The
        status write tests the conditions the decision was made on: a condition another controller
        added meanwhile is never overwritten unseen (422, and the reconcile runs again at once).
        Returns the resourceVersion that write produced, if there was one."""
        meta = body["metadata"]
        namespace = meta["namespace"]
        for obj in d.delete:
            log.info("deleting %s %s/%s of an earlier run", obj["kind"], namespace, obj["metadata"]["name"])
            await self.kube.delete(obj["kind"], namespace, obj["metadata"]["name"])
        for obj in d.create:
            current = seen.get((obj["kind"], obj["metadata"]["name"]), UNREAD)
            if current is UNREAD:  # not read in this reconcile: as its watch last delivered it, if it did
                current = self.watched_children.get(obj["kind"], namespace, obj["metadata"]["name"])
            await self.kube.ensure(obj, KINDS[obj["kind"]].mutable or (), current)
        for kind, name, patch in d.patch:  # against the object as observed: a concurrent change answers 409
            observed = (seen.get((kind, name)) or {}).get("metadata", {}).get("resourceVersion")
            if observed:
                patch = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": observed}}
            await self.kube.patch(kind, namespace, name, patch)
        for type_, reason, message in d.events:
            try:
                await self.kube.event(body, type_, reason, message)
            except ApiError as e:
                if e.transient:
                    raise  # retried with the reconcile, before the status moves on
                log.warning("could not post event %s on %s %s/%s: %s", reason, body["kind"], namespace, meta["name"], e)
        before, after = body.get("status") or {}, d.status
        if before == after:
            return None
        ops = status_patch(before, after, meta["resourceVersion"])
        written = await self.kube.patch_json(body["kind"], namespace, meta["name"], ops, status=True)
        return written["metadata"]["resourceVersion"]

    # ------------------------------------------------------------------ polling

    async def poll(self, stop: asyncio.Event | None = None) -> None:
        """Re-visit unfinished CRs: live progress and chip-hours. While the API cannot be reached,
        that is logged once, the pause between polls doubles up to POLL_BACKOFF_CAP, and the first
        poll that works again says so."""
        outage = retries.Outage("the poller", log)
        while not (stop and stop.is_set()):
            await asyncio.sleep(outage.pause(self.settings.progress_poll_seconds))
            try:
                await self._poll_once()
            except ApiError as e:
                outage.failed(e)
            else:
                outage.recovered()

    async def _poll_once(self) -> None:
        for kind in (api.FINETUNE.kind, api.SERVE.kind):
            namespaces: list[str | None] = list(self.namespaces) if self.namespaces else [None]  # None: all
            for namespace in namespaces:
                for obj in await self.kube.list(kind, namespace):
                    st, meta = obj.get("status") or {}, obj["metadata"]
                    if st.get("phase") in ACTIVE or st.get("observedGeneration") != meta.get("generation"):
                        await self.reconcile(kind, meta["namespace"], meta["name"], obj)


class WatchedChildren:
    """The operator's children as their watches last delivered them, cut to what `Kube.ensure`
    compares: re-applying a child that no reconcile reads (a ConfigMap) costs no read. A copy older
    than the object makes ensure's patch answer 409, and the reconcile reads it again."""

    def __init__(self) -> None:
        self._objects: dict[tuple[str, str, str], dict] = {}

    def saw(self, event: str, body: Mapping[str, Any]) -> None:
        meta = body["metadata"]
        key = (body["kind"], meta["namespace"], meta["name"])
        if event == "DELETED":
            self._objects.pop(key, None)
            return
        kept = {k: meta[k] for k in ("name", "namespace", "labels", "annotations", "resourceVersion") if k in meta}
        self._objects[key] = {
            "metadata": kept,
            **{k: copy.deepcopy(body[k]) for k in ("spec", "data") if k in body},
        }

    def get(self, kind: str, namespace: str, name: str) -> dict | object:
        return self._objects.get((kind, namespace, name), UNREAD)


def owner_of(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the CR controlling a child, from its ownerReferences."""
    for ref in body["metadata"].get("ownerReferences") or []:
        if ref.get("controller") and ref.get("apiVersion") == api.API_VERSION and ref.get("kind") in api.KINDS:
            return ref["kind"], ref["name"]
    return None


def register(registry: kopf.OperatorRegistry, controller: Controller) -> None:  # noqa: C901  each handler it declares counts as its own branches
    """Declare the handlers on a registry (one per operator, so tests get fresh ones)."""
    managed = {"app.kubernetes.io/managed-by": common.MANAGED_BY}

    @kopf.index(api.GROUP, api.VERSION, api.SERVE.plural, id="serves_by_fine_tune", registry=registry)  # type: ignore[arg-type]  # kopf's protocol allows a None namespace (cluster-scoped kinds; ours are namespaced)
    def serves_by_fine_tune(spec: kopf.Spec, name: str, namespace: str, **_: Any) -> dict | None:
        ref = fine_tune_ref(spec)
        return {(namespace, ref): name} if ref else None

    @kopf.on.event(api.GROUP, api.VERSION, api.FINETUNE.plural, registry=registry)  # type: ignore[arg-type]  # kopf's protocol allows a None namespace (cluster-scoped kinds; ours are namespaced)
    async def fine_tune_event(
        type: str, body: kopf.Body, name: str, namespace: str, serves_by_fine_tune: kopf.Index, **_: Any
    ) -> None:
        if type == "DELETED":
            controller.forget(api.FINETUNE.kind, namespace, name)
        else:
            await controller.reconcile(api.FINETUNE.kind, namespace, name, watched=body)
        for serve in serves_by_fine_tune.get((namespace, name), []):
            await controller.reconcile(api.SERVE.kind, namespace, serve)

    @kopf.on.event(api.GROUP, api.VERSION, api.SERVE.plural, registry=registry)  # type: ignore[arg-type]  # kopf's protocol allows a None namespace (cluster-scoped kinds; ours are namespaced)
    async def serve_event(type: str, body: kopf.Body, name: str, namespace: str, **_: Any) -> None:
        if type == "DELETED":
            controller.forget(api.SERVE.kind, namespace, name)
            prometheus_metrics.benchmark(namespace, name, None)
        else:
            await controller.reconcile(api.SERVE.kind, namespace, name, watched=body)

    async def child_event(type: str, body: kopf.Body, namespace: str, **_: Any) -> None:
        owner = owner_of(body)
        if owner:
            controller.watched_children.saw(type, body)
            await controller.reconcile(owner[0], namespace, owner[1])

    for kind in where(wakes_owner=True):
        group, _, version = KINDS[kind].api_version.rpartition("/")
        kopf.on.event(
            group, version, KINDS[kind].plural, labels=managed, id=f"child-{KINDS[kind].plural}", registry=registry
        )(child_event)  # type: ignore[arg-type]  # kopf's protocol allows a None namespace (cluster-scoped kinds; ours are namespaced)

    @kopf.on.startup(registry=registry)
    async def start_poller(memo: kopf.Memo, **_: Any) -> None:
        memo.poller = asyncio.create_task(controller.poll(), name="the poller")
        memo.poller.add_done_callback(controller.must_not_end)

    @kopf.on.probe(id="background", registry=registry)
    def background(**_: Any) -> str:
        return controller.liveness()

    @kopf.on.cleanup(registry=registry)
    async def stop_poller(memo: kopf.Memo, **_: Any) -> None:
        memo.poller.cancel()
        controller.retries.cancel_all()


def _observed(body: dict, kind: api.Kind) -> dict[str, Any]:
    """The ResourceView fields every lifecycle reads off its resource."""
    meta = body["metadata"]
    return dict(
        name=meta["name"],
        namespace=meta["namespace"],
        generation=int(meta.get("generation") or 1),
        status=body.get("status") or {},
        owner=common.owner_reference(kind, meta["name"], meta["uid"]),
        now=now(),
    )
