"""Every call the operator makes to the Kubernetes API, in one place.

The official client reads the configuration and makes each request's URL and headers (auth
included); `transport.py` carries the request in the event loop. The kinds it may touch, and
how, are the table in `kinds.py`.
"""

from __future__ import annotations

import builtins
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import kubernetes

from gemma_operator import api, reasons
from gemma_operator.clock import now, timestamp
from gemma_operator.kinds import KINDS, KindInfo
from gemma_operator.transport import UNANSWERED, Deadline, DeadlinePassed, Transport

# Names the operator's requests in API server audit logs (and lets tests tell them from their own).
USER_AGENT = "gemma-tpu-operator"
UNREAD = object()  # `Kube.ensure`: what exists was not read yet


UNREACHABLE = 0  # ApiError.status when no answer came: refused, reset, timed out, TLS failed
# Seconds to connect, then between reads, then in all. A write under a leader's Lease is bounded by the
# Lease's renew deadline too (leader.py), so none is sent, or still in flight, once the replica stops leading.
REQUEST_TIMEOUT = (5.0, 30.0, 60.0)
# Requests in flight at once (per event loop): the client's connection_pool_maxsize, which `from_url` and the
# operator's runner set to this. Each reconcile waits on its own requests in turn, so the operator's
# throughput is this many over the API's latency: with 6 in flight a burst of 500 CRs on a real
# kube-apiserver took 15.3 s, with 16 9.9 s.
REQUESTS_IN_FLIGHT = 32


class ApiError(Exception):
    """An API answer other than 2xx, or no answer at all (`status` UNREACHABLE); `request` names
    the call (verb and path), `retry_after` is the server's Retry-After in seconds (429, 503), when
    it gave one."""

    def __init__(
        self, status: int, reason: str, message: str, request: str = "", retry_after: float | None = None
    ) -> None:
        super().__init__(f"{status} {reason}: {message}" + (f" ({request})" if request else ""))
        self.status, self.reason, self.message = status, reason, message
        self.request, self.retry_after = request, retry_after

    @property
    def transient(self) -> bool:
        """Worth trying again as it is: no answer, throttled, or the server's own failure."""
        return self.status in (UNREACHABLE, 429) or self.status >= 500


class NotLeading(ApiError):
    """A write this replica did not send, or gave up on, at its Lease's renew deadline: it no longer
    holds the leader's Lease (leader.py)."""

    def __init__(self, request: str = "") -> None:
        super().__init__(UNREACHABLE, reasons.NOT_LEADING, "this replica does not hold the leader's Lease", request)


def answer_error(
    status: int, text: str | bytes | None, headers: Mapping[str, str] | None, request: str = "", reason: str = ""
) -> ApiError:
    """ApiError of an answer other than 2xx: the reason and message of its Status body, and its
    Retry-After (429, 503) when it gave one."""
    try:
        body = json.loads(text or "{}")
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    try:
        retry_after = float((headers or {})["Retry-After"])
    except (KeyError, TypeError, ValueError):
        retry_after = None
    text = text.decode(errors="replace") if isinstance(text, bytes) else text
    return ApiError(
        status, body.get("reason") or reason or str(status), body.get("message") or str(text), request, retry_after
    )


class Kube:
    """Async access to the objects of `KINDS`, as plain dicts."""

    def __init__(
        self,
        client: kubernetes.client.ApiClient,
        kinds: dict[str, KindInfo] = KINDS,
        user_agent: str = USER_AGENT,
        write_deadline: Deadline | None = None,
    ) -> None:
        client.user_agent = user_agent
        self._client, self._kinds = client, kinds
        self._transport = Transport(client.configuration, REQUEST_TIMEOUT)
        # The deadline of every write: a replica that no longer leads must not write (leader.py).
        self._write_deadline = write_deadline

    @classmethod
    def from_url(cls, url: str, kinds: dict[str, KindInfo] = KINDS, user_agent: str = USER_AGENT) -> Kube:
        cfg = kubernetes.client.Configuration()
        cfg.host = url.rstrip("/")
        cfg.connection_pool_maxsize = REQUESTS_IN_FLIGHT
        return cls(kubernetes.client.ApiClient(cfg), kinds, user_agent)

    def _path(self, kind: str, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        info = self._kinds[kind]
        root = f"/api/{info.api_version}" if "/" not in info.api_version else f"/apis/{info.api_version}"
        path = f"{root}/namespaces/{namespace}/{info.plural}" if namespace else f"{root}/{info.plural}"
        if name:
            path += f"/{name}"
        if sub:
            path += f"/{sub}"
        return path

    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict | None = None,
        content_type: str = "application/json",
        raw: bool = False,
    ) -> Any:
        request = f"{method} {path}"
        deadline = self._write_deadline if method != "GET" else None
        # The official client makes the URL and the headers, its token among them (refreshed
        # when it expires); the transport carries them.
        method_, url, headers, _, _ = self._client.param_serialize(
            method,
            path,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        try:
            answer = await self._transport.request(method_, url, headers, body, deadline)
        except DeadlinePassed:
            raise NotLeading(request) from None
        except UNANSWERED as e:
            raise ApiError(UNREACHABLE, "Unreachable", f"{type(e).__name__}: {e}", request) from None
        if not 200 <= answer.status < 300:
            raise answer_error(answer.status, answer.text, answer.headers, request)
        return answer.text if raw else json.loads(answer.text or "null")

    async def get(self, kind: str, namespace: str, name: str) -> dict | None:
        try:
            return await self._call("GET", self._path(kind, namespace, name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def get_path(self, path: str, raw: bool = False) -> Any:
        """A non-resource URL (discovery, OpenAPI); None when the server serves nothing there."""
        try:
            return await self._call("GET", path, raw=raw)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def list(
        self, kind: str, namespace: str | None, label_selector: str | None = None, field_selector: str | None = None
    ) -> builtins.list[dict]:
        query = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        return (await self._call("GET", self._path(kind, namespace), query=query))["items"]

    async def create(self, obj: dict) -> dict:
        return await self._call("POST", self._path(obj["kind"], obj["metadata"]["namespace"]), body=obj)

    async def patch(self, kind: str, namespace: str, name: str, patch: dict, *, status: bool = False) -> dict:
        path = self._path(kind, namespace, name, "status" if status else None)
        return await self._call("PATCH", path, body=patch, content_type="application/merge-patch+json")

    async def patch_json(
        self, kind: str, namespace: str, name: str, ops: builtins.list[dict], *, status: bool = False
    ) -> dict:
        """A JSON patch (RFC 6902): its `test` operations make it fail (422) if what they test changed."""
        path = self._path(kind, namespace, name, "status" if status else None)
        return await self._call("PATCH", path, body=ops, content_type="application/json-patch+json")

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        try:
            await self._call("DELETE", self._path(kind, namespace, name), body={"propagationPolicy": "Background"})
        except ApiError as e:
            if e.status != 404:
                raise

    async def pod_log(self, namespace: str, name: str, container: str, tail_lines: int = 50) -> str:
        try:
            return await self._call(
                "GET",
                self._path("Pod", namespace, name, "log"),
                query={"container": container, "tailLines": str(tail_lines)},
                raw=True,
            )
        except ApiError as e:
            if e.status in (400, 404):  # not started yet, or gone
                return ""
            raise

    async def event(self, involved: dict, type_: str, reason: str, message: str) -> None:
        """A core/v1 Event on a CR, shown by `kubectl describe`. Its name is derived from what it
        says and from the resourceVersion of the CR it was decided on, so posting it again after a
        failed reconcile (or an answer lost after the write) finds it there instead of doubling it."""
        meta = involved["metadata"]
        t = timestamp(now())
        key = _hash([meta["uid"], meta.get("resourceVersion"), type_, reason, message])
        try:
            await self.create(
                {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"name": f"{meta['name']}.{key}", "namespace": meta["namespace"]},
                    "involvedObject": {
                        "apiVersion": involved["apiVersion"],
                        "kind": involved["kind"],
                        "name": meta["name"],
                        "namespace": meta["namespace"],
                        "uid": meta["uid"],
                    },
                    "type": type_,
                    "reason": reason,
                    "message": message[:1024],
                    "count": 1,
                    "firstTimestamp": t,
                    "lastTimestamp": t,
                    "source": {"component": "gemma-tpu-operator"},
                }
            )
        except ApiError as e:
            if e.status != 409:
                raise

    async def ensure(
        self,
        obj: dict,
        mutable: tuple[str, ...] = (),
        current: dict | None | object = UNREAD,
        *,
        presumed: bool = False,
    ) -> dict:
        """Create the object if it is missing, or re-apply its `mutable` spec fields when what we
        want of them changed since we last applied them. The hash of the wanted fields is kept in
        an annotation, so defaults the API server adds, and changes other controllers make (Kueue
        suspending a Job, an HPA scaling a Deployment), are not fought over.

        What exists is read first (or taken from `current`, when the caller observed it in this
        reconcile), so children already in place cost no write. A patch carries the
        resourceVersion it was computed from: a concurrent writer's change is never overwritten
        unseen (409 Conflict; the retried reconcile reads it). `presumed`: `current` None was
        presumed, not read, and a 409 AlreadyExists is raised for the caller to read everything."""
        want = {k: obj["spec"][k] for k in mutable if k in obj.get("spec", {})}
        meta = obj["metadata"]
        if want:
            meta.setdefault("annotations", {})[APPLIED_ANNOTATION] = _hash(want)
        if not isinstance(current, dict | None):  # UNREAD
            current = await self.get(obj["kind"], meta["namespace"], meta["name"])
        if current is None:
            try:
                return await self.create(obj)
            except ApiError as e:
                if e.status != 409 or presumed:
                    raise
            current = await self.get(obj["kind"], meta["namespace"], meta["name"])  # created in between
            if current is None:  # and deleted again: the retried reconcile creates it
                raise ApiError(409, "Conflict", f"{obj['kind']} {meta['namespace']}/{meta['name']} is being deleted")
        patch: dict[str, Any] = {}
        current_meta = current["metadata"]
        if want and (current_meta.get("annotations") or {}).get(APPLIED_ANNOTATION) != _hash(want):
            patch["spec"] = diff_patch({k: current.get("spec", {}).get(k) for k in want}, want)
            patch["metadata"] = {"annotations": {APPLIED_ANNOTATION: _hash(want)}}
        if obj.get("data") is not None and current.get("data") != obj["data"]:
            patch["data"] = obj["data"]
        labels = meta.get("labels") or {}
        if any((current_meta.get("labels") or {}).get(k) != v for k, v in labels.items()):
            patch.setdefault("metadata", {})["labels"] = labels
        if not patch:
            return current
        patch.setdefault("metadata", {})["resourceVersion"] = current_meta["resourceVersion"]
        return await self.patch(obj["kind"], meta["namespace"], meta["name"], patch)


APPLIED_ANNOTATION = f"{api.GROUP}/applied-spec"


def _hash(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def status_patch(old: dict[str, Any], new: dict[str, Any], resource_version: str) -> list[dict]:
    """A JSON patch turning status `old` into `new`, key by key. The fields are the operator's own,
    but `conditions` is shared with other controllers: when it changes, the patch first tests
    that it is still what was read, and fails (422) if another writer changed it meanwhile, as kopf
    does for its own patches. A first status tests the resourceVersion instead (an absent field
    cannot be tested)."""
    if not old:
        return [
            {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
            {"op": "add", "path": "/status", "value": new},
        ]
    ops: list[dict] = []
    if "conditions" in old and old.get("conditions") != new.get("conditions"):
        ops.append({"op": "test", "path": "/status/conditions", "value": old["conditions"]})
    for key in sorted(old.keys() - new.keys()):
        ops.append({"op": "remove", "path": f"/status/{_pointer(key)}"})
    for key, value in new.items():
        if old.get(key) != value or key not in old:
            ops.append({"op": "add", "path": f"/status/{_pointer(key)}", "value": value})
    return ops


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")  # RFC 6901


def diff_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A merge patch turning `old` into `new`: null for every key that disappears."""
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            sub = diff_patch(before, value)
            if sub:
                patch[key] = sub
        elif value != before:
            patch[key] = value
    return patch
