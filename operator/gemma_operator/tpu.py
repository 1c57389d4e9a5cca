"""The TPU catalogue: generation and topology -> chips, hosts, machine type, HBM, selectors.

A table of facts, with their sources in docs/reference (gke-tpu.md): v5p topologies and the
ct5p-hightpu-4t machine from the Cloud TPU v5p docs and xpk's system_characteristics.py; v6e
machine types (1t/4t/8t) from the v6e docs and xpk. HBM and peak figures are the spec sheet's.
List prices are the seed paper's on-demand rates (unverified against the live price list), so
they are defaults of the operator settings, not constants.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

TPU_RESOURCE = "google.com/tpu"
ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
SPOT_LABEL = "cloud.google.com/gke-spot"
RESERVATION_LABEL = "cloud.google.com/reservation-name"
RESERVATION_AFFINITY_LABEL = "cloud.google.com/reservation-affinity"
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
# GKE taints TPU nodes google.com/tpu=present:NoSchedule; tolerate it whatever its value.
TPU_TOLERATION = {"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
# Node auto-provisioning (and Autopilot) taints Spot nodes cloud.google.com/gke-spot=true:NoSchedule
# (GKE docs, "Spot VMs": node taints for Spot VMs).
SPOT_TOLERATION = {"key": SPOT_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Slice:
    """One TPU slice shape as GKE schedules it."""

    generation: str
    topology: str
    chips: int
    hosts: int
    machine_type: str

    @property
    def chips_per_host(self) -> int:
        return self.chips // self.hosts

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def name(self) -> str:
        """The conventional name, e.g. v5p-8 (v5p counts TensorCores: 2 per chip) or v6e-8."""
        cores = self.chips * GENERATIONS[self.generation].cores_per_chip
        return f"{self.generation}-{cores}"


@dataclass(frozen=True)
class Generation:
    name: str
    gke_accelerator: str
    hbm_gib_per_chip: float
    peak_bf16_tflops: float
    cores_per_chip: int
    default_topology: str
    # The disk types its VMs attach (Cloud TPU docs, "Storage options for Cloud TPU data": TPU
    # generation and supported disk types): a volume of any other type is provisioned but never attached.
    disk_types: tuple[str, ...] = ()
    slices: dict[str, Slice] = field(default_factory=dict)

    def slice(self, topology: str | None) -> Slice:
        topology = topology or self.default_topology
        try:
            return self.slices[topology]
        except KeyError:
            allowed = ", ".join(self.slices)
            raise KeyError(f"{self.name} has no topology {topology!r}; allowed: {allowed}") from None


def _v5p(topology: str) -> Slice:
    chips = prod(int(d) for d in topology.split("x"))
    return Slice("v5p", topology, chips, max(1, chips // 4), "ct5p-hightpu-4t")


def _v6e(topology: str) -> Slice:
    chips = prod(int(d) for d in topology.split("x"))
    if chips == 1:
        return Slice("v6e", topology, 1, 1, "ct6e-standard-1t")
    if chips == 4:
        return Slice("v6e", topology, 4, 1, "ct6e-standard-4t")
    if chips == 8:  # the single-host v6e-8 on ct6e-standard-8t (the serving shape)
        return Slice("v6e", topology, 8, 1, "ct6e-standard-8t")
    return Slice("v6e", topology, chips, chips // 4, "ct6e-standard-4t")


_V5P_TOPOLOGIES = [
    "2x2x1",
    "2x2x2",
    "2x2x4",
    "2x4x4",
    "4x4x4",
    "4x4x8",
    "4x8x8",
    "8x8x8",
    "8x8x16",
    "8x16x16",
    "16x16x16",
    "16x16x24",
]
_V6E_TOPOLOGIES = ["1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"]

GENERATIONS: dict[str, Generation] = {
    "v5p": Generation(
        "v5p",
        "tpu-v5p-slice",
        hbm_gib_per_chip=95.0,
        peak_bf16_tflops=459.0,
        cores_per_chip=2,
        default_topology="2x2x1",
        disk_types=("pd-balanced", "hyperdisk-ml"),
        slices={t: _v5p(t) for t in _V5P_TOPOLOGIES},
    ),
    "v6e": Generation(
        "v6e",
        "tpu-v6e-slice",
        hbm_gib_per_chip=32.0,
        peak_bf16_tflops=918.0,
        cores_per_chip=1,
        default_topology="2x4",
        disk_types=("hyperdisk-balanced", "hyperdisk-ml"),
        slices={t: _v6e(t) for t in _V6E_TOPOLOGIES},
    ),
}

# Host memory of a TPU VM by machine type, where a source gives it: 1536 GiB per 8-chip v6e host
# (v6e docs). The others are operator settings (settings.TrainingHost.memory), not facts here.
HOST_MEMORY_GIB = {"ct6e-standard-8t": 1536.0}

# The seed paper's on-demand rates ($16.80/h per v5p-8, $21.52/h per v6e-8), per chip-hour.
DEFAULT_PRICE_PER_CHIP_HOUR = {"v5p": 4.20, "v6e": 2.69}


def resolve(accelerator: str, topology: str | None) -> Slice | None:
    """The slice for a spec's tpu block; None for the cpu profile. KeyError with a message if unknown."""
    if accelerator == "cpu":
        return None
    return GENERATIONS[accelerator].slice(topology)


def node_selector(
    slice_: Slice, *, spot: bool = False, reservation: str | None = None, node_pool: str | None = None
) -> dict[str, str]:
    """Node labels that place a pod on this slice shape."""
    gen = GENERATIONS[slice_.generation]
    selector = {ACCELERATOR_LABEL: gen.gke_accelerator, TOPOLOGY_LABEL: slice_.topology}
    if spot:
        selector[SPOT_LABEL] = "true"
    if reservation:
        selector[RESERVATION_LABEL] = reservation
        selector[RESERVATION_AFFINITY_LABEL] = "specific"
    if node_pool:
        selector[NODE_POOL_LABEL] = node_pool
    return selector
