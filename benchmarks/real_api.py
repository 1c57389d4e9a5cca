"""The real API server as operator_scale.py's backend: kube-apiserver and kube-controller-manager 1.36
of the project's control plane (gemma_devcluster.control_plane), on loopback.

The server has no hooks in this process, so the benchmark measures from outside, as a user would:
- a CR's creation is the moment its create call returned here, and a child's the moment this
  process's own watch (Jobs, Deployments) delivered its ADDED event, both on this process's clock
  (`time.perf_counter`: creationTimestamp has a resolution of one second);
- the operator's requests (its creates, and those answered 409) are read from the server's audit
  log, which logs the operator's ServiceAccount alone, at Metadata level;
- the operator runs as the chart runs it: under its own ServiceAccount, bound to the ClusterRole of
  `rbac.cluster_rules()`, with a token the server issued; the training and serving pods' ServiceAccounts
  exist, so the real Job and ReplicaSet controllers create their pods (which stay Pending: there is
  no scheduler).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import psutil
import urllib3
import yaml

from gemma_devcluster import control_plane
from gemma_operator import rbac
from gemma_operator.kube import REQUESTS_IN_FLIGHT, Kube
from gemma_operator.settings import OperatorSettings

CRDS = Path(__file__).resolve().parents[1] / "manifests" / "crds"
OPERATOR_NS, OPERATOR_SA = "gemma-system", "gemma-tpu-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}"
# The operator's requests only, each once, with its answer (no other user's: the log stays small).
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "users": [OPERATOR_USER]}, {"level": "None"}],
}
WATCHED = {"jobs": "Job", "deployments": "Deployment"}  # what the benchmark waits for, in its namespace


class AuditTail:
    """The operator's requests, read from the audit log as it grows."""

    def __init__(self, path: Path) -> None:
        self.path, self._offset = path, 0
        self.creates: collections.Counter = collections.Counter()  # "all", "409"
        self.requests = 0

    def read(self) -> int:
        """Read what was logged since the last call; returns how many operator requests it held."""
        if not self.path.exists():
            return 0
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self._offset += end
        new = 0
        for line in data[:end].splitlines():
            event = json.loads(line)
            if event.get("stage") != "ResponseComplete":
                continue
            new += 1
            if event["verb"] == "create":
                self.creates["all"] += 1
                self.creates["409"] += event.get("responseStatus", {}).get("code") == 409
        self.requests += new
        return new


class RealApi:
    """The benchmark's view of a started control plane: its clients, what it has created, when."""

    name = "kube-apiserver 1.36 (the project's control plane, real Job and ReplicaSet controllers)"
    server_cpu_of = "kube-apiserver, etcd and kube-controller-manager"
    faulty = False

    def __init__(self, plane: control_plane.ControlPlane, namespace: str) -> None:
        self.plane, self.namespace = plane, namespace
        self.kube = self.bare_kube()
        self.created: dict[tuple[str, str], float] = {}
        self._counts: collections.Counter = collections.Counter()
        self._audit = AuditTail(plane.state / "audit.log")
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._watch, args=(plural,), daemon=True, name=f"watch {plural}")
            for plural in WATCHED
        ]
        for thread in self._threads:
            thread.start()

    def kubeconfig(self, workdir: Path) -> Path:
        """The operator's kubeconfig: its ServiceAccount's token, issued by the server."""
        return self.plane.service_account_kubeconfig(OPERATOR_NS, OPERATOR_SA, workdir / "kubeconfig")

    def count(self, plural: str) -> int:
        return self._counts[plural]

    def note(self, obj: dict) -> None:
        plural = {"GemmaFineTune": "gemmafinetunes", "GemmaServe": "gemmaserves"}[obj["kind"]]
        self.created[(plural, obj["metadata"]["name"])] = time.perf_counter()

    def operator_creates(self) -> collections.Counter:
        self._audit.read()
        return collections.Counter(self._audit.creates)

    def operator_requests(self) -> int:
        self._audit.read()
        return self._audit.requests

    async def settle(self, quiet: float = 2.0, limit: float = 1800) -> bool:
        """Wait until the operator has made no request for `quiet` seconds (False: not within
        `limit`). The Job controller updates the Jobs at its own pace (20 requests a second by
        default), and each update wakes the operator, so this lasts as long as the controller."""
        start = since = time.perf_counter()
        while time.perf_counter() - since < quiet:
            if time.perf_counter() - start > limit:
                return False
            if self._audit.read():
                since = time.perf_counter()
            await asyncio.sleep(0.2)
        return True

    def server_cpu(self) -> float:
        """CPU seconds of the control plane's processes."""
        pids = [self.plane.pid(server) for server in ("apiserver", "etcd", "controller-manager")]
        return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)

    def bare_kube(self) -> Kube:
        """A client with the operator's requests in flight (kube.REQUESTS_IN_FLIGHT), as its runner sets them."""
        client = self.plane.client()
        client.configuration.connection_pool_maxsize = REQUESTS_IN_FLIGHT
        return Kube(client, user_agent="operator-scale-benchmark")

    async def before_baseline(self, count: int, namespace: str, limit: float = 600) -> float:
        """Wait until the Job controller has made a pod for every Job in `namespace` (the run
        before), so that the next baseline meets a cluster as quiet as the operator did; returns
        how long that took."""
        start = time.perf_counter()
        core = kubernetes.client.CoreV1Api(self.plane.client())
        while time.perf_counter() - start < limit:
            pods = await asyncio.to_thread(
                core.list_namespaced_pod, namespace, label_selector="batch.kubernetes.io/job-name"
            )
            if len(pods.items) >= count:
                break
            await asyncio.sleep(2)
        return time.perf_counter() - start

    def close(self) -> None:
        self._stop.set()

    def _watch(self, plural: str) -> None:
        """Note when each object of `plural` in the namespace was first seen (its watch's ADDED).
        Each watch resumes from the last version seen and its events stay plain JSON: at 10,000
        Jobs a watch that began afresh would replay every Job, and parsing them into the client's
        models would starve this process's clients."""
        with self.plane.client() as client:
            api = kubernetes.client.BatchV1Api(client) if plural == "jobs" else kubernetes.client.AppsV1Api(client)
            lister = api.list_namespaced_job if plural == "jobs" else api.list_namespaced_deployment
            version = None
            while not self._stop.is_set():
                since = {"resource_version": version} if version else {}
                try:
                    response = lister(
                        self.namespace,
                        watch=True,
                        timeout_seconds=60,
                        _preload_content=False,
                        **since,
                    )
                    try:
                        version = self._take(plural, kubernetes.watch.watch.iter_resp_lines(response), version)
                    finally:
                        response.release_conn()
                except (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError, ValueError):
                    time.sleep(0.5)  # a watch started before the server's watch cache is ready answers 504

    def _take(self, plural: str, lines: Iterator[str], version: str | None) -> str | None:
        """Note the objects a watch delivers; returns the version to resume from (None: list again)."""
        for line in lines:
            event = json.loads(line)
            if event["type"] == "ERROR":  # 410: the version is too old, list again; else try again soon
                time.sleep(0.5)
                return None if event["object"].get("code") == 410 else version
            meta = event["object"]["metadata"]
            version = meta.get("resourceVersion") or version
            if event["type"] == "ADDED" and (plural, meta["name"]) not in self.created:
                self.created[(plural, meta["name"])] = time.perf_counter()
                self._counts[plural] += 1
            if self._stop.is_set():
                break
        return version


def _apply(plane: control_plane.ControlPlane, objects: list[dict]) -> None:
    plane.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(objects))


def install(plane: control_plane.ControlPlane, namespaces: list[str]) -> None:
    """The CRDs, the namespaces with the workloads' ServiceAccounts, and the operator's account and role."""
    plane.kubectl("apply", "--server-side", "-f", str(CRDS))
    plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRDS))
    settings = OperatorSettings()
    for namespace in [OPERATOR_NS, *namespaces]:
        plane.create_namespace(namespace)
    accounts = [settings.training_service_account, settings.serving_service_account]
    _apply(
        plane,
        [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}}
            for namespace in namespaces
            for name in accounts
        ]
        + [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": OPERATOR_SA, "namespace": OPERATOR_NS}},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": OPERATOR_SA},
                "rules": rbac.cluster_rules(),
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": OPERATOR_SA},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": OPERATOR_SA},
                "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": OPERATOR_NS}],
            },
        ],
    )
    deadline = time.monotonic() + 60  # the authorizer learns new bindings from its watch a moment later
    while (
        plane.kubectl("auth", "can-i", "create", "jobs.batch", "--as", OPERATOR_USER, "-A", check=False).stdout.strip()
        != "yes"
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{OPERATOR_USER} may still not create Jobs")
        time.sleep(0.2)


@contextlib.contextmanager
def started(state: Path, namespaces: list[str]) -> Iterator[RealApi]:
    """A fresh control plane in `state`, installed for the benchmark, stopped afterwards; the
    operator's burst goes to the first namespace, the baselines' to the others."""
    with control_plane.running(state, audit=AUDIT_POLICY) as plane:
        install(plane, namespaces)
        api = RealApi(plane, namespaces[0])
        try:
            yield api
        finally:
            api.close()
