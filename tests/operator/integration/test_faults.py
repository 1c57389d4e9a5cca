"""The operator under API faults injected by the in-process API over real HTTP: writes answered
500 before or after being stored or 429 with Retry-After, watches closed, resumes answered 410,
and an operator restart. Its statuses must end up agreeing with the children that exist."""

import base64
import copy
import logging

import kmock
import pytest_asyncio

from gemma_devcluster.faults import AFTER_WRITE, BEFORE_WRITE, THROTTLED, WATCH_EXPIRED, FaultyApiServer
from gemma_devcluster.kinds import LOCAL_KINDS
from gemma_operator import retries
from gemma_operator.children import merge, training
from gemma_operator.kube import ApiError, Kube
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from tests.operator.integration.test_operator_serve import finish_fine_tune
from tests.support.builders import finetune, serve
from tests.support.cluster import TEST_AGENT
from tests.support.operator import operator as running_operator

NS = "default"


@pytest_asyncio.fixture
async def apiserver():
    """The in-process API with its fault switch (off until a test turns it on)."""
    async with FaultyApiServer(seed=18) as api, kmock.Server(api):
        api.register_defaults()
        yield api


def test_back_off_doubles_up_to_its_cap_and_never_undercuts_retry_after():
    plain = RuntimeError("boom")
    assert [retries.delay(n, plain) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert retries.delay(20, plain) == retries.CAP
    throttled = ApiError(429, "TooManyRequests", "slow down", "PATCH /x", retry_after=5)
    assert retries.delay(1, throttled) == 5 and retries.delay(5, throttled) == 8.0
    assert retries.delay(1, ApiError(429, "TooManyRequests", "", retry_after=3600)) == retries.CAP


def _training_name(b, attempt=1):
    return training.names(plan_finetune(b.name, NS, b.spec, OperatorSettings()), attempt)[0]


async def _children(cluster, name):
    return ((await cluster.get("GemmaFineTune", NS, name)).get("status") or {}).get("children") or {}


async def test_a_lost_status_write_does_not_lose_the_training_job(apiserver, operator, cluster):
    b = finetune("ft").tpu("v5p")
    first, second = _training_name(b), _training_name(b, 2)
    # The status patch right after the ConfigMap and Job creates fails, nothing written.
    apiserver.inject(BEFORE_WRITE, "patch", "gemmafinetunes/status", "ft")
    await cluster.apply(b.obj())
    await cluster.job(NS, first)
    await cluster.wait_for(lambda: _recorded(cluster, "ft", first), message="the training Job recorded in status")
    assert apiserver.injected[(BEFORE_WRITE, "patch gemmafinetunes/status")] == 1
    # Recorded, so its loss spends the retry budget: a new attempt, not attempt 1 again.
    await cluster.kube.delete("Job", NS, first)
    await cluster.job(NS, second)
    await cluster.wait_for(lambda: _recorded(cluster, "ft", second), message="attempt 2 recorded")
    ft = await cluster.get("GemmaFineTune", NS, "ft")
    assert (ft["status"]["attempt"], ft["status"]["restarts"]) == (2, 1)
    assert await cluster.get("Job", NS, first) is None


async def _recorded(cluster, name, job):
    return (await _children(cluster, name)).get("training") == job


async def test_a_degraded_ready_serve_shows_it_within_seconds_despite_faults(apiserver, operator, cluster, caplog):
    await cluster.apply(serve("chat").set("replicas", 2).obj())
    await cluster.wait_for(lambda: cluster.get("Deployment", NS, "chat-vllm"), message="Deployment")
    await cluster.deployment_ready(NS, "chat-vllm", 2)
    await cluster.phase("GemmaServe", NS, "chat", "Ready")
    # The one reconcile that sees a serving pod die is throttled, and its retry fails too.
    apiserver.inject(THROTTLED, "patch", "gemmaserves/status", "chat")
    apiserver.inject(BEFORE_WRITE, "patch", "gemmaserves/status", "chat")
    with caplog.at_level(logging.WARNING, "gemma_operator"):
        died = {"status": {"readyReplicas": 1, "availableReplicas": 1}}  # a serving pod died
        await cluster.kube.patch("Deployment", NS, "chat-vllm", died, status=True)
        gsv = await cluster.phase("GemmaServe", NS, "chat", "Deploying")
    assert gsv["status"]["readyReplicas"] == 1
    assert sum(apiserver.injected.values()) == 2
    failures = [r.getMessage() for r in caplog.records if "failed, retrying" in r.getMessage()]
    assert len(failures) == 2 and all("GemmaServe default/chat" in m for m in failures), failures
    assert (
        "429" in failures[0]
        and "PATCH /apis/gemma-tpu.dev/v1alpha1/namespaces/default/gemmaserves/chat/status" in (failures[0])
    )
    assert "retrying in 1.0 s" in failures[0], "the first back-off is 0.5 s, but the API asked for 1 s"


async def test_a_phase_change_event_lost_with_its_reconcile_is_posted_again_once(apiserver, operator, cluster):
    apiserver.inject(BEFORE_WRITE, "create", "events")  # not stored: must be posted again
    apiserver.inject(AFTER_WRITE, "create", "events")  # stored, answered 500: must not be posted twice
    await cluster.apply(serve("chat").obj())
    await cluster.phase("GemmaServe", NS, "chat", "Deploying")
    await cluster.wait_for(lambda: _event_reasons(cluster, "chat"), message="an Event on chat")
    await cluster.deployment_ready(NS, "chat-vllm")
    await cluster.phase("GemmaServe", NS, "chat", "Ready")
    await cluster.wait_for(lambda: _has_event(cluster, "chat", "Ready"), message="the Ready Event")
    assert sorted(await _event_reasons(cluster, "chat")) == ["Deploying", "Ready"]
    assert sum(apiserver.injected.values()) == 2


async def _event_reasons(cluster, name):
    events = await cluster.kube.list("Event", NS)
    return [e["reason"] for e in events if e["involvedObject"]["name"] == name]


async def _has_event(cluster, name, reason):
    return reason in await _event_reasons(cluster, name)


async def test_a_child_changed_concurrently_is_not_overwritten_unseen(apiserver, cluster):
    kube = Kube.from_url(str(apiserver.url), user_agent="another-writer")
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s", "namespace": NS, "labels": {"a": "1"}},
        "spec": {"ports": [{"port": 80}]},
    }
    await kube.ensure(copy.deepcopy(svc), ("ports",))
    await cluster.kube.patch("Service", NS, "s", {"metadata": {"labels": {"a": "2"}}})  # drifted: to be put back
    read = await kube.get("Service", NS, "s")
    await cluster.kube.patch("Service", NS, "s", {"metadata": {"labels": {"a": "3"}}})  # written after our read
    try:
        await kube.ensure(copy.deepcopy(svc), ("ports",), current=read)
    except ApiError as e:
        assert e.status == 409, e
    else:
        raise AssertionError("a patch computed from a stale read was applied")
    assert (await kube.get("Service", NS, "s"))["metadata"]["labels"] == {"a": "3"}
    await kube.ensure(copy.deepcopy(svc), ("ports",))  # read afresh: applied
    assert (await kube.get("Service", NS, "s"))["metadata"]["labels"] == {"a": "1"}


SECRET = "hf_token_never_to_be_seen_0123456789"


async def test_under_faults_and_a_restart_every_status_agrees_with_its_children(apiserver, cluster, caplog):
    apiserver.write_fault_rate, apiserver.watch_lifetime, apiserver.expire_rate = 0.2, 1.5, 0.3
    for fault in (BEFORE_WRITE, AFTER_WRITE, THROTTLED):  # each at least once where it matters most, then at random
        apiserver.inject(fault, "create", "jobs")
        apiserver.inject(fault, "patch", "gemmafinetunes/status")
    admin = Kube.from_url(str(apiserver.url), LOCAL_KINDS, TEST_AGENT)
    await admin.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hf", "namespace": NS},
            "data": {"token": base64.b64encode(SECRET.encode()).decode()},
        }
    )
    a = finetune("ft-a").tpu("v5p")
    b = (
        finetune("ft-b")
        .tpu("v5p")
        .set("model", {"hfRepo": "google/gemma-4-31B-it", "hfTokenSecretRef": {"name": "hf"}})
    )
    with caplog.at_level(logging.INFO):
        async with running_operator(apiserver):
            for cr in (a, b, serve("chat").fine_tune("ft-a").set("replicas", 2)):
                await cluster.apply(cr.obj())
            await finish_fine_tune(cluster, a)
            await cluster.job(NS, _training_name(b))
        async with running_operator(apiserver):  # a restarted operator picks up where things stand
            await cluster.wait_for(lambda: cluster.get("Deployment", NS, "chat-vllm"), message="Deployment")
            await cluster.deployment_ready(NS, "chat-vllm", 2)
            await finish_fine_tune(cluster, b)
            await cluster.phase("GemmaServe", NS, "chat", "Ready")
            await cluster.deployment_ready(NS, "chat-vllm", 1)  # a serving pod died
            await cluster.phase("GemmaServe", NS, "chat", "Deploying")
            apiserver.calm()  # the final state, without faults, must agree with the children
            await cluster.deployment_ready(NS, "chat-vllm", 2)
            gsv = await cluster.phase("GemmaServe", NS, "chat", "Ready")
    faults = {fault for fault, _ in apiserver.injected}
    assert faults >= {BEFORE_WRITE, AFTER_WRITE, THROTTLED, WATCH_EXPIRED}, apiserver.injected
    assert gsv["status"]["readyReplicas"] == 2
    for cr in (a, b):
        p = plan_finetune(cr.name, NS, cr.spec, OperatorSettings())
        st = (await cluster.get("GemmaFineTune", NS, cr.name))["status"]
        assert st["phase"] == "Succeeded" and st["attempt"] == 1, st
        train = _training_name(cr)
        assert st["children"] == {"configMap": train, "training": train, "merge": merge.name(p)}
        jobs = await cluster.kube.list("Job", NS, f"app.kubernetes.io/instance={cr.name}")
        assert sorted(j["metadata"]["name"] for j in jobs) == sorted([train, merge.name(p)]), "no duplicate"
    everything = [o for (res, _, _), o in apiserver.objects.items() if res.plural != "secrets"]
    assert SECRET not in repr(everything) + caplog.text
    assert base64.b64encode(SECRET.encode()).decode() not in repr(everything) + caplog.text


async def test_a_condition_another_controller_adds_between_read_and_write_survives(apiserver, operator, cluster):
    """Conditions are shared with other controllers (a policy engine, Kueue, a human): the
    operator's status write must not drop one added after its read, however the two interleave."""
    await cluster.apply(serve("chat").obj())
    await cluster.wait_for(lambda: cluster.get("Deployment", NS, "chat-vllm"), message="Deployment")
    await cluster.phase("GemmaServe", NS, "chat", "Deploying")
    theirs = {"type": "PolicyChecked", "status": "True", "reason": "Allowed", "message": "by another controller"}

    async def another_controller_writes() -> None:
        current = await cluster.get("GemmaServe", NS, "chat")
        conditions = [*current["status"]["conditions"], {**theirs, "lastTransitionTime": "2026-01-01T00:00:00Z"}]
        await cluster.kube.patch("GemmaServe", NS, "chat", {"status": {"conditions": conditions}}, status=True)

    # Just before the operator's next status write is stored, the other controller writes first.
    apiserver.interleave(another_controller_writes, "patch", "gemmaserves/status", "chat")
    await cluster.deployment_ready(NS, "chat-vllm")
    gsv = await cluster.phase("GemmaServe", NS, "chat", "Ready")
    assert apiserver.injected[("another writer first", "patch gemmaserves/status")] == 1
    by_type = {c["type"]: c for c in gsv["status"]["conditions"]}
    assert by_type["PolicyChecked"]["message"] == "by another controller", "the other writer's condition survived"
    assert by_type["Available"]["status"] == "True", "and the operator's own conditions were written"
