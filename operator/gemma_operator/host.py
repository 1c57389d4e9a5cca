"""Host memory and local disk of a TPU training pod, derived from the model like its HBM.

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

from gemma_operator import fit, tpu
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


def _quantity(size: float) -> str:
    return f"{math.ceil(size / fit.GIB)}Gi"


def host_memory_bytes(slice_: tpu.Slice, settings: OperatorSettings) -> float:
    """A TPU VM's memory: the settings' figure for its machine type, else the catalogue's."""
    known = settings.training_host.memory.get(slice_.machine_type)
    if known is not None:
        return fit.parse_size(known)
    gib = tpu.HOST_MEMORY_GIB.get(slice_.machine_type)
    return math.inf if gib is None else gib * fit.GIB


def plan_host(
    shape: ModelShape | None, model_path: str, dtype: str, slice_: tpu.Slice, settings: OperatorSettings
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
            host_bytes=host_memory_bytes(slice_, settings),
            usable_fraction=h.memory_usable_fraction,
        )
        request = max(request, memory.total)
    if not ModelUri.parse(model_path).staged:
        return HostPlan(memory, _quantity(request), None, None, None)
    storage_class = h.staging_storage_classes.get(slice_.generation) or h.staging_storage_class
    if shape is None:
        return HostPlan(memory, _quantity(request), None, h.unknown_model_size, h.staging_volume, storage_class)
    size = _quantity(fit.staging_disk(shape, 0).total)
    # A volume is made to measure; the node's disk is what the node pool was given.
    disk = h.node_ephemeral_storage if h.staging_volume == "emptyDir" else size
    staging = fit.staging_disk(shape, fit.parse_size(disk))
    return HostPlan(memory, _quantity(request), staging, size, h.staging_volume, storage_class)


def problems(host: HostPlan, what: str, where: str, slice_: tpu.Slice) -> list[str]:
    """What does not fit, with the numbers and the settings to change."""
    out = []
    disks = tpu.GENERATIONS[slice_.generation].disk_types
    if host.staging_volume == "ephemeralVolume" and host.storage_class is None and "pd-balanced" not in disks:
        # GKE's default StorageClasses provision Persistent Disk (GKE docs, "Persistent volumes and
        # dynamic provisioning"), which these VMs cannot attach: the pod would wait for it forever.
        out.append(
            f"spec.model: staging {what} on a volume attached to {where}: its VMs attach only "
            f"{', '.join(disks)} disks, and no StorageClass is set for them; set the operator setting "
            f"training_host.staging_storage_classes.{slice_.generation} to a StorageClass of one of "
            "those types, or stage on the node's disk (training_host.staging_volume: emptyDir)"
        )
    if host.memory is not None and not host.memory.fits:
        out.append(
            f"spec.tpu: {what} does not fit the host memory of {where} for training: {host.memory.describe()}; "
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
