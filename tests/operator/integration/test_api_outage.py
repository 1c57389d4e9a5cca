"""The API server going away and coming back: a refused connection is the operator's ApiError, a
standby rides the outage out, a leader that cannot renew stops writing before its Lease can
expire, and the poller and the watches resume once the API answers again."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import kopf
import pytest

from gemma_devcluster.apiserver import write_kubeconfig
from gemma_devcluster.processes import free_port
from gemma_operator import leader, retries, runner
from gemma_operator.children import training
from gemma_operator.kube import UNREACHABLE, USER_AGENT, ApiError, Kube
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from gemma_workloads.config import Progress
from tests.operator.integration.test_leader_election import with_ports
from tests.support.builders import finetune
from tests.support.cluster import PATIENCE
from tests.support.outage import relay
from tests.support.process import chart_command, http_status, running, until

NS = "default"


def closed_port() -> str:
    """The URL of a port nothing listens on: connections to it are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def train_name(name: str) -> str:
    b = finetune(name).tpu("v5p")
    return training.names(plan_finetune(b.name, NS, b.spec, OperatorSettings()))[0]


def progress(step: int) -> str:
    return Progress(step=step, total_steps=100, loss=1.0).line()


async def test_a_refused_connection_is_the_operators_api_error():
    kube = Kube.from_url(closed_port())
    with pytest.raises(ApiError) as refused:
        await kube.get("Job", NS, "any")
    assert refused.value.status == UNREACHABLE and refused.value.transient
    assert "GET /apis/batch/v1/namespaces/default/jobs/any" in str(refused.value)


async def test_a_candidate_that_cannot_reach_the_api_waits_and_never_raises(caplog):
    kube = Kube.from_url(closed_port(), leader.LEASE_KINDS)
    elector = leader.Elector(kube, "ops", "lead", "b", retry_seconds=0.05)
    with pytest.raises(ApiError):
        await elector.try_acquire_or_renew()
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.5, stop.set)
    with caplog.at_level(logging.WARNING, "gemma_operator.leader"):
        assert await elector.acquire(stop) is False, "it waited until told to stop"
    said = [r.getMessage() for r in caplog.records if "cannot reach the API" in r.getMessage()]
    assert len(said) == 1, f"an outage is logged once, not at every attempt: {said}"
    assert not elector.holds()


async def test_after_a_short_outage_the_poller_and_the_watches_resume(apiserver, cluster, caplog):
    async with relay(str(apiserver.url)) as api:
        stop, ready = asyncio.Event(), asyncio.Event()
        controller, tasks = await runner.spawn(api.url, OperatorSettings(progress_poll_seconds=0.3), stop, ready)
        await asyncio.wait_for(ready.wait(), 15)
        try:
            await cluster.apply(finetune("before").tpu("v5p").obj())
            job = await cluster.job(NS, train_name("before"))
            pod = await cluster.job_running(NS, job["metadata"]["name"], log=progress(10))
            await cluster.wait_for(lambda: _step(cluster, "before", 10), message="progress before the outage")
            with caplog.at_level(logging.WARNING, "gemma_operator"):
                await api.cut()
                await asyncio.sleep(3)  # the outage: several polls and watch retries fail meanwhile
                apiserver.pod_logs[(NS, pod["metadata"]["name"])] = progress(20)  # training went on
                await api.restore()
                # A new CR is acted on again: kopf retries its watches every 2 s (runner.configure), and
                # the poller revisits a CR whose generation it has not observed.
                await cluster.apply(finetune("after").tpu("v5p").obj())
                await cluster.job(NS, train_name("after"))
                await cluster.wait_for(lambda: _step(cluster, "before", 20), message="progress read again")
                # The poller's pause doubles with each failed attempt up to POLL_BACKOFF_CAP: on a busy
                # machine the outage spans more attempts, so its next one can come that much later.
                await cluster.wait_for(
                    lambda: _said(caplog, "the poller reaches the API again"),
                    timeout=retries.POLL_BACKOFF_CAP + PATIENCE,
                    message="the poller's next attempt after its back-off",
                )
                apiserver.pod_logs[(NS, pod["metadata"]["name"])] = progress(30)  # no event: only a poll sees it
                await cluster.wait_for(lambda: _step(cluster, "before", 30), message="the poller reads progress")
            assert _count(caplog, "the poller cannot reach the API") == 1, "an outage is logged once"
            assert _count(caplog, "the poller reaches the API again") == 1
            assert controller.broken is None and not stop.is_set(), "no task of the operator died"
        finally:
            await runner.stop(tasks, stop)


def _count(caplog, text: str) -> int:
    return sum(text in r.getMessage() for r in caplog.records if r.name == "gemma_operator")


async def _said(caplog, text: str) -> bool:
    return _count(caplog, text) > 0


async def _step(cluster, name: str, step: int):
    ft = await cluster.get("GemmaFineTune", NS, name)
    return ((ft.get("status") or {}).get("progress") or {}).get("step") == step


@pytest.mark.slow
async def test_two_replicas_through_an_outage_longer_than_the_lease(apiserver, cluster, tmp_path):
    """The chart's two replicas, as processes, behind an API that refuses connections for longer
    than the Lease: the leader stops before its Lease can expire and exits 1 (its Deployment would
    restart it); the standby stays up throughout, leads once the API is back, and acts at once."""
    command = chart_command({"replicas": 2}, tmp_path)
    async with relay(str(apiserver.url)) as api:
        config = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        ports = {pod: (free_port(), free_port()) for pod in ("op-a", "op-b")}
        logs = {pod: tmp_path / f"{pod}.log" for pod in ports}

        def leads(pod: str) -> bool:
            return http_status(f"http://127.0.0.1:{ports[pod][1]}/metrics") == 200  # only a leader serves them

        def alive(pod: str) -> bool:
            return http_status(f"http://127.0.0.1:{ports[pod][0]}/healthz") == 200

        with running(with_ports(command, *ports["op-a"]), config, logs["op-a"], POD_NAME="op-a") as a:
            await until(lambda: leads("op-a"), message="op-a leads", log=logs["op-a"])
            with running(with_ports(command, *ports["op-b"]), config, logs["op-b"], POD_NAME="op-b") as b:
                await until(lambda: alive("op-b"), message="the standby answers its probes", log=logs["op-b"])
                await cluster.apply(finetune("before").tpu("v5p").obj())
                await cluster.job(NS, train_name("before"))

                await api.cut()
                cut_at = time.monotonic()
                code = await asyncio.to_thread(a.wait, leader.LEASE_SECONDS + 5)
                stopped_after = time.monotonic() - cut_at
                assert code == 1, "the leader that lost its Lease exits 1, to be restarted as a candidate"
                assert stopped_after < leader.LEASE_SECONDS, f"it stopped {stopped_after:.1f} s into the outage"
                assert "lost Lease" in logs["op-a"].read_text()
                await asyncio.sleep(max(0.0, leader.LEASE_SECONDS + 2 - (time.monotonic() - cut_at)))
                assert b.poll() is None and alive("op-b"), "the standby never exits for an outage"

                await api.restore()
                await until(lambda: leads("op-b"), message="op-b leads once the API is back", log=logs["op-b"])
                led_at = time.monotonic()
                await cluster.apply(finetune("after").tpu("v5p").obj())
                await cluster.job(NS, train_name("after"), timeout=20)  # at once: not after a back-off
                assert time.monotonic() - led_at < 20
                assert b.poll() is None

    writers = [(t, agent) for t, agent, _ in apiserver.writes if agent.startswith(USER_AGENT)]
    a_writes = [t for t, agent in writers if agent == f"{USER_AGENT} (op-a)"]
    b_writes = [t for t, agent in writers if agent == f"{USER_AGENT} (op-b)"]
    assert a_writes and b_writes and len(a_writes) + len(b_writes) == len(writers), "each write names its replica"
    assert max(a_writes) < min(b_writes), "at no moment did both replicas write"
    assert max(a_writes) < cut_at + leader.RENEW_DEADLINE_SECONDS
    assert not [c for t, agent, c in apiserver.writes if agent.startswith("kopf/")], "kopf itself writes nothing"


async def test_a_background_task_that_dies_stops_the_operator_and_fails_liveness(apiserver, caplog):
    stop, ready = asyncio.Event(), asyncio.Event()
    controller, tasks = await runner.spawn(
        str(apiserver.url), OperatorSettings(progress_poll_seconds=0.05), stop, ready
    )
    await asyncio.wait_for(ready.wait(), 15)
    try:
        assert controller.liveness() == "ok"

        async def a_bug() -> None:
            raise KeyError("a bug, not an API error")

        with caplog.at_level(logging.CRITICAL, "gemma_operator"):
            controller._poll_once = a_bug  # the poller's next pass fails with what it does not handle
            await asyncio.wait_for(stop.wait(), 10)  # the operator is told to stop, not left half alive
        assert "the poller ended: KeyError" in controller.broken
        assert any("the operator stops: the poller ended" in r.getMessage() for r in caplog.records)
        with pytest.raises(kopf.PermanentError, match="the poller ended"):
            controller.liveness()
    finally:
        await runner.stop(tasks, stop)
