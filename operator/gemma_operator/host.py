"""Host memory and local disk of a TPU or GPU training pod, derived from the model like its HBM.

A gs:// or hf:// model is copied to local files before Tunix's loader maps them: Tunix stages
gs:// folders into $TMPDIR, huggingface_hub downloads into $HF_HOME. Both point at a staging
volume on disk. In a memory-backed volume (/dev/shm, the seed paper's choice on a bare TPU VM)
the files would count against the container's memory limit: 58 GiB for 31B, an OOM kill at
load. The pod's memory request and limit cover what the loader holds (see fit.host_memory);
/dev/shm stays, bounded, and counted. The merge Job downloads an hf:// base onto the same kind
of disk (it reads gs:// in place).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gemma_operator import fit, gpu, tpu
from gemma_operator.model_shapes import ModelShape
from gemma_operator.model_uri import ModelUri
from gemma_operator.settings import OperatorSettings

STAGING_DIR = "/staging"
SHM_SIZE = "1Gi"  # JAX's and the data loader's shared memory; the model never goes there


@dataclass(frozen=True)
class HostPlan:
    memory: fit.MemoryEstimate | None  # None: the model's size is unknown
    memory_request: str  # the pod's memory request and limit
    staging: fit.MemoryEstimate | None  # None: nothing staged, or its size is unknown
    staging_size: str | None  # size of the staging volume; None: the model is read in place
    staging_volume: str | None  # "ephemeralVolume" or "emptyDir" (settings.training_host)
    storage_class: str | None = None  # of an ephemeralVolume; None: the cluster's default

    @property
    def env(self) -> dict[str, str]:
        """Where Tunix and huggingface_hub put the model's files."""
        if self.staging_size is None:
            return {}
        return {"TMPDIR": STAGING_DIR, "HF_HOME": f"{STAGING_DIR}/huggingface"}


@dataclass(frozen=True)
class Node:
    """The VM a pod runs on, as far as its memory and disks go."""

    machine_type: str
    storage_key: str  # a TPU generation or a GPU type: its key in training_host.staging_storage_classes
    disk_types: tuple[str, ...]  # the disk types its VMs attach; empty: not known, not checked
    memory_gib: float | None  # the catalogue's figure for the whole VM; None: not known
    share: float = 1.0  # the pod's part of the VM: less where pods of fewer GPUs share a larger VM


def tpu_node(slice_: tpu.Slice) -> Node:
    """A TPU VM of a slice: a pod per VM."""
    gen = tpu.GENERATIONS[slice_.generation]
    return Node(slice_.machine_type, slice_.generation, gen.disk_types, tpu.HOST_MEMORY_GIB.get(slice_.machine_type))


def gpu_node(gpus: gpu.GpuShape) -> Node:
    """The GPU VM a pod's GPUs are on, of which the pod has the part its GPUs are of the VM's."""
    m = gpus.machine
    return Node(m.name, gpus.type.name, (), m.memory_gib, gpus.host_share)


def _quantity(size: float) -> str:
    return f"{math.ceil(size / fit.GIB)}Gi"


def host_memory_bytes(node: Node, settings: OperatorSettings) -> float:
    """The pod's part of its VM's memory: the settings' figure for the machine type, else the catalogue's."""
    known = settings.training_host.memory.get(node.machine_type)
    if known is not None:
        return fit.parse_size(known) * node.share
    return math.inf if node.memory_gib is None else node.memory_gib * fit.GIB * node.share


def plan_host(
    shape: ModelShape | None, model_path: str, dtype: str, node: Node, settings: OperatorSettings
) -> HostPlan:
    """Requests and staging of one training host; without a preset the settings' sizes stand in."""
    h = settings.training_host
    memory = None
    request: float = fit.parse_size(settings.resources.training_memory)
    if shape is not None:
        memory = fit.host_memory(
            shape,
            dtype=dtype,
            runtime_bytes=fit.parse_size(h.runtime_memory),
            shm_bytes=fit.parse_size(SHM_SIZE),
            host_bytes=host_memory_bytes(node, settings),
            usable_fraction=h.memory_usable_fraction,
        )
        request = max(request, memory.total)
    if not ModelUri.parse(model_path).staged:
        return HostPlan(memory, _quantity(request), None, None, None)
    storage_class = h.staging_storage_classes.get(node.storage_key) or h.staging_storage_class
    if shape is None:
        return HostPlan(memory, _quantity(request), None, h.unknown_model_size, h.staging_volume, storage_class)
    size = _quantity(fit.staging_disk(shape, 0).total)
    # A volume is made to measure; the node's disk is what the node pool was given.
    disk = h.node_ephemeral_storage if h.staging_volume == "emptyDir" else size
    staging = fit.staging_disk(shape, fit.parse_size(disk))
    return HostPlan(memory, _quantity(request), staging, size, h.staging_volume, storage_class)


def problems(host: HostPlan, what: str, where: str, node: Node, field: str = "spec.tpu") -> list[str]:
    """What does not fit, with the numbers and the settings to change; `field` is the spec's block
    of the accelerator (spec.tpu or spec.gpu)."""
    out = []
    disks = node.disk_types
    if host.staging_volume == "ephemeralVolume" and host.storage_class is None and disks and "pd-balanced" not in disks:
        # GKE's default StorageClasses provision Persistent Disk (GKE docs, "Persistent volumes and
        # dynamic provisioning"), which these VMs cannot attach: the pod would wait for it forever.
        out.append(
            f"spec.model: staging {what} on a volume attached to {where}: its VMs attach only "
            f"{', '.join(disks)} disks, and no StorageClass is set for them; set the operator setting "
            f"training_host.staging_storage_classes.{node.storage_key} to a StorageClass of one of "
            "those types, or stage on the node's disk (training_host.staging_volume: emptyDir)"
        )
    if host.memory is not None and not host.memory.fits:
        out.append(
            f"{field}: {what} does not fit the host memory of {where} for training: {host.memory.describe()}; "
            "use a machine type with more memory, or set the operator setting training_host.memory to the "
            "nodes' real capacity"
        )
    if host.staging is not None and not host.staging.fits:
        out.append(
            f"spec.model: staging {what} on the node disk of {where}: {host.staging.describe()}; create the node "
            "pool with a larger --disk-size and raise training_host.node_ephemeral_storage, or stage on a "
            "volume (training_host.staging_volume: ephemeralVolume)"
        )
    return out
