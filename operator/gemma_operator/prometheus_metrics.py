"""Prometheus metrics of the operator: what platform teams alert and bill on."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter(
    "gemma_tpu_reconciles", "Reconciles by kind and outcome (ok, error).", ["kind", "outcome"], registry=REGISTRY
)
RECONCILE_SECONDS = Histogram(
    "gemma_tpu_reconcile_seconds",
    "Time to reconcile one resource.",
    ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
PHASE = Gauge("gemma_tpu_resources", "Resources by kind and phase.", ["kind", "phase"], registry=REGISTRY)
ACTIVE_CHIPS = Gauge(
    "gemma_tpu_active_chips",
    "TPU chips (or GPUs, by accelerator) held by running training workloads.",
    ["accelerator"],
    registry=REGISTRY,
)
CHIP_HOURS = Counter(
    "gemma_tpu_chip_hours",
    "TPU chip-hours (or GPU-hours, by accelerator) consumed by training.",
    ["accelerator"],
    registry=REGISTRY,
)

# The figures of each GemmaServe's current benchmark (status.benchmark), by its status field.
BENCHMARK_GAUGES = {
    "ttftP50Ms": (
        "gemma_tpu_benchmark_ttft_p50_seconds",
        "Time to first token, median, of the current revision.",
        1e-3,
    ),
    "ttftP90Ms": ("gemma_tpu_benchmark_ttft_p90_seconds", "Time to first token, p90, of the current revision.", 1e-3),
    "ttftP99Ms": ("gemma_tpu_benchmark_ttft_p99_seconds", "Time to first token, p99, of the current revision.", 1e-3),
    "tpotP50Ms": ("gemma_tpu_benchmark_tpot_p50_seconds", "Time per output token, median.", 1e-3),
    "tpotP99Ms": ("gemma_tpu_benchmark_tpot_p99_seconds", "Time per output token, p99.", 1e-3),
    "itlP50Ms": ("gemma_tpu_benchmark_itl_p50_seconds", "Inter-token latency, median.", 1e-3),
    "itlP99Ms": ("gemma_tpu_benchmark_itl_p99_seconds", "Inter-token latency, p99.", 1e-3),
    "outputTokensPerSecond": ("gemma_tpu_benchmark_output_tokens_per_second", "Output tokens per second.", 1.0),
    "requestsPerSecond": ("gemma_tpu_benchmark_requests_per_second", "Requests completed per second.", 1.0),
    "goodput": ("gemma_tpu_benchmark_goodput_ratio", "Share of requests within the SLO's bounds.", 1.0),
    "errors": ("gemma_tpu_benchmark_errors", "Requests of the benchmark that failed.", 1.0),
    "durationSeconds": ("gemma_tpu_benchmark_duration_seconds", "Wall time of the benchmark.", 1.0),
    "costPerHour": ("gemma_tpu_serving_cost_per_hour_dollars", "Serving cost per hour at the chip price.", 1.0),
    "costPerMillionOutputTokens": (
        "gemma_tpu_benchmark_cost_per_million_output_tokens_dollars",
        "Serving cost per million output tokens at the measured throughput.",
        1.0,
    ),
    "sloMet": ("gemma_tpu_benchmark_slo_met", "1 when the current revision meets spec.benchmark.slo, else 0.", 1.0),
}
_BENCHMARK = {
    field: (Gauge(metric, doc, ["namespace", "name"], registry=REGISTRY), scale)
    for field, (metric, doc, scale) in BENCHMARK_GAUGES.items()
}


def benchmark(namespace: str, name: str, result: dict | None) -> None:
    """Set a GemmaServe's benchmark gauges from status.benchmark; a figure it lacks is removed."""
    for field, (gauge, scale) in _BENCHMARK.items():
        value = (result or {}).get(field)
        if value is None:
            with contextlib.suppress(KeyError):  # never set
                gauge.remove(namespace, name)
        else:
            gauge.labels(namespace, name).set(float(value) * scale)


class PhaseTracker:
    """Keeps the per-phase gauges and the active-chip gauge in step with what was last seen."""

    def __init__(self) -> None:
        self._phase: dict[tuple[str, str, str], str] = {}
        self._chips: dict[tuple[str, str], tuple[str, int]] = {}

    def observe(self, kind: str, namespace: str, name: str, phase: str | None) -> None:
        key = (kind, namespace, name)
        old = self._phase.pop(key, None)
        if old:
            PHASE.labels(kind, old).dec()
        if phase:
            self._phase[key] = phase
            PHASE.labels(kind, phase).inc()

    def chips(self, namespace: str, name: str, accelerator: str, chips: int) -> None:
        old = self._chips.pop((namespace, name), None)
        if old:
            ACTIVE_CHIPS.labels(old[0]).dec(old[1])
        if chips:
            self._chips[(namespace, name)] = (accelerator, chips)
            ACTIVE_CHIPS.labels(accelerator).inc(chips)

    def forget(self, kind: str, namespace: str, name: str) -> None:
        self.observe(kind, namespace, name, None)
        if kind == "GemmaFineTune":
            self.chips(namespace, name, "", 0)


def serve(port: int, address: str = "0.0.0.0") -> None:
    start_http_server(port, addr=address, registry=REGISTRY)
