"""What a plan costs: the price per chip-hour a workload is charged at, and a service's running cost.

Prices are operator settings. The built-in on-demand rates are the seed paper's (tpu.py), not read
from Google's live price list, so a plan says when it uses them. No Spot rate is built in: without
one in the settings, Spot work is priced on demand and the plan says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from gemma_operator.settings import OperatorSettings
from gemma_operator.tpu import DEFAULT_PRICE_PER_CHIP_HOUR

HOURS_PER_30_DAYS = 30 * 24


@dataclass(frozen=True)
class Price:
    per_chip_hour: float
    basis: str  # "spot" or "on demand"
    source: str  # the setting the rate comes from, and whether it is verified
    spot_priced_on_demand: bool = False  # a Spot workload without a Spot rate in the settings

    def describe(self) -> str:
        basis = ", a Spot slice priced on demand" if self.spot_priced_on_demand else f" {self.basis}"
        return f"${self.per_chip_hour:.2f}/chip-hour{basis} ({self.source})"


def chip_hour_price(settings: OperatorSettings, accelerator: str, spot: bool) -> Price:
    """The rate of one chip-hour of `accelerator`: the Spot rate on Spot when the settings give one."""
    if spot and accelerator in settings.spot_prices_per_chip_hour:
        return Price(settings.spot_prices_per_chip_hour[accelerator], "spot", "settings.spot_prices_per_chip_hour")
    rate = settings.prices_per_chip_hour.get(accelerator, 0.0)
    if rate == DEFAULT_PRICE_PER_CHIP_HOUR.get(accelerator):
        source = "built-in list price, unverified: set settings.prices_per_chip_hour"
    else:
        source = "settings.prices_per_chip_hour"
    if spot:
        source = f"no {accelerator} rate in settings.spot_prices_per_chip_hour; {source}"
    return Price(rate, "on demand", source, spot_priced_on_demand=spot)


@dataclass(frozen=True)
class ServingCost:
    """A service's cost per replica, and at the replica counts it runs between."""

    price: Price
    chips: int
    replicas: dict[str, int]  # "replicas", or "minReplicas" and "maxReplicas" under autoscaling

    @property
    def per_replica_hour(self) -> float:
        return self.chips * self.price.per_chip_hour

    def hourly(self, replicas: int) -> float:
        return replicas * self.per_replica_hour

    def per_30_days(self, replicas: int) -> float:
        return self.hourly(replicas) * HOURS_PER_30_DAYS
