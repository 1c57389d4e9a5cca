"""Leader election through a Lease (leader.py): the Elector against the in-process API with time
moved by hand, then two operator replicas as the chart runs them (replicas: 2): one leads, the
other waits alive and ready, and takes over when the leader stops."""

from __future__ import annotations

import asyncio
import time

import pytest

from gemma_devcluster.apiserver import write_kubeconfig
from gemma_devcluster.processes import free_port
from gemma_operator.children import training
from gemma_operator.kube import Kube
from gemma_operator.leader import LEASE_KINDS, Elector
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune
from tests.support.chart import NAMESPACE, grants, objects, one, role_grants
from tests.support.operator import operator_calls
from tests.support.process import chart_command, http_status, running, stop, until

NS = "default"


class Clock:
    """Monotonic seconds that move when the test says, or by `step` at every reading."""

    def __init__(self, step: float = 0.0) -> None:
        self.now, self.step = 1000.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def elector(apiserver, identity: str, clock: Clock) -> Elector:
    kube = Kube.from_url(str(apiserver.url), LEASE_KINDS)
    return Elector(kube, "ops", "lead", identity, lease_seconds=15, clock=clock)


async def test_a_silent_leader_is_replaced_once_its_lease_expires(apiserver):
    clock = Clock()
    a, b = elector(apiserver, "a", clock), elector(apiserver, "b", clock)
    attempt = lambda e: e.try_acquire_or_renew()  # noqa: E731
    assert await attempt(a) and await attempt(a), "the first candidate leads and renews"
    assert not await attempt(b)
    clock.now += 14
    assert not await attempt(b), "14 s after b first saw a's renewal the lease still holds"
    clock.now += 2
    assert await attempt(b), "a went silent: b takes over after lease duration"
    assert not await attempt(a), "a finds b renewed the lease after its own write"
    lease = apiserver.objects[(apiserver.resource_of("coordination.k8s.io/v1", "leases"), "ops", "lead")]["spec"]
    assert lease["holderIdentity"] == "b" and lease["leaseTransitions"] == 1


async def test_concurrent_candidates_get_one_leader(apiserver):
    clock = Clock()
    candidates = [elector(apiserver, f"c{i}", clock) for i in range(4)]
    won = await asyncio.gather(*(c.try_acquire_or_renew() for c in candidates))
    assert sum(won) == 1


async def test_a_leader_that_cannot_renew_steps_down_and_release_hands_over(apiserver):
    clock = Clock()
    a, b = elector(apiserver, "a", clock), elector(apiserver, "b", clock)
    assert await a.try_acquire_or_renew()
    await a.release()
    assert await b.try_acquire_or_renew(), "a released lease is taken at once"

    lost = []
    a.retry_seconds, a.renew_deadline, clock.step = 0.01, 3, 1.0  # b holds it: a's renewals fail, time passes
    await asyncio.wait_for(a.keep(lambda: lost.append(True), asyncio.Event()), 5)
    assert lost == [True], "a stepped down once its renew deadline passed"
    assert a.write_deadline() is None, "a replica that handed the Lease over may not write"
    clock.step, until = 0.0, b.write_deadline()
    assert until is not None and until > time.monotonic(), "b leads: its writes may go until its renew deadline"
    clock.now += b.renew_deadline
    assert b.write_deadline() <= time.monotonic(), "once b's renew deadline has passed, none may"


def with_ports(command: list[str], health: int, metrics: int) -> list[str]:
    """One replica's command line: on one machine, each needs ports of its own."""
    out = []
    for arg in command:
        if arg.startswith("--liveness="):
            arg = f"--liveness=http://127.0.0.1:{health}/healthz"
        elif arg.startswith("--metrics-port="):
            arg = f"--metrics-port={metrics}"
        out.append(arg)
    return out


@pytest.mark.slow
async def test_a_standby_takes_over_when_the_leader_stops(apiserver, cluster, tmp_path):
    command = chart_command({"replicas": 2}, tmp_path)
    lease_arg = next(a for a in command if a.startswith("--leader-election-lease="))
    namespace, name = lease_arg.split("=", 1)[1].split("/")
    lease_key = (apiserver.resource_of("coordination.k8s.io/v1", "leases"), namespace, name)

    def holder():
        return (apiserver.objects.get(lease_key) or {}).get("spec", {}).get("holderIdentity")

    config = write_kubeconfig(tmp_path / "kubeconfig", str(apiserver.url))
    ports = {pod: (free_port(), free_port()) for pod in ("op-a", "op-b")}
    logs = {pod: tmp_path / f"{pod}.log" for pod in ports}

    def healthy(pod):
        return http_status(f"http://127.0.0.1:{ports[pod][0]}/healthz") == 200

    def serving_metrics(pod):
        return http_status(f"http://127.0.0.1:{ports[pod][1]}/metrics") == 200

    with running(with_ports(command, *ports["op-a"]), config, logs["op-a"], POD_NAME="op-a") as a:
        await until(lambda: healthy("op-a") and holder() == "op-a", message="op-a leads", log=logs["op-a"])
        with running(with_ports(command, *ports["op-b"]), config, logs["op-b"], POD_NAME="op-b") as b:
            await until(lambda: healthy("op-b"), message="the standby answers its probes", log=logs["op-b"])
            assert holder() == "op-a" and not serving_metrics("op-b"), "a standby does not run the operator"

            ft = finetune("ft").tpu("v5p")
            job = training.names(plan_finetune(ft.name, NS, ft.spec, OperatorSettings()))[0]
            await cluster.apply(ft.obj())
            await cluster.job(NS, job)

            await stop(a, logs["op-a"])
            await until(lambda: holder() == "op-b", message="op-b takes over", log=logs["op-b"])
            lease = apiserver.objects[lease_key]["spec"]
            assert lease["leaseTransitions"] == 1 and lease["leaseDurationSeconds"] == 15
            await until(lambda: serving_metrics("op-b"), message="op-b runs the operator", log=logs["op-b"])
            await cluster.kube.patch("GemmaFineTune", NS, "ft", {"spec": {"suspend": True}})
            await cluster.wait_for(lambda: _suspended(cluster, job), message="the new leader acts")
            await stop(b, logs["op-b"])
    assert not holder(), "a replica that stops hands the Lease over"

    objs = objects({"replicas": 2})
    role = one(objs, "Role", next(o["metadata"]["name"] for o in objs if o["kind"] == "Role"))
    assert role["metadata"]["namespace"] == namespace == NAMESPACE
    calls = [c for c in operator_calls(apiserver) if c.resource == "leases"]
    assert not [c for c in calls if not role_grants(role, c)], "Lease requests the Role does not grant"
    unused = [
        (r.get("resourceNames"), v)
        for r in role["rules"]
        for v in r["verbs"]
        if not any(grants({**r, "verbs": [v]}, c) for c in calls)
    ]
    assert not unused, f"granted but never used: {unused}"


async def _suspended(cluster, name):
    return (await cluster.get("Job", NS, name))["spec"].get("suspend") is True
