"""Leader election on a coordination.k8s.io Lease, for an operator Deployment of several replicas.

kopf's peering is not used: it pauses kopf's handlers but not the operator's poller, it pauses
every replica when their priorities are equal (as the pods of one Deployment's are), and it needs
CRDs and cluster-wide RBAC of its own. A Lease taken before kopf starts guards everything the
process does, with a Role on one object in the operator's namespace. Its requests go through the
operator's own client (kube.py: the same configuration, token and transport) on a connection pool of
their own, so that a burst of the operator's writes never holds a renewal back.

What it promises, as client-go's leader election does (k8s.io/client-go/tools/leaderelection,
whose defaults kube-controller-manager and kube-scheduler use: LeaseDuration 15 s, RenewDeadline
10 s, RetryPeriod 2 s; NewLeaderElector refuses a RenewDeadline not shorter than the LeaseDuration):
- holders are judged by when this replica saw the Lease change, never by comparing clocks;
- a renewal counts from when its request was sent, no renewal request outlives the deadline, and
  every write of the operator carries the renew deadline (`write_deadline`, `Kube(write_deadline=...)`):
  it is asked when the write has its connection, just before it is sent, and the write is cut off
  when it passes, so a leader that cannot renew has stopped writing LEASE_SECONDS -
  RENEW_DEADLINE_SECONDS before another replica may take over;
- the leader that loses the Lease says so, stops kopf and exits 1; its Deployment restarts it as a
  candidate (as client-go's own users do); a renewal task that dies takes the leader down too;
- a candidate that cannot reach the API waits and tries again; it never exits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import http.server
import logging
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import kubernetes

from gemma_operator import retries
from gemma_operator.kinds import KindInfo
from gemma_operator.kube import UNREACHABLE, ApiError, Kube

log = logging.getLogger("gemma_operator.leader")

LEASE_SECONDS = 15  # a silent leader is replaced after this long
RENEW_DEADLINE_SECONDS = 10  # a leader that could not renew for this long stops writing, then exits
RETRY_SECONDS = 2
assert RENEW_DEADLINE_SECONDS < LEASE_SECONDS, "the leader must stop before another may start"
LEASE_KINDS = {"Lease": KindInfo("coordination.k8s.io/v1", "leases", frozenset({"get", "create", "patch"}))}
ELECTION_CONNECTIONS = 2  # the Lease's own connections: a renewal, and a release or a retry beside it


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def election_client(client: kubernetes.client.ApiClient, user_agent: str) -> Kube:
    """The operator's client for the Lease alone: its configuration and token, a pool of its own."""
    cfg = copy.copy(client.configuration)
    cfg.connection_pool_maxsize = ELECTION_CONNECTIONS
    return Kube(kubernetes.client.ApiClient(cfg), LEASE_KINDS, user_agent)


class Elector:
    """One candidate for the Lease `namespace/name`, known as `identity` (its pod name)."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: float = LEASE_SECONDS,
        retry_seconds: float = RETRY_SECONDS,
        renew_deadline: float = RENEW_DEADLINE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_seconds, self.retry_seconds, self.renew_deadline = lease_seconds, retry_seconds, renew_deadline
        self._clock = clock
        self._record: tuple | None = None  # (holder, renewTime, resourceVersion) last seen
        self._seen = 0.0
        self._renewed: float | None = None  # when the request of our last successful write was sent
        self._outage = retries.Outage(f"leader election (Lease {namespace}/{name})", log)

    def holds(self) -> bool:
        """Whether this replica may still act as the leader: it renewed within the deadline."""
        return self._renewed is not None and self._clock() - self._renewed < self.renew_deadline

    def write_deadline(self) -> float | None:
        """Until when (in time.monotonic()) a write of this replica may be sent and answered; None when
        it does not lead."""
        if self._renewed is None:
            return None
        return time.monotonic() + (self._renewed + self.renew_deadline - self._clock())

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; ApiError when the API cannot be reached or refuses for another reason."""
        started = self._clock()
        lease = await self.kube.get("Lease", self.namespace, self.name)
        if lease is None:
            return await self._create(started)
        spec, rv = lease["spec"], lease["metadata"]["resourceVersion"]
        holder = spec.get("holderIdentity")
        record = (holder, spec.get("renewTime"), rv)
        if record != self._record:
            self._record, self._seen = record, self._clock()
        duration = spec.get("leaseDurationSeconds") or self.lease_seconds
        if holder and holder != self.identity and self._clock() - self._seen < duration:
            return False
        now = _now()
        patch: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_seconds),
            "renewTime": now,
        }
        if holder != self.identity:
            patch.update(acquireTime=now, leaseTransitions=(spec.get("leaseTransitions") or 0) + 1)
        # The resourceVersion makes the patch fail (409) if another candidate wrote first.
        body = {"metadata": {"resourceVersion": rv}, "spec": patch}
        return await self._write(started, self.kube.patch("Lease", self.namespace, self.name, body))

    async def _create(self, started: float) -> bool:
        now = _now()
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.lease_seconds),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        return await self._write(started, self.kube.create(body))

    async def _write(self, started: float, call: Awaitable[dict]) -> bool:
        try:
            lease = await call
        except ApiError as e:
            if e.status == 409:  # someone else wrote first
                return False
            raise
        spec = lease["spec"]
        self._record = (spec.get("holderIdentity"), spec.get("renewTime"), lease["metadata"]["resourceVersion"])
        self._seen, self._renewed = self._clock(), started
        return True

    async def _attempt(self, timeout: float | None = None) -> bool:
        """An attempt (given up after `timeout`) whose API failures are logged when they start and when they
        end, not each time."""
        try:
            async with asyncio.timeout(timeout):
                won = await self.try_acquire_or_renew()
        except TimeoutError:
            self._outage.failed(ApiError(UNREACHABLE, "Unreachable", "no answer within the renew deadline", "Lease"))
            return False
        except ApiError as e:
            self._outage.failed(e)
            return False
        self._outage.recovered()
        return won

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this replica leads (True) or `stop` is set (False); never gives up on errors."""
        while not stop.is_set():
            if await self._attempt():
                log.info("%s leads through Lease %s/%s", self.identity, self.namespace, self.name)
                return True
            await _wait(stop, self.retry_seconds)
        return False

    async def keep(self, on_lost: Callable[[], None], stop: asyncio.Event) -> None:
        """Renew until `stop`; call `on_lost` once no renewal succeeded for the renew deadline. A
        renewal's request gets only what is left of the deadline, so none can outlive it."""
        while not await _wait(stop, self.retry_seconds):
            left = self.renew_deadline - (self._clock() - (self._renewed or 0.0))
            if left > 0 and await self._attempt(timeout=left):
                continue
            if not self.holds():
                log.error(
                    "%s lost Lease %s/%s: no renewal for %.0f s; it stops acting and exits",
                    self.identity,
                    self.namespace,
                    self.name,
                    self.renew_deadline,
                )
                on_lost()
                return

    async def release(self) -> None:
        """Hand the Lease over at once (on shutdown) instead of letting it expire."""
        if not self._record or self._record[0] != self.identity or not self.holds():
            return
        patch = {
            "metadata": {"resourceVersion": self._record[2]},
            "spec": {"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": _now()},
        }
        try:
            await self.kube.patch("Lease", self.namespace, self.name, patch)
        except ApiError as e:  # it expires on its own
            log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, e)
        self._record, self._renewed = None, None


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Wait `seconds` or until `stop` is set; whether it is."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


def elector_for(client: kubernetes.client.ApiClient, lease: str, user_agent: str) -> Elector:
    """The candidate for the Lease `NAMESPACE/NAME`, named after its pod."""
    namespace, _, name = lease.partition("/")
    identity = os.environ.get("POD_NAME") or socket.gethostname()
    return Elector(election_client(client, f"{user_agent} ({identity})"), namespace, name, identity)


@contextlib.contextmanager
def standby_health(liveness: str) -> Iterator[None]:
    """Answer the liveness endpoint while waiting to lead (kopf serves it once it runs), so a
    standby replica is alive and ready and a PodDisruptionBudget can let the leader go."""
    if not liveness:
        yield
        return
    url = urllib.parse.urlsplit(liveness)

    class Healthy(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the http.server API names it
            self.send_response(200 if self.path == url.path else 404)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((url.hostname or "0.0.0.0", url.port or 80), Healthy)
    thread = threading.Thread(target=server.serve_forever, name="standby health", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


@contextlib.asynccontextmanager
async def leading(
    elector: Elector, liveness: str, stop_flag: threading.Event, lost: threading.Event
) -> AsyncIterator[None]:
    """Wait to lead (answering liveness meanwhile), then renew the Lease in a task of this loop while
    the body runs; raise `stop_flag` (kopf's) and set `lost` when it cannot be renewed, or when the
    renewal task dies of anything else. Hands the Lease over on exit."""
    done = asyncio.Event()
    with standby_health(liveness):
        await elector.acquire(done)

    def step_down() -> None:
        lost.set()
        stop_flag.set()

    async def renew() -> None:
        try:
            await elector.keep(step_down, done)
        except Exception:
            log.critical("the Lease renewal stopped on an error: the leader steps down", exc_info=True)
            step_down()

    renewal = asyncio.create_task(renew(), name="lease renewal")
    try:
        yield
    finally:
        done.set()
        await renewal
        await elector.release()
