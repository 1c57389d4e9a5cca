"""Leader election on a coordination.k8s.io Lease, for an operator Deployment of several replicas.

kopf's peering is not used: it pauses kopf's handlers but not the operator's poller, it pauses
every replica when their priorities are equal (as the pods of one Deployment's are), and it needs
CRDs and cluster-wide RBAC of its own. A Lease taken before kopf starts guards everything the
process does, with a Role on one object in the operator's namespace.

What it promises, as client-go's leader election does (k8s.io/client-go/tools/leaderelection,
whose defaults kube-controller-manager and kube-scheduler use: LeaseDuration 15 s, RenewDeadline
10 s, RetryPeriod 2 s; NewLeaderElector refuses a RenewDeadline not shorter than the LeaseDuration):
- holders are judged by when this replica saw the Lease change, never by comparing clocks;
- a renewal counts from when its request was sent, no renewal request outlives the deadline, and
  `holds()` turns false at the deadline whether or not the renewal thread has noticed: every write
  of the operator asks it first (`Kube(may_write=...)`), so a leader that cannot renew stops
  writing LEASE_SECONDS - RENEW_DEADLINE_SECONDS before another replica may take over;
- the leader that loses the Lease says so, stops kopf and exits 1; its Deployment restarts it as a
  candidate (as client-go's own users do); a renewal thread that dies takes the leader down too;
- a candidate that cannot reach the API waits and tries again; it never exits for it.
"""

from __future__ import annotations

import datetime
import http.server
import logging
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import kubernetes

from gemma_operator import retries
from gemma_operator.kube import CLIENT_ERRORS, REQUEST_TIMEOUT, ApiError, api_error

log = logging.getLogger("gemma_operator.leader")

LEASE_SECONDS = 15  # a silent leader is replaced after this long
RENEW_DEADLINE_SECONDS = 10  # a leader that could not renew for this long stops writing, then exits
RETRY_SECONDS = 2
assert RENEW_DEADLINE_SECONDS < LEASE_SECONDS, "the leader must stop before another may start"


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    """One candidate for the Lease `namespace/name`, known as `identity` (its pod name)."""

    def __init__(
        self,
        client: kubernetes.client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: float = LEASE_SECONDS,
        retry_seconds: float = RETRY_SECONDS,
        renew_deadline: float = RENEW_DEADLINE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = kubernetes.client.CoordinationV1Api(client)
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

    def try_acquire_or_renew(self, timeout: float | tuple[float, float] = REQUEST_TIMEOUT) -> bool:
        """One attempt; ApiError when the API cannot be reached or refuses for another reason."""
        started = self._clock()
        try:
            lease = self._call(
                lambda: self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=timeout)
            )
        except ApiError as e:
            if e.status != 404:
                raise
            return self._create(started, timeout)
        spec, rv = lease.spec, lease.metadata.resource_version
        record = (spec.holder_identity, spec.renew_time, rv)
        if record != self._record:
            self._record, self._seen = record, self._clock()
        duration = spec.lease_duration_seconds or self.lease_seconds
        if spec.holder_identity and spec.holder_identity != self.identity and self._clock() - self._seen < duration:
            return False
        now = _now()
        patch: dict = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_seconds),
            "renewTime": now,
        }
        if spec.holder_identity != self.identity:
            patch.update(acquireTime=now, leaseTransitions=(spec.lease_transitions or 0) + 1)
        # The resourceVersion makes the patch fail (409) if another candidate wrote first.
        body = {"metadata": {"resourceVersion": rv}, "spec": patch}
        return self._write(
            started, lambda: self.api.patch_namespaced_lease(self.name, self.namespace, body, _request_timeout=timeout)
        )

    def _create(self, started: float, timeout: float | tuple[float, float]) -> bool:
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
        return self._write(
            started,
            # the client sends a dict body as the JSON it is, as it does for a V1Lease's to_dict()
            lambda: self.api.create_namespaced_lease(self.namespace, body, _request_timeout=timeout),  # type: ignore[arg-type]
        )

    def _write(self, started: float, call: Callable[[], Any]) -> bool:
        try:
            lease = self._call(call)
        except ApiError as e:
            if e.status == 409:  # someone else wrote first
                return False
            raise
        self._record = (lease.spec.holder_identity, lease.spec.renew_time, lease.metadata.resource_version)
        self._seen, self._renewed = self._clock(), started
        return True

    @staticmethod
    def _call(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except CLIENT_ERRORS as e:
            raise api_error(e, "leader election") from None

    def _attempt(self, timeout: float | tuple[float, float] = REQUEST_TIMEOUT) -> bool:
        """An attempt whose API failures are logged when they start and when they end, not each time."""
        try:
            won = self.try_acquire_or_renew(timeout)
        except ApiError as e:
            self._outage.failed(e)
            return False
        self._outage.recovered()
        return won

    def acquire(self, stop: threading.Event) -> bool:
        """Wait until this replica leads (True) or `stop` is set (False); never gives up on errors."""
        while not stop.is_set():
            if self._attempt():
                log.info("%s leads through Lease %s/%s", self.identity, self.namespace, self.name)
                return True
            stop.wait(self.retry_seconds)
        return False

    def keep(self, on_lost: Callable[[], None], stop: threading.Event) -> None:
        """Renew until `stop`; call `on_lost` once no renewal succeeded for the renew deadline. A
        renewal's request gets only what is left of the deadline, so none can outlive it."""
        while not stop.wait(self.retry_seconds):
            left = self.renew_deadline - (self._clock() - (self._renewed or 0.0))
            if left > 0 and self._attempt(timeout=max(0.1, left)):
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

    def release(self) -> None:
        """Hand the Lease over at once (on shutdown) instead of letting it expire."""
        if not self._record or self._record[0] != self.identity or not self.holds():
            return
        patch = {
            "metadata": {"resourceVersion": self._record[2]},
            "spec": {"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": _now()},
        }
        try:
            self._call(lambda: self.api.patch_namespaced_lease(self.name, self.namespace, patch))
        except ApiError as e:  # it expires on its own
            log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, e)
        self._record, self._renewed = None, None


def elector_for(client: kubernetes.client.ApiClient, lease: str) -> Elector:
    """The candidate for the Lease `NAMESPACE/NAME`, named after its pod."""
    namespace, _, name = lease.partition("/")
    return Elector(client, namespace, name, os.environ.get("POD_NAME") or socket.gethostname())


@contextmanager
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


@contextmanager
def leading(elector: Elector, liveness: str, stop_flag: threading.Event, lost: threading.Event) -> Iterator[None]:
    """Wait to lead (answering liveness meanwhile), then renew the Lease in a thread while the
    body runs; raise `stop_flag` (kopf's) and set `lost` when it cannot be renewed, or when the
    renewal thread dies of anything else. Hands the Lease over on exit."""
    done = threading.Event()
    with standby_health(liveness):
        elector.acquire(done)

    def step_down() -> None:
        lost.set()
        stop_flag.set()

    def renew() -> None:
        try:
            elector.keep(step_down, done)
        except BaseException:
            log.critical("the Lease renewal stopped on an error: the leader steps down", exc_info=True)
            step_down()

    threading.Thread(target=renew, name="lease renewal", daemon=True).start()
    try:
        yield
    finally:
        done.set()
        elector.release()
