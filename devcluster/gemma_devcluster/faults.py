"""The in-process API with faults, as a loaded API server shows them to its clients.

Writes (create, patch, delete) of chosen clients are answered 500 before the write is stored,
500 after it is stored (the client cannot tell whether it happened), or 429 Too Many Requests
with a Retry-After; watches are closed after a few seconds; a watch resumed from a
resourceVersion is answered 410 Expired (the client must list again). Write faults come at
random at a rate (seeded, so a run can be replayed) or scripted: the next matching writes.
Reads are never failed: a client's reaction to failed writes and broken watches is what is tried.
"""

from __future__ import annotations

import collections
import copy
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import attrs
import kmock

from gemma_devcluster.apiserver import EXPIRED, ApiServer
from gemma_operator.kube import USER_AGENT

BEFORE_WRITE, AFTER_WRITE, THROTTLED = "500 before the write", "500 after the write", "429 Retry-After"
WRITE_FAULTS = (BEFORE_WRITE, AFTER_WRITE, THROTTLED)
WATCH_CLOSED, WATCH_EXPIRED = "watch closed", "410 Expired on resume"
INTERLEAVED = "another writer first"
_VERBS = {kmock.action.CREATE: "create", kmock.action.UPDATE: "patch", kmock.action.DELETE: "delete"}


@dataclass
class Rule:
    """A scripted fault: the next `times` writes matching verb, resource and name get it."""

    fault: str
    verb: str | None = None  # create, patch or delete; None: any
    resource: str | None = None  # the plural, "gemmaserves/status" for the status subresource
    name: str | None = None
    times: int = 1

    def matches(self, verb: str, resource: str, name: str | None) -> bool:
        return self.verb in (None, verb) and self.resource in (None, resource) and self.name in (None, name)


@attrs.define(kw_only=True)
class FaultyApiServer(ApiServer):
    """`ApiServer` plus the fault switch; `injected` counts what it did, by fault and resource."""

    write_fault_rate: float = 0.0
    watch_lifetime: float | None = None  # seconds, give or take half
    expire_rate: float = 0.0  # share of watch resumes answered 410
    retry_after: int = 1
    agents: tuple[str, ...] = (USER_AGENT, "kopf/")  # whose requests get faults: the operator's
    seed: int = 0
    rules: list[Rule] = attrs.field(factory=list, init=False)
    interleaved: list[tuple[Rule, Callable[[], Awaitable[None]]]] = attrs.field(factory=list, init=False)
    injected: collections.Counter = attrs.field(factory=collections.Counter, init=False)
    _rng: random.Random = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._rng = random.Random(self.seed)

    def inject(
        self, fault: str, verb: str | None = None, resource: str | None = None, name: str | None = None, times: int = 1
    ) -> None:
        assert fault in WRITE_FAULTS, f"unknown write fault {fault!r}: one of {WRITE_FAULTS}"
        self.rules.append(Rule(fault, verb, resource, name, times))

    def interleave(
        self,
        action: Callable[[], Awaitable[None]],
        verb: str | None = None,
        resource: str | None = None,
        name: str | None = None,
    ) -> None:
        """Before the next matching write of the operator is stored, let `action` (another client's
        write) happen: the operator's read is then older than what it writes over."""
        self.interleaved.append((Rule(INTERLEAVED, verb, resource, name), action))

    def calm(self) -> None:
        """No more faults from now on."""
        self.write_fault_rate, self.watch_lifetime, self.expire_rate = 0.0, None, 0.0
        self.rules.clear()

    # ------------------------------------------------------------------ choosing

    def _targeted(self, request: kmock.Request) -> bool:
        return (request.headers.get("User-Agent") or "").startswith(self.agents)

    def _write(self, request: kmock.Request) -> tuple[str, str, str | None] | None:
        """(verb, resource, name) of a write by a targeted client; None for anything else."""
        verb = _VERBS.get(request.action) if request.action is not None else None
        if verb is None or request.resource is None or not self._targeted(request):
            return None
        resource = _plural(request) + (f"/{request.subresource}" if request.subresource else "")
        name = request.name
        if verb == "create" and isinstance(request.data, dict):
            name = (request.data.get("metadata") or {}).get("name")
        return verb, resource, name

    def _write_fault(self, request: kmock.Request) -> tuple[str, str] | None:
        write = self._write(request)
        if write is None:
            return None
        verb, resource, name = write
        for rule in self.rules:
            if rule.matches(verb, resource, name):
                rule.times -= 1
                if rule.times <= 0:
                    self.rules.remove(rule)
                return rule.fault, f"{verb} {resource}"
        if self._rng.random() < self.write_fault_rate:
            return self._rng.choice(WRITE_FAULTS), f"{verb} {resource}"
        return None

    async def _interleave(self, request: kmock.Request) -> None:
        """Run another writer's scripted write just before this one is stored."""
        write = self._write(request)
        for rule, action in list(self.interleaved):
            if write is not None and rule.matches(*write):
                self.interleaved.remove((rule, action))
                self.injected[(INTERLEAVED, f"{write[0]} {write[1]}")] += 1
                await action()
                return

    def _answer(self, fault: str) -> kmock.Response:
        """The API server's throttling answers 429 with a Retry-After header (kubernetes
        k8s.io/apiserver pkg/server/filters maxinflight.go and priority-and-fairness.go, `tooManyRequests`)."""
        code, reason = (429, "TooManyRequests") if fault == THROTTLED else (500, "InternalError")
        status = {
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "code": code,
            "reason": reason,
            "message": f"injected fault: {fault}",
            "details": {"retryAfterSeconds": self.retry_after},
        }
        headers = {"Retry-After": str(self.retry_after)} if fault == THROTTLED else None
        return kmock.Response(status=code, payload=status, headers=headers)

    # ------------------------------------------------------------------ serving

    async def _handle(self, request: kmock.Request) -> Any:
        if request.resource in self._kinds:
            await self._interleave(request)
        chosen = self._write_fault(request) if request.resource in self._kinds else None
        if chosen is None:
            return await super()._handle(request)
        fault, what = chosen
        self.injected[(fault, what)] += 1
        if fault == AFTER_WRITE:
            response = await super()._handle(request)  # stored; an error raised here is answered as it is
            if response.status >= 300:
                return response
        return await self._answer(fault)(request)

    def _watch_timeout(self, request: kmock.Request) -> float | None:
        timeout = super()._watch_timeout(request)
        if self.watch_lifetime is None or not self._targeted(request):
            return timeout
        self.injected[(WATCH_CLOSED, _plural(request))] += 1
        lifetime = self.watch_lifetime * (0.5 + self._rng.random())
        return min(timeout, lifetime) if timeout else lifetime

    async def _watch(self, request: kmock.Request) -> Any:
        resumed = request.params.get("resourceVersion") not in (None, "", "0")
        if resumed and self._targeted(request) and self._rng.random() < self.expire_rate:
            self._record("watch", request)
            self.injected[(WATCH_EXPIRED, _plural(request))] += 1
            yield b""
            yield copy.deepcopy(EXPIRED)
            return
        async for item in super()._watch(request):
            yield item


def _plural(request: kmock.Request) -> str:
    """The resource a request names, as RBAC and the counts of injected faults name it."""
    return (request.resource.plural if request.resource else None) or ""
