"""What a plan costs: the price per chip-hour (or GPU-hour) a workload is charged at, and a
service's running cost.

Prices are operator settings. The built-in on-demand rates are the seed paper's (tpu.py, gpu.py),
not read from Google's live price list, so a plan says when it uses them. No Spot rate is built in:
without one in the settings, Spot work is priced on demand and the plan says so. A GPU type without
a rate in the settings is priced at nothing, and the plan says that too.
"""

from __future__ import annotations

from dataclasses import dataclass

from gemma_operator.gpu import DEFAULT_PRICE_PER_GPU_HOUR, TYPES
from gemma_operator.settings import OperatorSettings
from gemma_operator.tpu import DEFAULT_PRICE_PER_CHIP_HOUR

HOURS_PER_30_DAYS = 30 * 24


@dataclass(frozen=True)
class Price:
    per_chip_hour: float  # per TPU chip-hour, or per GPU-hour
    basis: str  # "spot" or "on demand"
    source: str  # the setting the rate comes from, and whether it is verified
    spot_priced_on_demand: bool = False  # a Spot workload without a Spot rate in the settings
    device: str = "chip"  # what an hour is of: a TPU chip or a GPU

    def describe(self) -> str:
        basis = ", a Spot slice priced on demand" if self.spot_priced_on_demand else f" {self.basis}"
        return f"${self.per_chip_hour:.2f}/{self.device}-hour{basis} ({self.source})"


@dataclass(frozen=True)
class _Rates:
    """The settings and built-in rates of one kind of device."""

    on_demand: str  # the settings field
    spot: str
    built_in: dict[str, float]
    device: str


_TPU = _Rates("prices_per_chip_hour", "spot_prices_per_chip_hour", DEFAULT_PRICE_PER_CHIP_HOUR, "chip")
_GPU = _Rates("prices_per_gpu_hour", "spot_prices_per_gpu_hour", DEFAULT_PRICE_PER_GPU_HOUR, "GPU")


def chip_hour_price(settings: OperatorSettings, accelerator: str, spot: bool) -> Price:
    """The rate of one chip-hour of `accelerator` (a TPU generation), or one GPU-hour (a GKE GPU
    type): the Spot rate on Spot when the settings give one."""
    r = _GPU if accelerator in TYPES else _TPU
    spot_rates: dict[str, float] = getattr(settings, r.spot)
    if spot and accelerator in spot_rates:
        return Price(spot_rates[accelerator], "spot", f"settings.{r.spot}", device=r.device)
    rates: dict[str, float] = getattr(settings, r.on_demand)
    rate = rates.get(accelerator, 0.0)
    if accelerator not in rates:
        source = f"no {accelerator} rate in settings.{r.on_demand}: priced at nothing"
    elif rate == r.built_in.get(accelerator):
        source = f"built-in list price, unverified: set settings.{r.on_demand}"
    else:
        source = f"settings.{r.on_demand}"
    if spot:
        source = f"no {accelerator} rate in settings.{r.spot}; {source}"
    return Price(rate, "on demand", source, spot_priced_on_demand=spot, device=r.device)


CPU_PRICE_DEFAULT = OperatorSettings.model_fields["price_per_vcpu_hour"].default


def cpu_cores(quantity: str) -> float:
    """A Kubernetes CPU quantity as cores: `2`, `1.5`, or millicores `500m` (the forms a CPU request takes)."""
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def vcpu_hour_price(settings: OperatorSettings) -> Price:
    """The rate of one vCPU-hour of the nodes the cpu profile runs on."""
    rate = settings.price_per_vcpu_hour
    source = "settings.price_per_vcpu_hour" + (
        ", an estimate: set it for your nodes" if rate == CPU_PRICE_DEFAULT else ""
    )
    return Price(rate, "on demand", source, device="vCPU")


@dataclass(frozen=True)
class ServingCost:
    """A service's cost per replica, and at the replica counts it runs between."""

    price: Price
    chips: float  # TPU chips or GPUs a replica holds, or the vCPUs a CPU replica requests
    replicas: dict[str, int]  # "replicas", or "minReplicas" and "maxReplicas" under autoscaling

    @property
    def per_replica_hour(self) -> float:
        return self.chips * self.price.per_chip_hour

    def hourly(self, replicas: int) -> float:
        return replicas * self.per_replica_hour

    def per_30_days(self, replicas: int) -> float:
        return self.hourly(replicas) * HOURS_PER_30_DAYS
