"""What the operator has already observed and decided on, so that a reconcile does only the work
that a change asks for.

Every watch event of a CR or of one of its children wakes the CR's reconcile, and most of them
are echoes: the CR's own status write, the child the last reconcile created. A reconcile that
would read exactly what an earlier one decided on can only decide the same again, so such an
event is skipped; anything else (a version this operator never saw) is reconciled in full. All
of it is kept per object that exists, and forgotten when the object is deleted: none of it grows
with history.
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from gemma_operator.kinds import KINDS

Key = tuple[str, str, str]  # (kind, namespace, name)
WATCHED = {kind: info.wakes_owner for kind, info in KINDS.items()}  # the kinds whose watch events wake their owner
KEEP_VERSIONS = 4  # per CR: an echo older than this many decisions is reconciled again, which is harmless


def version_of(body: Mapping[str, Any]) -> str | None:
    return (body.get("metadata") or {}).get("resourceVersion")


class DecidedVersions:
    """The resourceVersions of each CR that a completed reconcile decided on: the one it read and
    the one its own status write produced (when that write changed nothing else). The latest is
    the CR as the operator last left it."""

    def __init__(self) -> None:
        self._versions: dict[Key, collections.deque[str]] = {}

    def touch(self, key: Key) -> None:
        """A reconcile of this CR begins: from now on a watched version may lack this process's writes."""
        self._versions.setdefault(key, collections.deque(maxlen=KEEP_VERSIONS))

    def add(self, key: Key, *versions: str) -> None:
        kept = self._versions.setdefault(key, collections.deque(maxlen=KEEP_VERSIONS))
        for version in versions:
            if version in kept:
                kept.remove(version)
            kept.append(version)

    def decided(self, key: Key, body: Mapping[str, Any]) -> bool:
        """Whether `body` is a version of the CR that a reconcile already decided on."""
        return version_of(body) in self._versions.get(key, ())

    def latest(self, key: Key, body: Mapping[str, Any]) -> bool:
        """Whether `body` is the CR as the latest reconcile left it."""
        kept = self._versions.get(key)
        return kept is not None and len(kept) > 0 and version_of(body) == kept[-1]

    def knows(self, key: Key) -> bool:
        """Whether any reconcile of this CR began in this process."""
        return key in self._versions

    def forget(self, key: Key) -> None:
        self._versions.pop(key, None)

    def __len__(self) -> int:
        return len(self._versions)


def only_its_status_changed(read: Mapping[str, Any], written: Mapping[str, Any], status: Any) -> bool:
    """Whether the object a status write returned is the one read with only that status: then no
    other writer changed it in between, and its version holds nothing left to decide on."""
    before, after = read.get("metadata") or {}, written.get("metadata") or {}
    return (
        written.get("status") == status
        and written.get("spec") == read.get("spec")
        and all(before.get(k) == after.get(k) for k in ("generation", "labels", "annotations", "deletionTimestamp"))
    )


class WatchedChildren:
    """The operator's children as their watches last delivered them, cut to what `Kube.ensure`
    compares (labels, annotations, the re-applied spec fields, a ConfigMap's data): re-applying a
    child that no reconcile reads costs no read. A copy older than the object makes ensure's
    patch answer 409, and the reconcile reads it again.

    Beside each copy, the version of the child that a completed reconcile last read or wrote: an
    event that delivers that version again (the echo of the operator's own create) is skipped."""

    def __init__(self) -> None:
        self._objects: dict[Key, dict] = {}
        self._decided: dict[Key, str] = {}

    @staticmethod
    def key(body: Mapping[str, Any]) -> Key:
        meta = body["metadata"]
        return body["kind"], meta["namespace"], meta["name"]

    def saw(self, event: str | None, body: Mapping[str, Any]) -> None:
        """Keep the copy a watch event delivered (None: the object as listed when the watch began)."""
        key = self.key(body)
        if event == "DELETED":
            self._objects.pop(key, None)
            self._decided.pop(key, None)
            return
        self._objects[key] = cut(body)

    def gone(self, kind: str, namespace: str, name: str) -> None:
        """The API answered that the child does not exist: its copy, if any, is out of date."""
        self._objects.pop((kind, namespace, name), None)
        self._decided.pop((kind, namespace, name), None)

    def get(self, kind: str, namespace: str, name: str, default: Any = None) -> dict | Any:
        return self._objects.get((kind, namespace, name), default)

    def decide(self, bodies: Sequence[Mapping[str, Any]]) -> None:
        """Children a completed reconcile read or wrote, at the version it saw them. The copy of a
        watched one is updated too (a write's answer is newer than any event before it); a kind
        no watch follows keeps no copy, since nothing would tell when it went out of date."""
        for body in bodies:
            key, version = self.key(body), version_of(body)
            if version and WATCHED.get(body["kind"], False):
                self._decided[key] = version
                self._objects[key] = cut(body)

    def decided(self, body: Mapping[str, Any]) -> bool:
        """Whether a reconcile already decided on this version of the child."""
        version = version_of(body)
        return version is not None and self._decided.get(self.key(body)) == version

    def __len__(self) -> int:
        return len(self._objects)


def cut(body: Mapping[str, Any]) -> dict:
    """What `Kube.ensure` compares of a child: labels, annotations and version, the spec fields the
    operator re-applies, and a ConfigMap's data."""
    meta = body["metadata"]
    kept = {k: meta[k] for k in ("name", "namespace", "labels", "annotations", "resourceVersion") if k in meta}
    mutable = (KINDS[body["kind"]].mutable or ()) if body["kind"] in KINDS else ()
    spec = body.get("spec") or {}
    out: dict[str, Any] = {"kind": body["kind"], "metadata": copy.deepcopy(kept)}
    out["spec"] = {k: copy.deepcopy(spec[k]) for k in mutable if k in spec}
    if "data" in body:
        out["data"] = copy.deepcopy(body["data"])
    return out


P = TypeVar("P")


class RecentPlans(Generic[P]):
    """The plans of the CRs reconciled most recently, by what each plan is made from (the CR's
    uid, generation and labels, and for a GemmaServe what its fine-tune is now): a CR reconciled
    again for a change of its children or status is not planned again. Bounded, since a plan is
    tens of kilobytes and re-planning a CR not seen for a while costs a millisecond."""

    def __init__(self, size: int = 256) -> None:
        self._plans: collections.OrderedDict[Hashable, P] = collections.OrderedDict()
        self._size = size
        self.hits = self.misses = 0

    def get(self, key: Hashable | None, make: Callable[[], P]) -> P:
        if key is None:
            return make()
        if key in self._plans:
            self._plans.move_to_end(key)
            self.hits += 1
            return self._plans[key]
        self.misses += 1
        plan = self._plans[key] = make()
        if len(self._plans) > self._size:
            self._plans.popitem(last=False)
        return plan

    def __len__(self) -> int:
        return len(self._plans)
