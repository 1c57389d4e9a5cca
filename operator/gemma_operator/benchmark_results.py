"""A revision's benchmark as the GemmaServe status keeps it: the figures `vllm bench serve`
measured, what serving costs at them, and whether they meet spec.benchmark.slo.

The benchmark pod writes the figures it needs of vLLM's result file (VLLM_FIELDS' values, the
names `vllm bench serve --save-result` writes: vllm/benchmarks/serve.py) as one JSON object to
its termination message, so no pod needs API rights and the operator reads no log. A result is
kept in status.benchmarks under the key of its revision and load: a revision served again, or an
operator restarted, never measures it twice.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gemma_operator import api
from gemma_operator.pricing import ServingCost

# status.benchmark field -> the key of vLLM's result JSON it comes from.
VLLM_FIELDS = {
    "ttftP50Ms": "p50_ttft_ms",
    "ttftP90Ms": "p90_ttft_ms",
    "ttftP99Ms": "p99_ttft_ms",
    "tpotP50Ms": "p50_tpot_ms",
    "tpotP99Ms": "p99_tpot_ms",
    "itlP50Ms": "p50_itl_ms",
    "itlP99Ms": "p99_itl_ms",
    "outputTokensPerSecond": "output_throughput",
    "requestsPerSecond": "request_throughput",
    "completed": "completed",
    "errors": "failed",
    "durationSeconds": "duration",
}
GOODPUT_KEY = "request_goodput"  # requests per second within the goodput bounds (null without them)

# api.BenchmarkSLO field -> (status figure, True: the figure must be at most the bound; False: at least).
SLO_BOUNDS: dict[str, tuple[str, bool]] = {
    "ttft_p99_ms": ("ttftP99Ms", True),
    "tpot_p99_ms": ("tpotP99Ms", True),
    "itl_p99_ms": ("itlP99Ms", True),
    "min_output_tokens_per_second": ("outputTokensPerSecond", False),
}


def goodput_bounds(slo: api.BenchmarkSLO | None) -> list[str]:
    """`vllm bench serve --goodput` terms: it counts a request good within ttft and tpot bounds (ms)."""
    if slo is None:
        return []
    terms = {"ttft": slo.ttft_p99_ms, "tpot": slo.tpot_p99_ms}
    return [f"{name}:{value:g}" for name, value in terms.items() if value is not None]


def read(message: str | None) -> dict[str, Any] | str:
    """The figures of a benchmark pod's termination message, or why there are none."""
    try:
        raw = json.loads(message or "")
    except ValueError:
        tail = (message or "").strip()[-500:]
        return f"the benchmark wrote no result{': ' + tail if tail else ''}"
    if not isinstance(raw, dict):
        return "the benchmark's result is not a JSON object"
    out: dict[str, Any] = {}
    for name, key in VLLM_FIELDS.items():
        value = raw.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = int(value) if name in ("completed", "errors") else round(float(value), 3)
    if not out.get("completed"):
        return f"no request of the benchmark completed ({out.get('errors', 0)} failed)"
    goodput, rps = raw.get(GOODPUT_KEY), raw.get(VLLM_FIELDS["requestsPerSecond"])
    if isinstance(goodput, (int, float)) and isinstance(rps, (int, float)) and rps > 0:
        out["goodput"] = round(min(1.0, goodput / rps), 4)
    return out


def with_cost(figures: dict[str, Any], cost: ServingCost | None, replicas: int) -> dict[str, Any]:
    """costPerHour (replicas x chips, GPUs or vCPUs x the price of one an hour) and its price per million
    output tokens at the measured throughput, with the rate and where it comes from (a setting, or an
    estimate)."""
    if cost is None or not replicas:
        return figures
    hourly = cost.hourly(replicas)
    out = {**figures, "costPerHour": round(hourly, 4), "priceBasis": cost.price.describe()}
    tps = figures.get("outputTokensPerSecond")
    if tps:
        out["costPerMillionOutputTokens"] = round(hourly / (tps * 3600) * 1e6, 4)
    return out


@dataclass(frozen=True)
class Verdict:
    met: bool
    message: str


def judge(figures: Mapping[str, Any], slo: api.BenchmarkSLO) -> Verdict:
    """Every bound of the SLO against the figures; a figure the benchmark did not produce misses."""
    misses, within = [], []
    for field, (figure, at_most) in SLO_BOUNDS.items():
        bound = getattr(slo, field)
        if bound is None:
            continue
        value = figures.get(figure)
        if value is None:
            misses.append(f"{figure} was not measured")
        elif (value <= bound) if at_most else (value >= bound):
            within.append(f"{figure} {value:g}")
        else:
            misses.append(f"{figure} {value:g} is {'above' if at_most else 'below'} {bound:g}")
    if misses:
        return Verdict(False, "; ".join(misses))
    return Verdict(True, "within the SLO: " + ", ".join(within))


def describe(figures: Mapping[str, Any]) -> str:
    """The headline figures, for Events and `make demo`."""
    parts = [
        f"TTFT p50/p99 {figures['ttftP50Ms']:g}/{figures['ttftP99Ms']:g} ms" if "ttftP99Ms" in figures else "",
        f"TPOT p99 {figures['tpotP99Ms']:g} ms" if "tpotP99Ms" in figures else "",
        f"{figures['outputTokensPerSecond']:g} output tokens/s" if "outputTokensPerSecond" in figures else "",
        f"{figures['completed']} requests, {figures.get('errors', 0)} failed" if "completed" in figures else "",
        f"${figures['costPerMillionOutputTokens']:g}/1M output tokens"
        + (f" at {figures['priceBasis']}" if "priceBasis" in figures else "")
        if "costPerMillionOutputTokens" in figures
        else "",
    ]
    return ", ".join(p for p in parts if p)
