"""The benchmark Job against the real operator: once per revision; an operator restarted while it
runs, or after it finished, neither loses its result nor runs it a second time; a run that misses
its SLO is rolled back once, without a loop."""

from gemma_operator.children import benchmark
from gemma_operator.plan import plan_serve
from gemma_operator.settings import OperatorSettings
from tests.operator.integration.test_operator_serve import deployment_model, finish_fine_tune
from tests.support.builders import finetune, serve
from tests.support.operator import operator as running_operator
from tests.support.operator import settled

NS = "default"
# The keys `vllm bench serve` returns (vllm/benchmarks/serve.py), as the benchmark pod reports them.
RESULT = {
    "duration": 4.0,
    "completed": 8,
    "failed": 0,
    "request_throughput": 2.0,
    "output_throughput": 64.0,
    "p50_ttft_ms": 120.0,
    "p90_ttft_ms": 180.0,
    "p99_ttft_ms": 240.0,
    "p50_tpot_ms": 15.0,
    "p99_tpot_ms": 25.0,
}


async def _benchmark_jobs(cluster) -> list[str]:
    jobs = await cluster.kube.list("Job", NS, "app.kubernetes.io/component=benchmark")
    return sorted(j["metadata"]["name"] for j in jobs)


async def _figures(cluster):
    gsv = await cluster.get("GemmaServe", NS, "chat")
    current = (gsv.get("status") or {}).get("benchmark") or {}
    return gsv if current.get("state") == "Succeeded" else None


async def test_a_restart_neither_loses_the_result_nor_runs_the_benchmark_twice(apiserver, cluster):
    cr = serve("chat").set("benchmark", {"numPrompts": 8, "slo": {"ttftP99Ms": 500}})
    job = benchmark.name(plan_serve("chat", NS, cr.spec, OperatorSettings()))
    async with running_operator(apiserver):
        await cluster.apply(cr.obj())
        await cluster.wait_for(lambda: cluster.get("Deployment", NS, "chat-vllm"), message="Deployment")
        assert await _benchmark_jobs(cluster) == [], "not before the revision is Ready"
        await cluster.deployment_ready(NS, "chat-vllm")
        await cluster.phase("GemmaServe", NS, "chat", "Ready")
        await cluster.job(NS, job)
        await cluster.job_running(NS, job, container=benchmark.CONTAINER)
    async with running_operator(apiserver) as controller:  # restarted while the benchmark runs
        await settled(cluster, controller, "GemmaServe", NS, "chat")
        assert await _benchmark_jobs(cluster) == [job]
        await cluster.job_succeeded(NS, job, RESULT, container=benchmark.CONTAINER)
        gsv = await cluster.wait_for(lambda: _figures(cluster), message="status.benchmark")
    figures = gsv["status"]["benchmark"]
    assert (figures["ttftP99Ms"], figures["outputTokensPerSecond"], figures["sloMet"]) == (240.0, 64.0, True)
    await cluster.kube.delete("Job", NS, job)  # its TTL ran out
    async with running_operator(apiserver) as controller:  # restarted after it finished
        await settled(cluster, controller, "GemmaServe", NS, "chat")
        assert await _benchmark_jobs(cluster) == [], "a measured revision is not measured again"
        gsv = await cluster.get("GemmaServe", NS, "chat")
    assert gsv["status"]["benchmark"] == figures and gsv["status"]["phase"] == "Ready"


def _job_of(cr, p) -> str:
    return benchmark.name(plan_serve("chat", NS, cr.spec, OperatorSettings(), model_uri=p.merged_dir))


async def _deploys(cluster, model: str) -> bool:
    return await deployment_model(cluster, "chat-vllm") == model


async def _serving(cluster, run: str):
    gsv = await cluster.get("GemmaServe", NS, "chat")
    st = gsv.get("status") or {}
    return gsv if st.get("run") == run and st.get("phase") == "Ready" else None


async def test_a_run_that_misses_its_slo_is_rolled_back_once(operator, cluster):
    ft = finetune("ft").tpu("v5p")
    cr = serve("chat").fine_tune("ft").set("benchmark", {"slo": {"ttftP99Ms": 300}, "onMiss": "rollback"})
    await cluster.apply(ft.obj())
    await cluster.apply(cr.obj())
    p1 = await finish_fine_tune(cluster, ft)
    await cluster.wait_for(lambda: cluster.get("Deployment", NS, "chat-vllm"), message="Deployment")
    await cluster.deployment_ready(NS, "chat-vllm")
    first = _job_of(cr, p1)
    await cluster.job(NS, first)
    await cluster.job_succeeded(NS, first, RESULT, container=benchmark.CONTAINER)  # TTFT p99 240 ms: within
    gsv = await cluster.wait_for(lambda: _figures(cluster), message="the first run's figures")
    run1 = gsv["status"]["run"]

    await cluster.kube.patch("GemmaFineTune", NS, "ft", {"spec": {"training": {"steps": 200}}})  # a new run
    p2 = await finish_fine_tune(cluster, finetune("ft").tpu("v5p").training(steps=200))
    await cluster.phase("GemmaServe", NS, "chat", "Deploying")
    await cluster.deployment_ready(NS, "chat-vllm")
    second = _job_of(cr, p2)
    await cluster.job(NS, second)
    slow = {**RESULT, "p99_ttft_ms": 900.0}
    await cluster.job_succeeded(NS, second, slow, container=benchmark.CONTAINER)
    # Rolled back to the first run's revision; its figures are kept, so nothing is measured again.
    await cluster.wait_for(lambda: _deploys(cluster, p1.merged_dir), message="the Deployment rolled back")
    await cluster.deployment_ready(NS, "chat-vllm")
    gsv = await cluster.wait_for(lambda: _serving(cluster, run1), message="the first run served again")
    st = gsv["status"]
    assert st["modelUri"] == p1.merged_dir and [r["run"] for r in st["rejectedRuns"]] == [p2.run]
    assert st["rejectedRuns"][0]["message"] == "ttftP99Ms 900 is above 300"
    await settled(cluster, operator, "GemmaServe", NS, "chat")
    assert await _benchmark_jobs(cluster) == sorted([first, second]), "no third benchmark, no loop"
    gsv = await cluster.get("GemmaServe", NS, "chat")
    assert gsv["status"]["run"] == run1 and gsv["status"]["phase"] == "Ready"
    events = await cluster.kube.list("Event", NS)
    assert [e["reason"] for e in events if e.get("reason") == "RolledBack"] == ["RolledBack"]
