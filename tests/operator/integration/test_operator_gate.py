"""The rollout gate against the real operator: a fine-tune run that makes things worse is not
rolled out (the previous output keeps serving), one that improves is, and a pin rolls back.

The training pod's termination message (its TrainResult, evaluation figures included) is played
by the test, as the kubelet would report it; the figures themselves are computed for real by the
training workload's own tests.
"""

from gemma_operator.children import merge, serving, training
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune, serve

NS = "default"
GATE = [{"metric": "evalLoss", "baseline": "better"}, {"metric": "exactMatch", "min": 0.5}]


def evaluated(steps: int) -> finetune:
    return (
        finetune("ft")
        .tpu("v5p")
        .training(steps=steps)
        .set("dataset.evalFraction", 0.1)
        .set("evaluation", {"maxRows": 40})
    )


def figures(loss: float, exact: float) -> list[dict]:
    return [
        {"name": "evalLoss", "value": loss, "baseline": 1.8, "rows": 40},
        {"name": "exactMatch", "value": exact, "baseline": 0.1, "rows": 25},
    ]


async def run_fine_tune(cluster, b, evaluation: list[dict]):
    p = plan_finetune(b.name, NS, b.spec, OperatorSettings())
    train_name, merge_name = training.names(p)[0], merge.name(p)
    await cluster.job(NS, train_name)
    await cluster.job_running(NS, train_name)
    result = {
        "status": "succeeded",
        "step": p.spec.training.steps,
        "checkpoint": f"{p.run_dir}/checkpoints/1",
        "evaluation": evaluation,
    }
    await cluster.job_succeeded(NS, train_name, result)
    await cluster.job(NS, merge_name)
    await cluster.job_succeeded(NS, merge_name, {"status": "succeeded", "output": p.merged_dir}, container="merge")
    await cluster.wait_for(lambda: _succeeded_run(cluster, p.run), message=f"run {p.run} Succeeded")
    return p


async def _succeeded_run(cluster, run):
    ft = await cluster.get("GemmaFineTune", NS, "ft")
    st = ft.get("status") or {}
    return ft if st.get("phase") == "Succeeded" and st.get("run") == run else None


async def served_model(cluster):
    dep = await cluster.get("Deployment", NS, "chat-vllm")
    return (
        dep
        and dep["spec"]["template"]["metadata"]["annotations"][
            serving.REVISION_ANNOTATION.replace("revision", "model-uri")
        ]
    )


async def _serving(cluster, uri):
    return await served_model(cluster) == uri


async def _ready_with_run(cluster, run):
    gsv = await cluster.get("GemmaServe", NS, "chat")
    st = (gsv or {}).get("status") or {}
    return gsv if st.get("phase") == "Ready" and st.get("run") == run else None


async def _condition(cluster, type_, reason):
    gsv = await cluster.get("GemmaServe", NS, "chat")
    cond = next((c for c in (gsv.get("status") or {}).get("conditions", []) if c["type"] == type_), {})
    return cond if cond.get("reason") == reason else None


async def _events(cluster, name, reason):
    return [
        e["message"]
        for e in await cluster.kube.list("Event", NS)
        if e["involvedObject"]["name"] == name and e["reason"] == reason
    ]


async def test_a_worse_run_is_not_rolled_out_a_better_one_is_and_a_pin_rolls_back(operator, cluster):
    await cluster.apply(serve("chat").fine_tune("ft").set("rollout", {"gate": GATE}).obj())
    await cluster.apply(evaluated(100).obj())

    # Run 1 beats the base model: evaluated, recorded and rolled out.
    p1 = await run_fine_tune(cluster, evaluated(100), figures(1.2, 0.7))
    ft = await cluster.get("GemmaFineTune", NS, "ft")
    assert ft["status"]["evaluation"]["run"] == p1.run
    assert ft["status"]["evaluation"]["summary"] == "evalLoss 1.2 (base 1.8)"
    assert ft["status"]["runs"][0]["run"] == p1.run and ft["status"]["runs"][0]["merged"] == p1.merged_dir
    assert await _events(cluster, "ft", "Evaluated") == [
        f"run {p1.run}: evalLoss 1.2 (base 1.8) [40 rows], exactMatch 0.7 (base 0.1) [25 rows]"
    ]
    await cluster.wait_for(lambda: _serving(cluster, p1.merged_dir), message="run 1 rolled out")
    await cluster.deployment_ready(NS, "chat-vllm")
    gsv = await cluster.phase("GemmaServe", NS, "chat", "Ready")
    assert gsv["status"]["run"] == p1.run and gsv["status"]["passedRuns"] == [p1.run]
    assert (await _condition(cluster, "GatePassed", "Passed"))["status"] == "True"

    # Run 2 is worse than the base model: the fine-tune succeeds, run 1 keeps serving.
    await cluster.kube.patch("GemmaFineTune", NS, "ft", {"spec": {"training": {"steps": 200}}})
    p2 = await run_fine_tune(cluster, evaluated(200), figures(2.1, 0.7))
    assert [r["run"] for r in (await cluster.get("GemmaFineTune", NS, "ft"))["status"]["runs"]] == [p2.run, p1.run]
    blocked = await cluster.wait_for(lambda: _condition(cluster, "GatePassed", "MetricFailed"), message="blocked")
    assert blocked["status"] == "False"
    assert (
        blocked["message"]
        == f"run {p2.run}: evalLoss 2.1 is not better than the base model's 1.8: not rolled out; serving run {p1.run}"
    )
    assert await _events(cluster, "chat", "RolloutBlocked") == [blocked["message"]]
    gsv = await cluster.phase("GemmaServe", NS, "chat", "Ready")
    assert gsv["status"]["modelUri"] == p1.merged_dir and gsv["status"]["passedRuns"] == [p1.run]
    assert await served_model(cluster) == p1.merged_dir

    # Run 3 improves: rolled out.
    await cluster.kube.patch("GemmaFineTune", NS, "ft", {"spec": {"training": {"steps": 300}}})
    p3 = await run_fine_tune(cluster, evaluated(300), figures(1.1, 0.8))
    await cluster.wait_for(lambda: _serving(cluster, p3.merged_dir), message="run 3 rolled out")
    await cluster.deployment_ready(NS, "chat-vllm")
    # Ready was already the phase while run 1 served: wait for the status that names run 3.
    gsv = await cluster.wait_for(lambda: _ready_with_run(cluster, p3.run), message="Ready with run 3")
    assert gsv["status"]["passedRuns"] == [p3.run, p1.run]
    await cluster.wait_for(lambda: _condition(cluster, "GatePassed", "Passed"), message="gate passed again")

    # Rolling back is one field: a run listed in passedRuns.
    await cluster.kube.patch(
        "GemmaServe", NS, "chat", {"spec": {"model": {"fineTuneRef": {"name": "ft", "run": p1.run}}}}
    )
    await cluster.wait_for(lambda: _serving(cluster, p1.merged_dir), message="rolled back to run 1")
    # A pin to a run that failed the gate is refused like any other candidate: run 1 keeps serving.
    await cluster.kube.patch(
        "GemmaServe", NS, "chat", {"spec": {"model": {"fineTuneRef": {"name": "ft", "run": p2.run}}}}
    )
    await cluster.wait_for(lambda: _condition(cluster, "GatePassed", "MetricFailed"), message="pinned run blocked")
    assert await served_model(cluster) == p1.merged_dir
    # An unknown run is named in a condition, and nothing changes what is served.
    await cluster.kube.patch(
        "GemmaServe", NS, "chat", {"spec": {"model": {"fineTuneRef": {"name": "ft", "run": "0000aaaa"}}}}
    )
    cond = await cluster.wait_for(lambda: _condition(cluster, "ModelReady", "RunNotFound"), message="RunNotFound")
    assert cond["status"] == "False" and "run 0000aaaa is not one of the fine-tune's runs" in cond["message"]
    assert p1.run in cond["message"] and p3.run in cond["message"]
    stalled = await cluster.wait_for(lambda: _condition(cluster, "Stalled", "RunNotFound"), message="Stalled")
    assert stalled["status"] == "True"
    assert await served_model(cluster) == p1.merged_dir


async def test_nothing_is_deployed_while_no_run_passes(operator, cluster):
    await cluster.apply(serve("chat").fine_tune("ft").set("rollout", {"gate": GATE}).obj())
    await cluster.apply(evaluated(100).obj())
    p1 = await run_fine_tune(cluster, evaluated(100), [{"name": "evalLoss", "value": 1.2, "baseline": 1.8, "rows": 40}])
    cond = await cluster.wait_for(lambda: _condition(cluster, "ModelReady", "RolloutBlocked"), message="blocked")
    assert (
        cond["message"]
        == f"run {p1.run} did not produce exactMatch (it reported evalLoss): nothing passes the gate yet"
    )
    gsv = await cluster.phase("GemmaServe", NS, "chat", "WaitingForModel")
    assert gsv["status"]["passedRuns"] == []
    assert await cluster.get("Deployment", NS, "chat-vllm") is None
