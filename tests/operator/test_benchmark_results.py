"""Reading a benchmark pod's result, judging it against an SLO, and the gauges that export it."""

from __future__ import annotations

import json

import pytest

from gemma_operator import api, benchmark_results, prometheus_metrics
from gemma_operator.pricing import Price, ServingCost

# The keys `vllm bench serve --save-result` writes (vllm/benchmarks/serve.py, benchmark()).
VLLM_RESULT = {
    "duration": 10.0,
    "completed": 20,
    "failed": 0,
    "request_throughput": 2.0,
    "request_goodput": 1.5,
    "output_throughput": 100.0,
    "p50_ttft_ms": 100.0,
    "p90_ttft_ms": 150.0,
    "p99_ttft_ms": 200.0,
    "p50_tpot_ms": 10.0,
    "p99_tpot_ms": 12.0,
    "p50_itl_ms": 9.0,
    "p99_itl_ms": 30.0,
}


def test_the_figures_are_vllms_under_the_status_names():
    figures = benchmark_results.read(json.dumps(VLLM_RESULT))
    assert figures["ttftP99Ms"] == 200.0 and figures["tpotP50Ms"] == 10.0 and figures["itlP99Ms"] == 30.0
    assert figures["outputTokensPerSecond"] == 100.0 and figures["requestsPerSecond"] == 2.0
    assert (figures["completed"], figures["errors"], figures["durationSeconds"]) == (20, 0, 10.0)
    assert figures["goodput"] == 0.75, "goodput is a share of the requests"


@pytest.mark.parametrize(
    "message, why",
    [
        ("Traceback: ConnectionRefusedError", "the benchmark wrote no result: Traceback: ConnectionRefusedError"),
        (json.dumps([1]), "the benchmark's result is not a JSON object"),
        (
            json.dumps({**VLLM_RESULT, "completed": 0, "failed": 20}),
            "no request of the benchmark completed (20 failed)",
        ),
    ],
)
def test_a_result_without_figures_says_why(message, why):
    assert benchmark_results.read(message) == why


def test_cost_follows_replicas_chips_and_throughput():
    cost = ServingCost(Price(2.0, "on demand", "test"), chips=8, replicas={"replicas": 2})
    out = benchmark_results.with_cost({"outputTokensPerSecond": 1000.0}, cost, replicas=2)
    assert out["costPerHour"] == 32.0  # 2 replicas x 8 chips x $2
    assert out["costPerMillionOutputTokens"] == pytest.approx(32.0 / 3.6, abs=1e-4)  # 3.6M tokens an hour
    assert benchmark_results.with_cost({"outputTokensPerSecond": 1.0}, None, 1) == {"outputTokensPerSecond": 1.0}
    assert out["priceBasis"] == "$2.00/chip-hour on demand (test)", "the figure says what it is priced at"
    assert benchmark_results.describe(out).endswith("$8.8889/1M output tokens at $2.00/chip-hour on demand (test)")


def test_every_bound_of_the_slo_is_judged_and_a_missing_figure_misses():
    figures = benchmark_results.read(json.dumps(VLLM_RESULT))
    assert benchmark_results.judge(figures, api.BenchmarkSLO(ttft_p99_ms=200, min_output_tokens_per_second=100)).met
    verdict = benchmark_results.judge(figures, api.BenchmarkSLO(ttft_p99_ms=199.9, itl_p99_ms=10))
    assert not verdict.met
    assert verdict.message == "ttftP99Ms 200 is above 199.9; itlP99Ms 30 is above 10"
    slow = benchmark_results.judge(figures, api.BenchmarkSLO(min_output_tokens_per_second=101))
    assert slow.message == "outputTokensPerSecond 100 is below 101"
    no_itl = benchmark_results.judge({"ttftP99Ms": 1.0}, api.BenchmarkSLO(itl_p99_ms=5))
    assert (no_itl.met, no_itl.message) == (False, "itlP99Ms was not measured")


def test_goodput_bounds_are_vllms_goodput_terms():
    # vllm bench serve --goodput accepts ttft, tpot and e2el in ms (serve.py, check_goodput_args).
    slo = api.BenchmarkSLO(ttft_p99_ms=500, tpot_p99_ms=50, itl_p99_ms=80)
    assert benchmark_results.goodput_bounds(slo) == ["ttft:500", "tpot:50"]


def test_the_gauges_follow_the_status_and_go_with_it():
    figures = benchmark_results.read(json.dumps(VLLM_RESULT))
    prometheus_metrics.benchmark("ns", "svc", {**figures, "sloMet": True})
    value = prometheus_metrics.REGISTRY.get_sample_value
    labels = {"namespace": "ns", "name": "svc"}
    assert value("gemma_tpu_benchmark_ttft_p99_seconds", labels) == pytest.approx(0.2)
    assert value("gemma_tpu_benchmark_output_tokens_per_second", labels) == 100.0
    assert value("gemma_tpu_benchmark_slo_met", labels) == 1.0
    prometheus_metrics.benchmark("ns", "svc", None)
    assert value("gemma_tpu_benchmark_ttft_p99_seconds", labels) is None
