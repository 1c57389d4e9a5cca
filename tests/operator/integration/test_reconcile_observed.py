"""A reconcile does only the work its inputs changed (operator/gemma_operator/observed.py): the
echoes of the operator's own writes cost nothing, a child whose applied form is unchanged is
neither read nor written again, and yet a change someone else makes is always acted on.

The operator here does not poll (`progress_poll_seconds` an hour): only watch events wake it, so
every correction below is made by the event path and the copies it keeps, not by a poll."""

import asyncio
import collections

import pytest_asyncio

from gemma_operator import runner
from gemma_operator.children import training
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune
from tests.support.operator import operator_calls, settled

NS = "default"


@pytest_asyncio.fixture
async def quiet_operator(apiserver):
    """The real kopf operator, woken by watch events alone."""
    stop, ready = asyncio.Event(), asyncio.Event()
    controller, tasks = await runner.spawn(
        str(apiserver.url), OperatorSettings(progress_poll_seconds=3600), stop, ready
    )
    await asyncio.wait_for(ready.wait(), 15)
    yield controller
    await runner.stop(tasks, stop)


def training_name(b) -> str:
    return training.names(plan_finetune(b.name, NS, b.spec, OperatorSettings()))[0]


async def pending_with_children(cluster, controller, b) -> str:
    """Apply the fine-tune; once its ConfigMap and Job exist and its status says Pending, the Job's name."""
    name = training_name(b)
    await cluster.apply(b.obj())
    await cluster.job(NS, name)
    await cluster.phase("GemmaFineTune", NS, b.name, "Pending")
    await settled(cluster, controller, "GemmaFineTune", NS, b.name)
    return name


async def touched(cluster, controller, name: str) -> None:
    """A new version of the fine-tune (an annotation no one reads), once a reconcile has read it."""
    value = str(len(cluster.api.writes))  # new on every call
    done = await cluster.kube.patch("GemmaFineTune", NS, name, {"metadata": {"annotations": {"tests/touch": value}}})
    version = int(done["metadata"]["resourceVersion"])

    async def read() -> bool:
        return int(controller.reconciled.get(("GemmaFineTune", NS, name)) or 0) >= version

    await cluster.wait_for(read, message=f"a reconcile of {name} at resourceVersion {version}")


async def echoes_handled(cluster, controller, name: str, children: list[tuple[str, str]]) -> None:
    """Once the operator's watches have delivered, and its handlers taken, the CR and its children as they
    are now (the echoes of its own creates and status write): what it did about them is then all done."""

    async def seen() -> bool:
        cr = await cluster.get("GemmaFineTune", NS, name)
        if controller.handled.get(("GemmaFineTune", NS, name)) != cr["metadata"]["resourceVersion"]:
            return False
        for kind, child in children:
            copy = controller.watched_children.get(kind, NS, child) or {"metadata": {}}
            if (
                copy["metadata"].get("resourceVersion")
                != (await cluster.get(kind, NS, child))["metadata"]["resourceVersion"]
            ):
                return False
        return True

    await cluster.wait_for(seen, message=f"the operator's watches to deliver {name} and its children as they are")


def by_verb_and_resource(calls) -> collections.Counter:
    out: collections.Counter = collections.Counter()
    for call, n in calls.items():
        out[(call.verb, call.resource)] += n
    return out


async def test_a_new_fine_tune_costs_its_writes_and_no_read(quiet_operator, cluster):
    """Its first reconcile takes the CR as watched and its children as absent (it has no status
    yet); the watch events of its own creates and status write are echoes, skipped."""
    b = finetune("fresh").tpu("v5p")
    name = training_name(b)
    await cluster.apply(b.obj())
    await cluster.job(NS, name)
    await cluster.phase("GemmaFineTune", NS, "fresh", "Pending")
    await echoes_handled(cluster, quiet_operator, "fresh", [("ConfigMap", name), ("Job", name)])
    calls = by_verb_and_resource(operator_calls(cluster.api))
    assert calls[("create", "configmaps")] == 1 and calls[("create", "jobs")] == 1
    assert calls[("patch", "gemmafinetunes/status")] == 1, "one status write, not one per echo"
    reads = {k: n for k, n in calls.items() if k[0] == "get"}
    assert reads == {}, f"the echoes of its own writes were read again: {reads}"


async def test_an_unchanged_child_is_neither_read_nor_applied_again(quiet_operator, cluster):
    b = finetune("steady").tpu("v5p")
    await pending_with_children(cluster, quiet_operator, b)
    before = by_verb_and_resource(operator_calls(cluster.api))
    await touched(cluster, quiet_operator, "steady")  # a new version of the CR: reconciled in full
    after = by_verb_and_resource(operator_calls(cluster.api))
    new = {k: n - before[k] for k, n in after.items() if n != before[k]}
    assert new[("get", "gemmafinetunes")] == 1, new
    writes = {k: n for k, n in new.items() if k[0] not in ("get", "list")}
    assert writes == {}, f"an unchanged child was applied again, or an unchanged status written: {writes}"
    # What the lifecycle declares it decides on is read (the Job, its pods, refused pod creations);
    # the ConfigMap, which no decision reads, is compared with the copy its watch delivered.
    assert ("get", "configmaps") not in new, new


async def test_a_childs_drift_is_put_back_by_its_watch_event(quiet_operator, cluster):
    """The copy the operator keeps of its child is what it compares with; another writer's change
    comes as a new version of the child, which is not an echo, and is undone."""
    b = finetune("drift").tpu("v5p")
    name = await pending_with_children(cluster, quiet_operator, b)
    want = (await cluster.get("ConfigMap", NS, name))["data"]
    await cluster.kube.patch("ConfigMap", NS, name, {"data": {"train.json": "{}"}})
    await cluster.wait_for(lambda: _data_is(cluster, name, want), message="the training config restored")
    labels = (await cluster.get("Job", NS, name))["metadata"]["labels"]
    await cluster.kube.patch("Job", NS, name, {"metadata": {"labels": {"app.kubernetes.io/managed-by": None}}})
    await cluster.wait_for(lambda: _labels_are(cluster, name, labels), message="the Job's labels restored")
    # And the operator's own repair is an echo again: a second drift is undone as the first was.
    await cluster.kube.patch("ConfigMap", NS, name, {"data": {"train.json": "[]"}})
    await cluster.wait_for(lambda: _data_is(cluster, name, want), message="the training config restored again")


async def _data_is(cluster, name, data):
    return (await cluster.get("ConfigMap", NS, name))["data"] == data


async def _labels_are(cluster, name, labels):
    return (await cluster.get("Job", NS, name))["metadata"].get("labels") == labels


async def test_a_deleted_child_is_made_again(quiet_operator, cluster):
    b = finetune("lost").tpu("v5p")
    name = await pending_with_children(cluster, quiet_operator, b)
    await cluster.kube.delete("ConfigMap", NS, name)
    await cluster.wait_for(lambda: cluster.get("ConfigMap", NS, name), message="the ConfigMap made again")


async def test_a_condition_another_writer_adds_after_a_skipped_echo_is_kept(quiet_operator, cluster):
    """The status write tests the conditions it was decided on: a condition written by another
    controller is a version the operator never decided on, read and kept, and a later status
    write of the operator's own does not drop it."""
    b = finetune("shared").tpu("v5p")
    name = await pending_with_children(cluster, quiet_operator, b)
    current = await cluster.get("GemmaFineTune", NS, "shared")
    theirs = {
        "type": "PolicyChecked",
        "status": "True",
        "reason": "Allowed",
        "message": "by another controller",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    conditions = [*current["status"]["conditions"], theirs]
    await cluster.kube.patch("GemmaFineTune", NS, "shared", {"status": {"conditions": conditions}}, status=True)
    await cluster.job_running(NS, name)  # the operator writes its status again: Training
    ft = await cluster.phase("GemmaFineTune", NS, "shared", "Training")
    by_type = {c["type"]: c for c in ft["status"]["conditions"]}
    assert by_type["PolicyChecked"]["message"] == "by another controller"


async def test_what_it_keeps_goes_with_the_resources(quiet_operator, cluster):
    """The operator's memory does not grow with history: what it keeps of a CR and its children
    is forgotten when they are deleted (the API server's garbage collector deletes the children)."""
    names = [f"gone-{i}" for i in range(3)]
    for n in names:
        await pending_with_children(cluster, quiet_operator, finetune(n).tpu("v5p"))
    assert len(quiet_operator.versions) == 3 and len(quiet_operator.watched_children) == 6
    for n in names:
        await cluster.kube.delete("GemmaFineTune", NS, n)

    async def forgotten():
        c = quiet_operator
        return not (len(c.versions) or len(c.watched_children) or c.reconciled or c._locks)

    await cluster.wait_for(forgotten, message="every CR and child forgotten")
