"""The benchmark Job against the real operator: once per revision, and an operator restarted while
it runs, or after it finished, neither loses its result nor runs it a second time."""

from gemma_operator.children import benchmark
from gemma_operator.plan import plan_serve
from gemma_operator.settings import OperatorSettings
from tests.support.builders import serve
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
