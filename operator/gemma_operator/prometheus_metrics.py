"""Prometheus metrics of the operator: what platform teams alert and bill on."""

from __future__ import annotations

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
    "gemma_tpu_active_chips", "TPU chips held by running training workloads.", ["accelerator"], registry=REGISTRY
)
CHIP_HOURS = Counter("gemma_tpu_chip_hours", "TPU chip-hours consumed by training.", ["accelerator"], registry=REGISTRY)


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
