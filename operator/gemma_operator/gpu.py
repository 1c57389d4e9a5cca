"""The GPU catalogue: GKE accelerator type and GPU count -> machine type, HBM, peak, selectors.

A table of facts, with their sources in docs/reference/gke-gpu.md: the accelerator types are the
values of GKE's `cloud.google.com/gke-accelerator` node label; the machine types per GPU count are
Compute Engine's accelerator-optimized series (A3 High, A3 Mega, A3 Ultra, A2 Ultra, G2), as GKE's
docs and xpk's system_characteristics.py pair them. HBM and peak dense bf16 figures are NVIDIA's
data sheets'. Most host memory figures are unverified there; the operator setting
training_host.memory overrides them. Pods on GPUs are single-node: a pod gets `count` GPUs of one VM.
"""

from __future__ import annotations

from dataclasses import dataclass

from gemma_operator.tpu import NODE_POOL_LABEL, SPOT_LABEL

GPU_RESOURCE = "nvidia.com/gpu"
ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
# GKE taints the GPU nodes of a cluster that also has other nodes nvidia.com/gpu=present:NoSchedule;
# tolerate it whatever its value (GKE also adds this toleration to pods that ask for GPUs).
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
COUNTS = (1, 2, 4, 8)
# JAX on a GPU takes this share of its memory at start and no more (75 % unless told; JAX docs, "GPU
# memory allocation"): the training pod is told the share its HBM fit was planned for.
JAX_MEMORY_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"


@dataclass(frozen=True)
class Machine:
    """A Compute Engine machine type with GPUs: how many, and its memory."""

    name: str
    gpus: int
    memory_gib: float


@dataclass(frozen=True)
class GpuType:
    """One GKE accelerator type."""

    name: str  # the cloud.google.com/gke-accelerator value
    model: str  # for people
    hbm_gib_per_chip: float
    peak_bf16_tflops: float  # dense, without sparsity
    machines: tuple[Machine, ...]  # by GPU count, fewest first
    # vLLM's default --max-num-batched-tokens for its API server on this GPU (vllm/engine/arg_utils.py,
    # get_batch_defaults: 8192 with 70 GiB or more that is not an A100, else 2048).
    vllm_max_num_batched_tokens: int = 2048

    def machine(self, count: int) -> Machine:
        """The machine type whose GPUs a pod of `count` GPUs takes: the one with exactly that many,
        else the smallest with more (a pod then shares the VM with others)."""
        return next(m for m in self.machines if m.gpus >= count)


@dataclass(frozen=True)
class GpuShape:
    """The GPUs of one pod, as GKE schedules them: a type, a count, the machine they are on."""

    type: GpuType
    count: int

    @property
    def machine(self) -> Machine:
        return self.type.machine(self.count)

    @property
    def name(self) -> str:
        """The conventional name, e.g. 2x H100 80GB."""
        return f"{self.count}x {self.type.model}"

    @property
    def host_share(self) -> float:
        """The part of the VM's memory and CPUs that is this pod's: all of it on a VM of its own size."""
        return self.count / self.machine.gpus


def _a3_high(gpus: int) -> Machine:
    # The A3 series' 8-GPU machine has 1,872 GB (Compute Engine docs, "Accelerator-optimized machine
    # family"); the 1-, 2- and 4-GPU machine types have that memory in proportion (unverified).
    return Machine(f"a3-highgpu-{gpus}g", gpus, 234.0 * gpus)


def _a2_ultra(gpus: int) -> Machine:
    return Machine(f"a2-ultragpu-{gpus}g", gpus, 170.0 * gpus)


TYPES: dict[str, GpuType] = {
    t.name: t
    for t in (
        GpuType(
            "nvidia-h100-80gb",
            "H100 80GB",
            hbm_gib_per_chip=80.0,
            peak_bf16_tflops=989.0,
            machines=tuple(_a3_high(n) for n in COUNTS),
            vllm_max_num_batched_tokens=8192,
        ),
        GpuType(
            "nvidia-h100-mega-80gb",
            "H100 Mega 80GB",
            hbm_gib_per_chip=80.0,
            peak_bf16_tflops=989.0,
            machines=(Machine("a3-megagpu-8g", 8, 1872.0),),
            vllm_max_num_batched_tokens=8192,
        ),
        GpuType(
            "nvidia-h200-141gb",
            "H200 141GB",
            hbm_gib_per_chip=141.0,
            peak_bf16_tflops=989.0,
            machines=(Machine("a3-ultragpu-8g", 8, 2952.0),),
            vllm_max_num_batched_tokens=8192,
        ),
        GpuType(
            "nvidia-a100-80gb",
            "A100 80GB",
            hbm_gib_per_chip=80.0,
            peak_bf16_tflops=312.0,
            machines=tuple(_a2_ultra(n) for n in COUNTS),
        ),
        GpuType(
            "nvidia-l4",
            "L4",
            hbm_gib_per_chip=24.0,
            peak_bf16_tflops=121.0,
            # The one-GPU G2 machine with the most memory, then the only machine of each larger count.
            machines=(
                Machine("g2-standard-32", 1, 128.0),
                Machine("g2-standard-24", 2, 96.0),
                Machine("g2-standard-48", 4, 192.0),
                Machine("g2-standard-96", 8, 384.0),
            ),
        ),
    )
}

# The seed paper's on-demand rate of a3-highgpu-2g (2x H100 80GB), $22.12/h in us-central1, per
# GPU-hour (docs/reference gke-gpu.md). No other GPU has a built-in price: set them in the settings.
DEFAULT_PRICE_PER_GPU_HOUR = {"nvidia-h100-80gb": 11.06}


def shape(gpu_type: str, count: int) -> GpuShape:
    """The GPUs of a spec's gpu block; KeyError with a message if unknown."""
    try:
        return GpuShape(TYPES[gpu_type], count)
    except KeyError:
        raise KeyError(f"no GPU type {gpu_type!r}; allowed: {', '.join(TYPES)}") from None


def node_selector(gpus: GpuShape, *, spot: bool = False, node_pool: str | None = None) -> dict[str, str]:
    """Node labels that place a pod on nodes with this GPU (GKE labels every GPU node with its type)."""
    selector = {ACCELERATOR_LABEL: gpus.type.name}
    if spot:
        selector[SPOT_LABEL] = "true"
    if node_pool:
        selector[NODE_POOL_LABEL] = node_pool
    return selector
