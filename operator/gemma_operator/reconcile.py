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
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import kopf

from gemma_operator import addons, api, prometheus_metrics, reasons, retries
from gemma_operator.children import common
from gemma_operator.clock import now
from gemma_operator.kinds import KINDS, where
from gemma_operator.kube import UNREAD, ApiError, Kube, status_patch
from gemma_operator.lifecycle.common import Decision
from gemma_operator.lifecycle.reads import Found
from gemma_operator.lifecycle.wiring import LIFECYCLES, fine_tune_ref
from gemma_operator.observed import (
    DecidedVersions,
    Key,
    RecentPlans,
    WatchedChildren,
    only_its_status_changed,
    version_of,
)
from gemma_operator.reading import Given, Reader
from gemma_operator.settings import OperatorSettings

log = logging.getLogger("gemma_operator")

Seen = dict[tuple[str, str], dict | None]  # children read in this reconcile by (kind, name); None: absent
ACTIVE = (
    reasons.PENDING,
    reasons.TRAINING,
    reasons.MERGING,
    reasons.SUSPENDED,
    reasons.WAITING_FOR_MODEL,
    reasons.DEPLOYING,
)


class Outcome(NamedTuple):
    """What a completed reconcile decided on: the CR's version it read, the CR's versions it holds
    nothing new in (that one and its own status write's), the children as it read or wrote them."""

    read: str
    decided: tuple[str, ...]
    children: list[dict]


class Controller:
    """Reconciles GemmaFineTunes and GemmaServes through the Kubernetes API."""

    def __init__(self, kube: Kube, settings: OperatorSettings, namespaces: list[str] | None = None) -> None:
        self.kube, self.settings, self.namespaces = kube, settings, namespaces or None
        self._locks: dict[tuple[str, str, str], asyncio.Lock] = collections.defaultdict(asyncio.Lock)
        self.tracker = prometheus_metrics.PhaseTracker()
        self.retries = retries.Retries()
        self.addons = addons.Detector(kube, settings.progress_poll_seconds)
        self.reader = Reader(kube, self.addons)
        # The resourceVersion of each CR as read by its latest completed reconcile: whoever changed
        # a CR can tell when the operator has acted on that change, and on nothing older.
        self.reconciled: dict[Key, str] = {}
        # The resourceVersion of each CR that its latest handled watch event delivered, whether skipped as
        # an echo or reconciled: whoever wrote a CR can tell when the operator has seen that write.
        self.handled: dict[Key, str] = {}
        # What completed reconciles decided on (the CRs' versions, the children's), and the plans
        # they made: an event that brings nothing new is skipped (observed.py).
        self.versions = DecidedVersions()
        self.watched_children = WatchedChildren()
        self.plans: RecentPlans[tuple[Any, list[str]]] = RecentPlans()
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
        self.handled.pop((kind, namespace, name), None)
        self.versions.forget((kind, namespace, name))
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
        child: Mapping[str, Any] | None = None,
    ) -> None:
        """Reconcile one CR; a failure is logged with the CR it concerns and retried after a back-off.
        `body` is the CR as just listed, when the caller has it: it saves a read, and is used only
        if it is the version this operator last read or wrote (otherwise it may be older).
        `watched` is the CR as a watch event delivered it, `child` one of its children so: a version
        a completed reconcile already decided on (the echo of the operator's own write) is skipped.
        Otherwise the child is what this reconcile reads of it, and the CR, the first time this
        process reconciles it, is taken as watched (it cannot lack a write this process made)."""
        key = (kind, namespace, name)
        started = time.perf_counter()
        try:
            async with self._locks[key]:
                if self._nothing_new(key, watched, child):
                    return
                given = self._given_body(key, body, watched)
                self.versions.touch(key)
                try:
                    outcome = await self._reconcile_one(kind, namespace, name, given, child)
                except ApiError as e:
                    if e.status not in (409, 422):
                        raise
                    # Another writer changed a child (409) or the CR's conditions (422, the status
                    # patch's test) between our read and our write, or a child presumed absent
                    # exists (409): decide again on what is there, read afresh, at once (a second
                    # conflict goes to the back-off).
                    log.info("%s %s/%s changed while reconciling, reading it again", kind, namespace, name)
                    outcome = await self._reconcile_one(kind, namespace, name, None, None, fresh=True)
        except Exception as e:  # any failure: logged, counted and retried
            if isinstance(e, ApiError) and e.status == 404 and await self._gone(kind, namespace, name):
                self.forget(kind, namespace, name)  # deleted while being reconciled: nothing left to do
                return
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
            self._completed(key, outcome)
            prometheus_metrics.RECONCILES.labels(kind, "ok").inc()
        finally:
            prometheus_metrics.RECONCILE_SECONDS.labels(kind).observe(time.perf_counter() - started)
            if watched is not None and (version := version_of(watched)) and key in self._locks:
                self.handled[key] = version

    def _completed(self, key: Key, outcome: Outcome | None) -> None:
        """Keep what a completed reconcile decided on; of a CR gone or going (a child's last events
        still wake it), nothing."""
        if outcome:
            self.reconciled[key] = outcome.read
            self.versions.add(key, *outcome.decided)
            self.watched_children.decide(outcome.children)
        else:
            self.forget(*key)

    def _nothing_new(self, key: Key, watched: Mapping[str, Any] | None, child: Mapping[str, Any] | None) -> bool:
        """Whether the event brings a version that a completed reconcile already decided on."""
        if watched is not None and self.versions.decided(key, watched):
            return True
        return child is not None and self.watched_children.decided(child)

    def _given_body(self, key: Key, body: dict | None, watched: Mapping[str, Any] | None) -> dict | None:
        """The CR as the caller has it, when it may stand for a read: as listed, if it is the CR as
        the latest reconcile left it; as watched, if no reconcile of it ever began in this process."""
        if body is not None and self.versions.latest(key, body):
            return body
        if watched is not None and not self.versions.knows(key):
            return dict(watched)
        return None

    async def _reconcile_one(
        self, kind: str, namespace: str, name: str, body: dict | None, child: Mapping[str, Any] | None, fresh=False
    ) -> Outcome | None:
        """Read, plan, read, view, decide, apply: the same for every kind (each kind's lifecycle
        says what to read and how, `lifecycle.wiring`). A CR without a status has no children yet
        (the operator writes its status with its first children): unless `fresh`, they are not
        read, and a create that finds one there after all answers 409 and the reconcile runs
        again, reading everything. `child` is a child as its watch just delivered it."""
        if body is None:
            body = await self.kube.get(kind, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        lifecycle, found = LIFECYCLES[kind], Found()
        await self.reader.read_all(namespace, lifecycle.inputs(body), found)
        key = lifecycle.plan_key(body, found)
        plan, problems = self.plans.get(key, lambda: lifecycle.plan(body, found, self.settings))
        given = Given(child, presume_absent=not fresh and not body.get("status"))
        if plan is not None:
            await self.reader.read_all(namespace, lifecycle.reads(body.get("status") or {}, plan), found, given)
        view = lifecycle.view(_observed(body, lifecycle.kind), body, plan, problems, found)
        decision = lifecycle.decide(view, self.settings)
        written, children = await self._apply(body, decision, found.objects(), given)
        self.tracker.observe(kind, namespace, name, decision.status_model.phase)
        lifecycle.record(self.tracker, body, view, decision)
        read = body["metadata"]["resourceVersion"]
        children += [o for o in found.objects().values() if o is not None and KINDS[o["kind"]].mutable is not None]
        return Outcome(read, (read, written) if written else (read,), children)

    async def _gone(self, kind: str, namespace: str, name: str) -> bool:
        try:
            return await self.kube.get(kind, namespace, name) is None
        except ApiError:
            return False

    # ------------------------------------------------------------------ applying

    async def _apply(self, body: dict, d: Decision[Any], seen: Seen, given: Given) -> tuple[str | None, list[dict]]:
        """Write what the decision asks, children first. Its Events go before the status that
        records the phase change, so a failed reconcile (retried) posts them again, once. Returns
        the version the status write produced, when it is decided on (`_write_status`), and the
        children as written or found in place."""
        namespace = body["metadata"]["namespace"]
        children = []
        for obj in d.delete:
            log.info("deleting %s %s/%s of an earlier run", obj["kind"], namespace, obj["metadata"]["name"])
            await self.kube.delete(obj["kind"], namespace, obj["metadata"]["name"])
        for obj in d.create:
            children.append(await self._ensure(namespace, obj, seen, given))
        for kind, name, patch in d.patch:  # against the object as observed: a concurrent change answers 409
            observed = (seen.get((kind, name)) or {}).get("metadata", {}).get("resourceVersion")
            if observed:
                patch = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": observed}}
            children.append(await self.kube.patch(kind, namespace, name, patch))
        for type_, reason, message in d.events:
            try:
                await self.kube.event(body, type_, reason, message)
            except ApiError as e:
                if e.transient:
                    raise  # retried with the reconcile, before the status moves on
                log.warning(
                    "could not post event %s on %s %s/%s: %s",
                    reason,
                    body["kind"],
                    namespace,
                    body["metadata"]["name"],
                    e,
                )
        return await self._write_status(body, d), children

    async def _ensure(self, namespace: str, obj: dict, seen: Seen, given: Given) -> dict:
        """A child created or re-applied where it differs from what is there: as read in this
        reconcile, else as its watch last delivered it, else as read now. One presumed absent is
        created, and a 409 says it was there after all (the reconcile then runs again)."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        current = seen.get((kind, name), UNREAD)
        if current is UNREAD:
            current = self.watched_children.get(kind, namespace, name, UNREAD)
        if current is UNREAD and given.absent(kind, name):
            current = None
        try:
            presumed = (kind, name) in given.presumed
            return await self.kube.ensure(obj, KINDS[kind].mutable or (), current, presumed=presumed)
        except ApiError as e:
            if e.status == 404:  # patched from a copy of a child since deleted: read it next time
                self.watched_children.gone(kind, namespace, name)
            raise

    async def _write_status(self, body: dict, d: Decision[Any]) -> str | None:
        """The status decided, as a JSON patch that tests the conditions the decision was made on:
        a condition another controller added meanwhile is never overwritten unseen (422, and the
        reconcile runs again at once). Returns the version it produced when the CR holds nothing
        else new (`observed.only_its_status_changed`): the echo of that write is then skipped."""
        meta = body["metadata"]
        before, after = body.get("status") or {}, d.status
        if before == after:
            return None
        ops = status_patch(before, after, meta["resourceVersion"])
        written = await self.kube.patch_json(body["kind"], meta["namespace"], meta["name"], ops, status=True)
        return written["metadata"]["resourceVersion"] if only_its_status_changed(body, written, after) else None

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


def owner_of(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the CR controlling a child, from its ownerReferences."""
    for ref in body["metadata"].get("ownerReferences") or []:
        if ref.get("controller") and ref.get("apiVersion") == api.API_VERSION and ref.get("kind") in api.KINDS:
            return ref["kind"], ref["name"]
    return None


def register(registry: kopf.OperatorRegistry, controller: Controller) -> None:  # noqa: C901  each handler it declares counts as its own branches
    """Declare the handlers on a registry (one per operator, so tests get fresh ones)."""

    @kopf.index(api.GROUP, api.VERSION, api.SERVE.plural, id="serves_by_fine_tune", registry=registry)  # type: ignore[arg-type]  # kopf's protocol allows a None namespace (cluster-scoped kinds; ours are namespaced)
    async def serves_by_fine_tune(spec: kopf.Spec, name: str, namespace: str, **_: Any) -> dict | None:
        # async: kopf runs a sync handler in a thread of its executor, a hop per event for a dict
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
            child = None if type == "DELETED" else body
            await controller.reconcile(owner[0], namespace, owner[1], child=child)

    # Children are told by their controller ownerReference, not by a label: a child whose labels
    # someone removed is still seen (its copy kept up to date, its owner woken to put them back).
    for kind in where(wakes_owner=True):
        group, _, version = KINDS[kind].api_version.rpartition("/")
        on_child = kopf.on.event(
            group, version, KINDS[kind].plural, id=f"child-{KINDS[kind].plural}", registry=registry
        )
        on_child(child_event)  # type: ignore[arg-type]  # kopf's protocol allows a None namespace (cluster-scoped kinds; ours are namespaced)

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
