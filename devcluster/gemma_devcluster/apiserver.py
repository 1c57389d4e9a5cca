"""An in-process Kubernetes API for tests and `gemma-tpu dev`: kmock's scaffold plus state.

kmock (by kopf's author) serves discovery and Kubernetes-shaped errors over real HTTP; its stock
emulator lacks what kopf and a real operator rely on. This store adds, as the API server does:
uid, resourceVersion, generation, timestamps and generateName; atomic list-then-watch with resume
from a resourceVersion (410 Gone when too old); a status subresource split from the main
resource; JSON patch (with `test`) and merge patch; optimistic concurrency; label and field
selectors; finalizers and garbage collection of owned objects; defaulting, pruning and schema
validation of custom resources from their CRD; ServiceAccount admission of pods (with the
`default` ServiceAccount the serviceaccount controller keeps in every namespace); pod logs; and
discovery and server-side tables in the shapes kubectl relies on. Every request is recorded as
(verb, group, resource), and per User-Agent as a `Call` (with namespace and name), so tests can
check RBAC against what the operator really calls, and not what the test itself calls.

The request handlers are one class over one store, so they stay together; the API server's rules
that need no store (selectors, patches, schemas, tables) are in `semantics.py`.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, NamedTuple, cast

import attrs
import jsonpatch
import kmock
import yaml

from gemma_devcluster.semantics import (
    Kind,
    default_job_selector,
    error,
    field_selector_matches,
    label_selector_matches,
    merge_patch,
)
from gemma_operator import crd, object_meta
from gemma_operator.clock import now, timestamp

HISTORY = 50_000  # watch events kept for resuming
OPENAPI_V3 = "/openapi/v3/apis/"
SUBRESOURCE_VERBS = {"status": ["get", "patch", "update"], "scale": ["get", "patch", "update"], "log": ["get"]}
IN_CATEGORY_ALL = {"pods", "services", "deployments", "jobs", "horizontalpodautoscalers"}
# Server-side printing of built-in kinds: the API server's own columns, as (name, type, JSON path).
_AGE = ("Age", "date", ".metadata.creationTimestamp")
BUILTIN_COLUMNS = {
    kind: [{"name": n, "type": t, "jsonPath": p} for n, t, p in columns]
    for kind, columns in {
        "Pod": [
            ("Status", "string", ".status.phase"),
            ("Restarts", "integer", ".status.containerStatuses[0].restartCount"),
            _AGE,
        ],
        "Job": [
            ("Active", "integer", ".status.active"),
            ("Succeeded", "integer", ".status.succeeded"),
            ("Failed", "integer", ".status.failed"),
            _AGE,
        ],
        "Deployment": [
            ("Ready", "integer", ".status.readyReplicas"),
            ("Up-to-date", "integer", ".status.updatedReplicas"),
            ("Available", "integer", ".status.availableReplicas"),
            _AGE,
        ],
        "Service": [("Type", "string", ".spec.type"), ("Cluster-IP", "string", ".spec.clusterIP"), _AGE],
        "Event": [
            ("Type", "string", ".type"),
            ("Reason", "string", ".reason"),
            ("Object", "string", ".involvedObject.name"),
            ("Message", "string", ".message"),
        ],
    }.items()
}

# The watch event of a resourceVersion too old to resume from: the client lists again.
EXPIRED = {
    "type": "ERROR",
    "object": {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": 410,
        "reason": "Expired",
        "message": "too old resource version",
    },
}


def write_kubeconfig(path: Path, url: str) -> Path:
    """A kubeconfig for this API at `url` (kubectl, clients, an operator process), namespace default."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "gemma-dev",
                "clusters": [{"name": "gemma-dev", "cluster": {"server": url.rstrip("/")}}],
                "contexts": [
                    {"name": "gemma-dev", "context": {"cluster": "gemma-dev", "user": "dev", "namespace": "default"}}
                ],
                "users": [{"name": "dev", "user": {"token": "dev"}}],
            }
        )
    )
    return path


# The characters the API server draws a generated name's suffix from (k8s.io/apimachinery
# pkg/util/rand: no vowels, no 0, 1 or 3, so that no word is spelt by chance).
NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def generated_name(prefix: str) -> str:
    """A name from generateName as the API server makes it: the prefix cut to 58 characters, then 5 random ones."""
    suffix = "".join(secrets.choice(NAME_SUFFIX_ALPHABET) for _ in object_meta.GENERATED_STAND_IN)
    return prefix[: object_meta.GENERATED_PREFIX] + suffix


class Call(NamedTuple):
    """One request as RBAC sees it; namespace None is cluster-wide, name None a collection."""

    verb: str
    group: str
    resource: str
    namespace: str | None
    name: str | None


# ---------------------------------------------------------------------------- the server


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesScaffold):
    """The stateful API. `objects` is keyed by (resource, namespace, name)."""

    objects: dict[tuple[kmock.resource, str | None, str | None], dict[str, Any]] = attrs.field(factory=dict, init=False)
    pod_logs: dict[tuple[str | None, str | None], str] = attrs.field(factory=dict, init=False)
    calls: collections.Counter = attrs.field(factory=collections.Counter, init=False)
    calls_by_agent: dict[str, collections.Counter] = attrs.field(
        factory=lambda: collections.defaultdict(collections.Counter), init=False
    )
    # Every write, in order, as (monotonic time, User-Agent, Call): who wrote when.
    writes: collections.deque[tuple[float, str, Call]] = attrs.field(
        factory=lambda: collections.deque(maxlen=100_000), init=False
    )
    _kinds: dict[kmock.resource, Kind] = attrs.field(factory=dict, init=False)
    _verbs: dict[Any, Any] = attrs.field(factory=dict, init=False)
    _rv: int = attrs.field(default=1, init=False)
    _lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    _history: collections.deque = attrs.field(factory=lambda: collections.deque(maxlen=HISTORY), init=False)
    _history_from: int = attrs.field(default=0, init=False)  # no watch resumes from an older resourceVersion
    _watchers: dict[kmock.resource, set[asyncio.Queue]] = attrs.field(
        factory=lambda: collections.defaultdict(set), init=False
    )

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._verbs = {
            kmock.action.LIST: self._list,
            kmock.action.WATCH: self._watch,
            kmock.action.FETCH: self._fetch,
            kmock.action.CREATE: self._create,
            kmock.action.UPDATE: self._patch,
            kmock.action.DELETE: self._delete,
        }

    async def _handle(self, request: kmock.Request) -> Any:
        """Resource requests go straight to the store; kmock's general-purpose matching of
        reactions (about 16 ms a request) serves discovery only. kmock also keeps every request
        it served: keep the last few, or a long-running cluster grows without bound."""
        del self._requests[:-1000]
        handler = (
            self._verbs.get(request.action)
            if request.resource is not None and request.resource in self._kinds
            else None
        )
        if request.method == kmock.method.POST and request.subresource == "binding" and request.name:
            handler = self._bind
        if handler is None and request.url.path.startswith(OPENAPI_V3):
            return await kmock.Response(payload=self._openapi(request.url.path.removeprefix(OPENAPI_V3)))(request)
        if handler is None:
            return await super()._handle(request)
        result = handler(request)
        if not hasattr(result, "__aiter__"):  # watches stream; every other verb answers once
            result = await result
        response = result if isinstance(result, kmock.Response) else kmock.Response(payload=result)
        return await response(request)

    # ------------------------------------------------------------------ registry

    def register(
        self,
        group_version: str,
        plural: str,
        kind: str,
        *,
        namespaced: bool = True,
        subresources: AbstractSet[str] = frozenset(),
        schema: dict | None = None,
        short_names: AbstractSet[str] = frozenset(),
        categories: AbstractSet[str] = frozenset(),
        columns: list[dict] | None = None,
    ) -> None:
        group, _, version = group_version.rpartition("/")
        res = kmock.resource(group, version, plural)
        self.resources[res] = kmock.ResourceInfo(
            kind=kind,
            namespaced=namespaced,
            singular=kind.lower(),
            subresources=set(subresources),
            verbs={"get", "list", "watch", "create", "patch", "delete"},
            shortnames=set(short_names),
            categories=set(categories),
        )
        self._kinds[res] = Kind(res, kind, namespaced, set(subresources), schema, list(columns or []))

    def unregister(self, group_version: str, plural: str) -> None:
        """Take a kind out of discovery and the store, as a cluster without that add-on."""
        group, _, version = group_version.rpartition("/")
        res = kmock.resource(group, version, plural)
        self.resources.pop(res, None)
        self._kinds.pop(res, None)

    def _openapi(self, group_version: str) -> dict[str, Any]:
        """The OpenAPI v3 document of a group-version, from the schemas its kinds were registered with."""
        schemas = {
            f"{k.resource.group}.{k.resource.version}.{k.kind}": k.schema
            for k in self._kinds.values()
            if k.schema and f"{k.resource.group}/{k.resource.version}" == group_version
        }
        if not schemas:
            raise error(404, "NotFound", f"no OpenAPI v3 document for {group_version}")
        return {"openapi": "3.0.0", "components": {"schemas": schemas}}

    def register_crd(self, definition: dict[str, Any]) -> None:
        spec = definition["spec"]
        version = spec["versions"][0]
        self.register(
            f"{spec['group']}/{version['name']}",
            spec["names"]["plural"],
            spec["names"]["kind"],
            namespaced=spec["scope"] == "Namespaced",
            subresources=set(version.get("subresources", {})),
            schema=version["schema"]["openAPIV3Schema"],
            short_names=set(spec["names"].get("shortNames", [])),
            categories=set(spec["names"].get("categories", [])),
            columns=version.get("additionalPrinterColumns"),
        )

    def register_defaults(self) -> None:
        """Built-in kinds the operator touches, the JobSet/LWS/monitoring kinds, and our CRDs."""
        for gv, plural, kind, subs, short in [
            ("v1", "pods", "Pod", {"status", "log", "binding"}, {"po"}),
            ("v1", "nodes", "Node", {"status"}, {"no"}),
            ("v1", "configmaps", "ConfigMap", set(), {"cm"}),
            ("v1", "secrets", "Secret", set(), set()),
            ("v1", "services", "Service", {"status"}, {"svc"}),
            ("v1", "events", "Event", set(), {"ev"}),
            ("v1", "serviceaccounts", "ServiceAccount", set(), {"sa"}),
            ("v1", "namespaces", "Namespace", {"status"}, {"ns"}),
            ("events.k8s.io/v1", "events", "Event", set(), {"ev"}),
            ("batch/v1", "jobs", "Job", {"status"}, set()),
            ("apps/v1", "deployments", "Deployment", {"status", "scale"}, {"deploy"}),
            ("autoscaling/v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", {"status"}, {"hpa"}),
            ("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget", {"status"}, {"pdb"}),
            ("coordination.k8s.io/v1", "leases", "Lease", set(), set()),
            ("jobset.x-k8s.io/v1alpha2", "jobsets", "JobSet", {"status"}, set()),
            ("leaderworkerset.x-k8s.io/v1", "leaderworkersets", "LeaderWorkerSet", {"status", "scale"}, {"lws"}),
            ("monitoring.coreos.com/v1", "podmonitors", "PodMonitor", set(), {"pmon"}),
            ("monitoring.googleapis.com/v1", "podmonitorings", "PodMonitoring", {"status"}, set()),
            ("monitoring.coreos.com/v1", "servicemonitors", "ServiceMonitor", set(), {"smon"}),
            (
                "apiextensions.k8s.io/v1",
                "customresourcedefinitions",
                "CustomResourceDefinition",
                {"status"},
                {"crd", "crds"},
            ),
        ]:
            cluster_scoped = plural in ("namespaces", "nodes", "customresourcedefinitions")
            self.register(
                gv,
                plural,
                kind,
                namespaced=not cluster_scoped,
                subresources=subs,
                short_names=short,
                categories={"all"} if plural in IN_CATEGORY_ALL else set(),
                columns=BUILTIN_COLUMNS.get(kind),
            )
        for definition in crd.all_crds():
            self.register_crd(definition)

    async def _serve_version(self, request: kmock.Request) -> dict[str, Any]:
        """Discovery as the API server gives it: the core group is plain `v1`, and subresources
        carry their own verbs and no short names (kubectl warns of ambiguity otherwise)."""
        payload = cast(dict[str, Any], await super()._serve_version(request))  # kmock's discovery: JSON
        res = request.resource
        assert res is not None  # a discovery URL names its group and version
        payload["groupVersion"] = f"{res.group}/{res.version}" if res.group else res.version
        for entry in payload["resources"]:
            if "/" in entry["name"]:
                entry.update(
                    shortNames=[], categories=[], verbs=SUBRESOURCE_VERBS.get(entry["name"].split("/")[1], ["get"])
                )
        return payload

    def restart_watch_cache(self) -> None:
        """Forget the watch history, as a restarted kube-apiserver's watch cache starts from the current
        resourceVersion: a watch resuming from an older one gets 410 Gone and must list again."""
        self._history.clear()
        self._history_from = self._rv

    def _kind(self, res: kmock.resource | None) -> Kind:
        if res is None or res not in self._kinds:
            raise kmock.KubernetesResourceNotFoundError()
        return self._kinds[res]

    # ------------------------------------------------------------------ helpers

    def _record(self, verb: str, request: kmock.Request) -> None:
        res = self._kind(request.resource).resource
        sub = f"/{request.subresource}" if request.subresource else ""
        call = (verb, res.group or "", f"{res.plural}{sub}")
        self.calls[call] += 1
        agent = request.headers.get("User-Agent", "")
        self.calls_by_agent[agent][Call(*call, request.namespace, request.name)] += 1
        if verb in ("create", "patch", "delete"):
            self.writes.append((time.monotonic(), agent, Call(*call, request.namespace, request.name)))

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _emit(self, res: kmock.resource, type_: str, obj: dict[str, Any]) -> None:
        event: dict[str, Any] = {"type": type_, "object": copy.deepcopy(obj)}
        self._history.append((int(obj["metadata"]["resourceVersion"]), res, event))
        for queue in self._watchers[res]:
            queue.put_nowait(event)

    @staticmethod
    def _matches(request: kmock.Request, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata", {})
        if request.namespace is not None and meta.get("namespace") != request.namespace:
            return False
        if request.name is not None and meta.get("name") != request.name:
            return False
        params = request.params
        return label_selector_matches(params.get("labelSelector"), meta.get("labels") or {}) and (
            field_selector_matches(params.get("fieldSelector"), obj)
        )

    def _get(self, request: kmock.Request) -> dict[str, Any]:
        res = self._kind(request.resource).resource
        obj = self.objects.get((res, request.namespace, request.name))
        if obj is None:
            raise error(404, "NotFound", f'{res.plural} "{request.name}" not found')
        return obj

    # ------------------------------------------------------------------ verbs

    async def _list(self, request: kmock.Request) -> dict[str, Any]:
        kind = self._kind(request.resource)
        self._record("list", request)
        async with self._lock:
            items = [
                copy.deepcopy(o)
                for (r, _, _), o in self.objects.items()
                if r == kind.resource and self._matches(request, o)
            ]
            rv = str(self._rv)
        if "as=Table" in (request.headers.get("Accept") or ""):
            return kind.table(items, rv)
        return {
            "apiVersion": kind.resource.group and f"{kind.resource.group}/{kind.resource.version}" or "v1",
            "kind": f"{kind.kind}List",
            "metadata": {"resourceVersion": rv},
            "items": items,
        }

    async def _watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        kind = self._kind(request.resource)
        self._record("watch", request)
        yield b""  # send the headers now: a watch may stay silent for long
        queue: asyncio.Queue = asyncio.Queue()
        since = request.params.get("resourceVersion")
        initial: list[dict[str, Any]]
        async with self._lock:  # the snapshot and the subscription are one step: nothing is lost
            if since in (None, "", "0"):
                initial = [
                    {"type": "ADDED", "object": copy.deepcopy(o)}
                    for (r, _, _), o in self.objects.items()
                    if r == kind.resource and self._matches(request, o)
                ]
            else:
                oldest = self._history[0][0] if self._history else self._rv
                full = len(self._history) == self._history.maxlen
                if int(since) < self._history_from or (int(since) < oldest - 1 and full):
                    initial = [copy.deepcopy(EXPIRED)]
                else:
                    initial = [
                        e
                        for rv, r, e in self._history
                        if rv > int(since) and r == kind.resource and self._matches(request, e["object"])
                    ]
            self._watchers[kind.resource].add(queue)
        timeout = self._watch_timeout(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        try:
            for event in initial:
                yield event
            if initial and initial[0]["type"] == "ERROR":
                return
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return
                try:
                    event = await asyncio.wait_for(queue.get(), remaining)
                except TimeoutError:
                    return
                if self._matches(request, event["object"]):
                    yield event
        finally:
            self._watchers[kind.resource].discard(queue)

    def _watch_timeout(self, request: kmock.Request) -> float | None:
        """Seconds this watch stays open: the client's timeoutSeconds, if any."""
        return float(request.params.get("timeoutSeconds") or 0) or None

    async def _fetch(self, request: kmock.Request) -> Any:
        self._kind(request.resource)
        if request.subresource == "log":
            self._record("get", request)
            async with self._lock:
                self._get(request)
                text = self.pod_logs.get((request.namespace, request.name), "")
            tail = request.params.get("tailLines")
            if tail:
                text = "\n".join(text.splitlines()[-int(tail) :]) + ("\n" if text.endswith("\n") else "")
            return kmock.Response(payload=text.encode(), headers={"Content-Type": "text/plain"})
        self._record("get", request)
        async with self._lock:
            return copy.deepcopy(self._get(request))

    async def _create(self, request: kmock.Request) -> Any:
        kind = self._kind(request.resource)
        self._record("create", request)
        obj = copy.deepcopy(request.data)
        if not isinstance(obj, dict):
            raise error(400, "BadRequest", "the body must be a JSON object")
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            meta["namespace"] = request.namespace or meta.get("namespace") or "default"
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise error(422, "Invalid", "metadata.name or metadata.generateName is required")
            meta["name"] = generated_name(meta["generateName"])
        if "status" in kind.subresources:
            obj.pop("status", None)
        if kind.kind == "Pod" and kind.resource.group == "":
            obj["status"] = {"phase": "Pending"}  # as the API server's pod strategy starts every pod
        obj = kind.admit(obj, strict=_strict(request))
        meta = obj["metadata"]
        async with self._lock:
            key = (kind.resource, meta.get("namespace"), meta["name"])
            if key in self.objects:
                raise error(409, "AlreadyExists", f'{kind.resource.plural} "{meta["name"]}" already exists')
            if kind.kind == "Pod" and kind.resource.group == "":
                self._admit_service_account(obj, meta.get("generateName"))
            dry_run = request.params.get("dryRun") == "All"  # admitted and answered, never stored
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=timestamp(now()), generation=1)
            meta["resourceVersion"] = "" if dry_run else self._next_rv()
            obj["metadata"] = meta
            if kind.resource.group == "batch" and kind.kind == "Job":
                default_job_selector(obj)
            if dry_run:
                return kmock.Response(status=201, payload=copy.deepcopy(obj))
            self.objects[key] = obj
            self._emit(kind.resource, "ADDED", obj)
            return kmock.Response(status=201, payload=copy.deepcopy(obj))

    async def _bind(self, request: kmock.Request) -> Any:
        """POST pods/NAME/binding: a scheduler assigns the pod to a node, once (kube-apiserver's
        pkg/registry/core/pod/storage: spec.nodeName set, and the PodScheduled condition True)."""
        self._record("create", request)
        target = ((request.data or {}) if isinstance(request.data, dict) else {}).get("target") or {}
        async with self._lock:
            pod = self._get(request)
            if pod["spec"].get("nodeName"):
                raise error(
                    409, "Conflict", f'pod {request.name} is already assigned to node "{pod["spec"]["nodeName"]}"'
                )
            pod = copy.deepcopy(pod)
            pod["spec"]["nodeName"] = target.get("name")
            status = pod.setdefault("status", {})
            scheduled = {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": timestamp(now()),
            }
            status["conditions"] = [c for c in status.get("conditions") or [] if c["type"] != "PodScheduled"] + [
                scheduled
            ]
            pod["metadata"]["resourceVersion"] = self._next_rv()
            key = (self._kind(request.resource).resource, request.namespace, request.name)
            self.objects[key] = pod
            self._emit(key[0], "MODIFIED", pod)
        return kmock.Response(
            status=201, payload={"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
        )

    def _admit_service_account(self, pod: dict[str, Any], generate_name: str | None) -> None:
        """ServiceAccount admission (kube-apiserver's plugin/pkg/admission/serviceaccount): a pod
        names `default` when it names none, and is refused (403 Forbidden) when its ServiceAccount
        does not exist. The message is the API server's: it names the pod (its generateName while it
        has no name yet), as Job and ReplicaSet controllers then repeat it in their FailedCreate Events."""
        meta, spec = pod["metadata"], pod.setdefault("spec", {})
        namespace = meta["namespace"]
        account = spec["serviceAccountName"] = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
        if account == "default":
            self._default_service_account(namespace)
        if (self.resource_of("v1", "serviceaccounts"), namespace, account) in self.objects:
            return
        shown = generate_name if generate_name and meta["name"].startswith(generate_name) else meta["name"]
        raise error(
            403,
            "Forbidden",
            f'pods "{shown}" is forbidden: error looking up service account {namespace}/{account}: '
            f'serviceaccount "{account}" not found',
        )

    def _default_service_account(self, namespace: str) -> None:
        """The serviceaccount controller's `default` ServiceAccount. Namespaces spring into being
        here on first use, so it is made when a pod first needs it."""
        res = self.resource_of("v1", "serviceaccounts")
        key = (res, namespace, "default")
        if res not in self._kinds or key in self.objects:
            return
        meta: dict[str, Any] = {"name": "default", "namespace": namespace, "uid": str(uuid.uuid4())}
        meta.update(creationTimestamp=timestamp(now()), generation=1, resourceVersion=self._next_rv())
        self.objects[key] = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}
        self._emit(res, "ADDED", self.objects[key])

    async def _patch(self, request: kmock.Request) -> dict[str, Any]:
        kind = self._kind(request.resource)
        sub = request.subresource
        if sub not in (None, "status") or (sub == "status" and "status" not in kind.subresources):
            raise error(404, "NotFound", f"no subresource {sub!r} for {kind.resource.plural}")
        self._record("patch", request)
        ctype = (request.headers.get("Content-Type") or "").split(";")[0]
        async with self._lock:
            old = self._get(request)
            new = _apply_patch(old, request.data, ctype)
            wanted_rv = (
                ((request.data or {}).get("metadata") or {}).get("resourceVersion")
                if isinstance(request.data, dict)
                else None
            )
            if wanted_rv and wanted_rv != old["metadata"]["resourceVersion"]:
                raise error(409, "Conflict", f"the object has been modified (resourceVersion {wanted_rv} is stale)")
            new = kind.admit(_through_endpoint(old, new, sub, "status" in kind.subresources), strict=_strict(request))
            if new == old:
                return copy.deepcopy(old)
            strip = lambda o: {k: v for k, v in o.items() if k not in ("metadata", "status")}  # noqa: E731
            if strip(new) != strip(old):
                new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
            new["metadata"]["resourceVersion"] = self._next_rv()
            key = (kind.resource, request.namespace, request.name)
            self.objects[key] = new
            self._emit(kind.resource, "MODIFIED", new)
            if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
                self._remove(key)
            return copy.deepcopy(new)

    async def _delete(self, request: kmock.Request) -> dict[str, Any]:
        kind = self._kind(request.resource)
        self._record("delete", request)
        body = request.data if isinstance(request.data, dict) else {}
        orphan = (body.get("propagationPolicy") or request.params.get("propagationPolicy")) == "Orphan"
        async with self._lock:
            obj = self._get(request)
            key = (kind.resource, request.namespace, request.name)
            return copy.deepcopy(self._delete_locked(key, obj, orphan))

    # ------------------------------------------------------------------ deletion and GC

    def _delete_locked(self, key: tuple, obj: dict[str, Any], orphan: bool = False) -> dict[str, Any]:
        meta = obj["metadata"]
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = timestamp(now())
                meta["resourceVersion"] = self._next_rv()
                self._emit(key[0], "MODIFIED", obj)
            return obj
        self._remove(key, orphan)
        return obj

    def _remove(self, key: tuple, orphan: bool = False) -> None:
        obj = self.objects.pop(key)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._emit(key[0], "DELETED", obj)
        self.pod_logs.pop((key[1], key[2]), None)
        if orphan:
            return
        uid = obj["metadata"].get("uid")
        for child_key, child in list(self.objects.items()):  # background cascading deletion
            owners = child["metadata"].get("ownerReferences") or []
            if child_key in self.objects and any(o.get("uid") == uid for o in owners):
                self._delete_locked(child_key, child)

    # ------------------------------------------------------------------ direct access (tests, node agent)

    def resource_of(self, api_version: str, plural: str) -> kmock.resource:
        group, _, version = api_version.rpartition("/")
        return kmock.resource(group, version, plural)


def _apply_patch(old: dict[str, Any], patch: Any, content_type: str) -> dict[str, Any]:
    """The object with a JSON patch or a merge patch applied; 415 for another patch type, 422 for a
    patch that does not apply (a failed `test` included)."""
    try:
        if content_type == "application/json-patch+json":
            return jsonpatch.apply_patch(copy.deepcopy(old), patch)
        if content_type in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
            "application/json",
            "",
        ):
            # Strategic merge is approximated as a merge patch: lists are replaced, not merged.
            return merge_patch(old, patch)
        raise error(415, "UnsupportedMediaType", f"patch type {content_type} is not supported")
    except jsonpatch.JsonPatchTestFailed as e:
        raise error(422, "Invalid", f"the patch test failed: {e}") from None
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
        raise error(422, "Invalid", str(e)) from None


def _strict(request: kmock.Request) -> bool:
    """Whether the request asks unknown fields to be refused (fieldValidation=Strict, kubectl's default)."""
    return request.params.get("fieldValidation") == "Strict"


def _through_endpoint(old: dict[str, Any], new: dict[str, Any], sub: str | None, split: bool) -> dict[str, Any]:
    """What a patch may change: with a status subresource (`split`), only the status through it and
    all but the status through the main endpoint; never the identity and bookkeeping metadata."""
    if split:
        if sub == "status":
            new = {**copy.deepcopy(old), "status": new.get("status")}
        else:
            new["status"] = copy.deepcopy(old.get("status"))
        if new["status"] is None:
            new.pop("status")
    meta = new.setdefault("metadata", {})
    for fixed in ("uid", "name", "namespace", "creationTimestamp", "generation", "resourceVersion"):
        if fixed in old["metadata"]:
            meta[fixed] = old["metadata"][fixed]
    return new
