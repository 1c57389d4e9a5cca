"""Two operator replicas elect a leader through a real Lease, and the API server process is killed for
longer than the Lease lasts, then started again: one leader at a time, counted from the server's own
audit log (each replica's requests carry its pod name in their User-Agent), and the server's warm-up
answers after its restart retried without an ERROR line.

The in-process outage test (tests/operator/integration/test_api_outage.py) cuts a relay in front of the
emulator; this one is the real server going away and coming back with its watch caches empty."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
import uuid

import kubernetes

from gemma_operator import log_filters
from gemma_operator.kube import USER_AGENT, Kube, NotLeading
from gemma_operator.leader import Elector, election_client
from tests.control_plane.conftest import operator_process
from tests.support.builders import finetune
from tests.support.cluster import PATIENCE
from tests.support.process import http_status
from tests.support.real_cluster import RealCluster

LEASE_SECONDS = 15  # client-go's default lease duration, the operator's (leader.py)
OUTAGE = LEASE_SECONDS + 5
WRITES = {"create", "update", "patch", "delete"}


def holder(cluster: RealCluster, lease: str) -> str | None:
    coordination = kubernetes.client.CoordinationV1Api(cluster.client)
    with contextlib.suppress(kubernetes.client.ApiException):
        return coordination.read_namespaced_lease(lease, cluster.ns).spec.holder_identity
    return None


def writes_by_replica(plane, replicas: tuple[str, ...]) -> list[tuple[float, str, str]]:
    """(time received, replica, what) of every write the replicas' own client made, Lease renewals left out."""
    out = []
    for e in plane.audit_events():
        agent = e.get("userAgent", "")
        who = next((r for r in replicas if agent.endswith(f"({r})")), None)
        resource = (e.get("objectRef") or {}).get("resource")
        if who and e["verb"] in WRITES and resource != "leases" and e["stage"] == "ResponseComplete":
            received = time.mktime(time.strptime(e["requestReceivedTimestamp"][:19], "%Y-%m-%dT%H:%M:%S"))
            out.append(
                (received + float("0." + e["requestReceivedTimestamp"][20:26] or 0), who, f"{e['verb']} {resource}")
            )
    return sorted(out)


def healthy(op) -> bool:
    return http_status(f"http://127.0.0.1:{op.health_port}/healthz") == 200


def test_one_leader_at_a_time_through_an_api_server_outage_longer_than_the_lease(
    control_plane, namespace, cluster, tmp_path
):
    values = {"replicas": 2}
    lease = "gemma-tpu-operator-leader"
    with (
        operator_process(control_plane, namespace, tmp_path / "a", values, POD_NAME="replica-a") as a,
    ):
        cluster.wait_for(lambda: holder(cluster, lease) == "replica-a", "replica-a to lead")
        with operator_process(control_plane, namespace, tmp_path / "b", values, POD_NAME="replica-b") as b:
            cluster.wait_for(lambda: healthy(b), "the standby's /healthz")
            cluster.apply_cr(finetune("before").cpu_tiny().obj())
            cluster.wait_for(lambda: cluster.batch.list_namespaced_job(cluster.ns).items, "replica-a's Job")

            command = control_plane.kill_apiserver()
            killed = time.time()
            try:
                time.sleep(OUTAGE)
            finally:
                control_plane.start_apiserver(command)
            restarted = time.time()
            cluster.wait_for(lambda: holder(cluster, lease) == "replica-b", "replica-b to lead", PATIENCE)
            cluster.apply_cr(finetune("after").cpu_tiny().obj())
            cluster.wait_for(
                lambda: any(
                    j.metadata.name.startswith("after") for j in cluster.batch.list_namespaced_job(cluster.ns).items
                ),
                "replica-b's Job for a CR created after the outage",
            )
            a_log, b_log = a.log.read_text(), b.log.read_text()
        assert "lost Lease" in a_log, a_log[-3000:]

    writes = writes_by_replica(control_plane, ("replica-a", "replica-b"))
    order = [who for _, who, _ in writes]
    assert order and order == sorted(order), f"the replicas' writes interleave: {writes}"
    assert {"replica-a", "replica-b"} == set(order)
    last_a = max(t for t, who, _ in writes if who == "replica-a")
    first_b = min(t for t, who, _ in writes if who == "replica-b")
    assert last_a < killed + 1 and first_b > restarted - 1, (last_a - killed, first_b - restarted)
    for text in (a_log, b_log):
        warm_up = [
            line for line in text.splitlines() if " ERROR " in line and any(w in line for w in log_filters.WARMING_UP)
        ]
        assert not warm_up, warm_up[:3]


def received(event: dict) -> datetime.datetime:
    return datetime.datetime.fromisoformat(event["requestReceivedTimestamp"])


async def test_no_write_reaches_the_server_after_the_renew_deadline_though_the_pool_was_full(control_plane, namespace):
    """A leader whose connections are all taken (here by watches the server holds open) queues its writes;
    meanwhile it loses the Lease. Each queued write asks the deadline once it has a connection, and is cut
    off at the deadline: the server's audit log shows none of them, and no write of that replica received
    after its last renewal plus the renew deadline."""
    me, lease, renew_deadline = f"pool-{uuid.uuid4().hex[:8]}", "pool-leader", 4.0
    agent = f"{USER_AGENT} ({me})"
    client = kubernetes.config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    client.configuration.connection_pool_maxsize = 4
    elector = Elector(election_client(client, agent), namespace, lease, me, 6, 0.5, renew_deadline)
    assert await elector.acquire(asyncio.Event())
    stop, lost = asyncio.Event(), []
    keeping = asyncio.create_task(elector.keep(lambda: lost.append(True), stop))
    kube = Kube(client, user_agent=agent, write_deadline=elector.write_deadline)
    cm = lambda name: {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}}  # noqa: E731
    await kube.create(cm("before"))

    # The watches hold the pool until the replica has stepped down (they are cancelled then, not timed out:
    # on a loaded machine the steps before the takeover can take longer than any fixed watch length).
    watch = {"watch": "true", "timeoutSeconds": "300"}
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    watches = [asyncio.create_task(kube._call("GET", path, query=watch, raw=True)) for _ in range(4)]

    def watching() -> int:
        events = control_plane.audit_events()
        return sum(
            e["verb"] == "watch" and e.get("userAgent") == agent and e["stage"] == "ResponseStarted" for e in events
        )

    while watching() < 4:  # the pool is full once the server has started every watch's answer
        await asyncio.sleep(0.1)
    queued = [asyncio.create_task(kube.create(cm(f"queued-{i}"))) for i in range(6)]
    coordination = kubernetes.client.CoordinationV1Api(client)
    taken = {"spec": {"holderIdentity": "another-replica", "renewTime": datetime.datetime.now(datetime.UTC)}}
    await asyncio.to_thread(coordination.patch_namespaced_lease, lease, namespace, taken)
    await asyncio.wait_for(keeping, renew_deadline + 60)  # returns once the renew deadline has passed
    for task in watches:  # the pool frees up only now, with the queued writes still waiting for it
        task.cancel()
    await asyncio.gather(*watches, return_exceptions=True)
    outcomes = await asyncio.gather(*queued, return_exceptions=True)
    stop.set()

    assert lost == [True], "the replica stepped down"
    assert all(isinstance(o, NotLeading) for o in outcomes), outcomes
    mine = [e for e in control_plane.audit_events() if e.get("userAgent") == agent and e["stage"] == "ResponseComplete"]
    renewals = [
        e
        for e in mine
        if e["verb"] in WRITES and e["objectRef"]["resource"] == "leases" and e["responseStatus"]["code"] < 300
    ]
    writes = [e for e in mine if e["verb"] in WRITES and e["objectRef"]["resource"] != "leases"]
    assert len(writes) == 1, f"only the write made before the pool filled reached the server: {writes}"
    deadline = max(received(e) for e in renewals) + datetime.timedelta(seconds=renew_deadline)
    assert all(received(e) <= deadline for e in writes), [(received(e), deadline) for e in writes]
