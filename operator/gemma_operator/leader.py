"""Leader election on a coordination.k8s.io Lease, for an operator Deployment of several replicas.

kopf's peering is not used: it pauses kopf's handlers but not the operator's poller, it pauses
every replica when their priorities are equal (as the pods of one Deployment's are), and it needs
CRDs and cluster-wide RBAC of its own. A Lease taken before kopf starts guards everything the
process does, with a Role on one object in the operator's namespace. As in client-go, holders are
judged by when this replica saw the Lease change (no clock is compared across machines), and a
leader that cannot renew within the deadline stops: Kubernetes restarts it as a candidate.
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

import kopf
import kubernetes
from kubernetes.client.rest import ApiException

log = logging.getLogger("gemma_operator.leader")

LEASE_SECONDS = 15  # a silent leader is replaced after this long
RENEW_DEADLINE_SECONDS = 10  # a leader that could not renew for this long steps down
RETRY_SECONDS = 2


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = kubernetes.client.CoordinationV1Api(client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_seconds, self.retry_seconds, self._clock = lease_seconds, retry_seconds, clock
        self._record: tuple | None = None  # (holder, renewTime, resourceVersion) last seen
        self._seen = 0.0

    def try_acquire_or_renew(self) -> bool:
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            return self._create()
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
        return self._write(
            lambda: self.api.patch_namespaced_lease(
                self.name, self.namespace, {"metadata": {"resourceVersion": rv}, "spec": patch}
            )
        )

    def _create(self) -> bool:
        now = _now()
        body = {
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
        return self._write(lambda: self.api.create_namespaced_lease(self.namespace, body))

    def _write(self, call: Callable) -> bool:
        try:
            lease = call()
        except ApiException as e:
            if e.status == 409:  # someone else wrote first
                return False
            raise
        self._record = (lease.spec.holder_identity, lease.spec.renew_time, lease.metadata.resource_version)
        self._seen = self._clock()
        return True

    def acquire(self, stop: threading.Event) -> bool:
        """Wait until this replica leads (True) or `stop` is set (False)."""
        while not stop.is_set():
            try:
                if self.try_acquire_or_renew():
                    log.info("%s leads through Lease %s/%s", self.identity, self.namespace, self.name)
                    return True
            except ApiException as e:
                log.warning("leader election: %s", e.reason)
            stop.wait(self.retry_seconds)
        return False

    def keep(
        self, on_lost: Callable[[], None], stop: threading.Event, deadline: float = RENEW_DEADLINE_SECONDS
    ) -> None:
        """Renew until `stop`; call `on_lost` when no renewal succeeded for `deadline` seconds."""
        renewed = self._clock()
        while not stop.wait(self.retry_seconds):
            try:
                if self.try_acquire_or_renew():
                    renewed = self._clock()
                    continue
            except ApiException as e:
                log.warning("leader election: %s", e.reason)
            if self._clock() - renewed > deadline:
                log.error("%s lost Lease %s/%s", self.identity, self.namespace, self.name)
                on_lost()
                return

    def release(self) -> None:
        """Hand the Lease over at once (on shutdown) instead of letting it expire."""
        if not self._record or self._record[0] != self.identity:
            return
        patch = {
            "metadata": {"resourceVersion": self._record[2]},
            "spec": {"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": _now()},
        }
        try:
            self.api.patch_namespaced_lease(self.name, self.namespace, patch)
        except ApiException as e:  # it expires on its own
            log.warning("could not release Lease %s/%s: %s", self.namespace, self.name, e.reason)
        self._record = None


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
def leading(
    client: kubernetes.client.ApiClient,
    lease: str,
    registry: kopf.OperatorRegistry,
    liveness: str,
    lost: threading.Event,
) -> Iterator[threading.Event]:
    """Wait to lead through the Lease `NAMESPACE/NAME`, then renew it in a thread; yields kopf's
    stop flag, raised (and `lost` set) if the Lease cannot be renewed. Hands it over on exit."""
    namespace, _, name = lease.partition("/")
    elector = Elector(client, namespace, name, os.environ.get("POD_NAME") or socket.gethostname())
    done = threading.Event()
    with standby_health(liveness):
        elector.acquire(done)
    # kopf waits for its stop flag in a thread of its own, which has to end for the process to
    # exit: the flag goes up when leadership is lost, and at kopf's cleanup.
    stopping = threading.Event()

    @kopf.on.cleanup(registry=registry)
    def lower_the_stop_flag_waiter(**_: object) -> None:
        stopping.set()

    def step_down() -> None:
        lost.set()
        stopping.set()

    threading.Thread(target=elector.keep, args=(step_down, done), name="lease renewal", daemon=True).start()
    try:
        yield stopping
    finally:
        done.set()
        elector.release()
