"""Operator settings: what a platform team sets once for its cluster (the Helm chart's values).

Read from a YAML file (`gemma-tpu operator --settings FILE`, or $GEMMA_TPU_SETTINGS); every
field has a default that works on GKE, so an empty file is valid.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from gemma_operator.gpu import DEFAULT_PRICE_PER_GPU_HOUR
from gemma_operator.tpu import DEFAULT_PRICE_PER_CHIP_HOUR

SETTINGS_ENV = "GEMMA_TPU_SETTINGS"


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Images(_Settings):
    """Default images; a CR may override training/merge (spec.images) and serving (spec.vllm.image)."""

    workloads: str = Field(
        default="ghcr.io/gemma-tpu-operator/workloads:0.1.0", description="Image of the training and merge pods."
    )
    # Built by `make images` (workloads/cuda): the same workloads on JAX for CUDA.
    workloads_cuda: str = Field(
        default="ghcr.io/gemma-tpu-operator/workloads-cuda:0.1.0", description="Image of training pods on GPUs."
    )
    # Built from pinned releases by `make images` (workloads/vllm-tpu, workloads/vllm-cpu): vllm-tpu
    # 0.32.0 from PyPI rather than a floating upstream tag; pin a digest in production.
    serving_tpu: str = Field(
        default="ghcr.io/gemma-tpu-operator/vllm-tpu:0.32.0", description="vLLM image of TPU servers."
    )
    serving_cpu: str = Field(
        default="ghcr.io/gemma-tpu-operator/vllm-cpu:0.32.0", description="vLLM image of servers on CPU nodes."
    )
    # Built by `make images` (workloads/vllm-gpu) from vLLM's own CUDA image of the same release.
    serving_gpu: str = Field(
        default="ghcr.io/gemma-tpu-operator/vllm-gpu:0.32.0", description="vLLM image of servers on GPUs."
    )
    # vLLM has moved its multi-host launcher between versions (examples/online_serving/ and
    # examples/ray_serving/); the serving_tpu image puts the one of its release here.
    serving_tpu_ray_script: str = Field(
        default="/opt/vllm/multi-node-serving.sh",
        description="Script in the serving_tpu image that starts a Ray head (multi-host leader) or joins it.",
    )


class Toleration(_Settings):
    """A toleration (core/v1 Toleration) the operator puts on every pod it creates."""

    key: str | None = Field(default=None, description="Taint key; none, with operator Exists: every taint.")
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Exists, or Equal to value.")
    value: str | None = Field(default=None, description="Taint value, with operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect tolerated; none: every effect."
    )

    def manifest(self) -> dict[str, str]:
        """As a pod spec writes it: the fields that are set."""
        out = {"key": self.key, "operator": self.operator, "value": self.value, "effect": self.effect}
        return {k: v for k, v in out.items() if v}


class Resources(_Settings):
    """CPU/memory of the workload containers beside their TPU chips."""

    training_cpu: str = Field(default="8", description="CPU request of a TPU or GPU training pod.")
    # The least a TPU or GPU training pod gets; more when its model needs it (see host.py).
    training_memory: str = Field(
        default="64Gi", description="Least memory of a TPU or GPU training pod; more when its model needs it."
    )
    serving_cpu: str = Field(default="8", description="CPU request of a TPU or GPU vLLM pod.")
    serving_memory: str = Field(default="64Gi", description="Memory request and limit of a TPU or GPU vLLM pod.")
    cpu_profile_cpu: str = Field(default="2", description="CPU request of a pod with accelerator cpu.")
    cpu_profile_memory: str = Field(
        default="8Gi", description="Memory request and limit of a pod with accelerator cpu."
    )


class TrainingHost(_Settings):
    """The TPU or GPU VMs training runs on, beyond their chips: memory and local disk, planned like HBM."""

    memory: dict[str, str] = Field(
        # Unverified (Compute Engine's machine-type tables, not checked against a source here):
        # set them to what `kubectl get node -o yaml` shows as capacity. Known ones are in tpu.py.
        default_factory=lambda: {"ct5p-hightpu-4t": "448Gi", "ct6e-standard-4t": "720Gi", "ct6e-standard-1t": "176Gi"},
        description="Memory of a TPU or GPU VM by machine type; overrides the catalogues (tpu.py, gpu.py).",
    )
    memory_usable_fraction: Annotated[
        float,
        Field(
            gt=0,
            le=1,
            description="Share of a host's memory a training pod may plan for "
            "(GKE keeps the rest for the system and the kubelet's eviction threshold).",
        ),
    ] = 0.9
    runtime_memory: str = Field(
        default="16Gi",
        description="Host memory of the trainer beside the weights: JAX/XLA runtime, compilation, data pipeline.",
    )
    staging_volume: Literal["ephemeralVolume", "emptyDir"] = Field(
        default="ephemeralVolume",
        description="Where a gs:// or hf:// model is staged: a volume claimed for the pod and sized "
        "from the model (ephemeralVolume), or the node's own disk (emptyDir, ephemeral-storage).",
    )
    staging_storage_class: str | None = Field(
        default=None,
        description="StorageClass of the staging volume of merge Jobs, and of TPU "
        "generations and GPU types without an entry in staging_storage_classes; none: the cluster's default.",
    )
    staging_storage_classes: dict[str, str] = Field(
        # A TPU VM attaches only some disk types (v5p: Persistent Disk balanced; v6e: Hyperdisk
        # only), so one class rarely fits every generation.
        default_factory=dict,
        description="StorageClass of the staging volume per TPU generation "
        "(v5p, v6e) or GPU type (nvidia-h200-141gb...), e.g. {v6e: a Hyperdisk Balanced class}; "
        "WaitForFirstConsumer, so the disk is made in the zone of the slice.",
    )
    node_ephemeral_storage: str = Field(
        # GKE's node-sizing page shows a 100 GB boot disk leaving 47,060,071,478 bytes allocatable.
        default="43Gi",
        description="Allocatable ephemeral storage of a training node (emptyDir "
        "staging); raise it with the node pool's --disk-size.",
    )
    unknown_model_size: str = Field(
        default="128Gi", description="Staging size for a model without a preset (its size is unknown)."
    )


class OperatorSettings(_Settings):
    images: Images = Field(default_factory=Images)
    resources: Resources = Field(default_factory=Resources)
    training_host: TrainingHost = Field(default_factory=TrainingHost)
    prices_per_chip_hour: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_PRICE_PER_CHIP_HOUR),
        description="On-demand price per chip-hour by generation, for the cost estimate and status.",
    )
    spot_prices_per_chip_hour: dict[str, float] = Field(
        # None built in: the seed paper quotes no Spot rate. Set them from the TPU price list for your region.
        default_factory=dict,
        description="Spot price per chip-hour by generation; without one, Spot work is priced on demand "
        "(and the plan says so).",
    )
    prices_per_gpu_hour: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_PRICE_PER_GPU_HOUR),
        description="On-demand price per GPU-hour by GKE GPU type (nvidia-h100-80gb...), for the cost "
        "estimate and status; a type without one is priced at nothing.",
    )
    spot_prices_per_gpu_hour: dict[str, float] = Field(
        default_factory=dict,
        description="Spot price per GPU-hour by GKE GPU type; without one, Spot work is priced on demand.",
    )
    # Google's list price of an N2 vCPU with its 4 GB (n2-standard-2 is $0.0971/hour on demand in us-central1),
    # not read from the live price list: an estimate, which the figures priced with it say.
    price_per_vcpu_hour: Annotated[
        float,
        Field(
            ge=0,
            description="Price of one vCPU-hour, with its share of memory, of the nodes that run accelerator cpu "
            "pods: what a CPU replica's requested vCPUs cost (an estimate unless set for your nodes).",
        ),
    ] = 0.0486
    hbm_usable_fraction: Annotated[
        float, Field(gt=0, le=1, description="Share of HBM the pre-flight check may plan for.")
    ] = 0.9
    # The seed paper's v5p-8 run did 1,244 steps of 8 x 3,072 padded tokens in 3.34 h: about 25 %
    # of peak bf16 over the tokens computed (its 5 % counts only the non-padding tokens).
    assumed_mfu: Annotated[
        float, Field(gt=0, le=1, description="Share of peak FLOPs assumed by the duration estimate on TPU.")
    ] = 0.25
    # The training step of this project's workload reached 25.4 % of an H100's and 24.6 % of an H200's
    # 989 TFLOP/s on 30 of the 31B model's layers at seq 3072 with whole-layer remat (docs/benchmarks.md).
    assumed_gpu_mfu: Annotated[
        float, Field(gt=0, le=1, description="Share of peak FLOPs assumed by the duration estimate on GPUs.")
    ] = 0.25
    merge_node_selector: dict[str, str] = Field(
        default_factory=dict, description="Where merge Jobs run (a CPU node pool)."
    )
    serving_node_pools: dict[str, str] = Field(
        default_factory=dict,
        description="Node pool per v6e topology (e.g. '2x4': a ct6e-standard-8t pool), since "
        "2x4 also matches the two-host ct6e-standard-4t shape.",
    )
    pod_tolerations: list[Toleration] = Field(
        default_factory=list,
        description="Tolerations added to every pod the operator creates, beside the TPU and GPU ones: for nodes "
        "dedicated to its workloads (`gemma-tpu dev` adds the one of its local node's taint).",
    )
    workload_user: int = Field(
        default=65532,
        ge=1,
        description="uid and gid every pod the operator creates runs as (the USER of the project's images), "
        "owner of the FUSE mounts and volumes it writes to.",
    )
    merge_fuse_sidecar_memory: str = Field(
        # The driver's default is 256Mi; what writing two multi-GB files needs was not measured.
        default="1Gi",
        description="gke-gcsfuse/memory-limit of the merge's Cloud Storage FUSE sidecar.",
    )
    # The identities the chart creates in each workload namespace (docs/identities.md); None: the
    # namespace's `default` ServiceAccount.
    training_service_account: str | None = Field(
        default="gemma-trainer",
        description="ServiceAccount of training and merge pods of GemmaFineTunes that name none.",
    )
    serving_service_account: str | None = Field(
        default="gemma-server", description="ServiceAccount of vLLM pods of GemmaServes that name none."
    )
    kueue_queue: str | None = Field(
        default=None, description="Kueue LocalQueue for training workloads of CRs that carry no queue label."
    )
    # A training queue's flavor may inject TPU node labels: a CPU merge or a serving pod sent there
    # stays Pending, so each kind of workload has its own queue, none by default.
    merge_kueue_queue: str | None = Field(default=None, description="Kueue LocalQueue for merge Jobs.")
    serving_kueue_queue: str | None = Field(
        default=None, description="Kueue LocalQueue for vLLM servers of GemmaServes that carry no queue label."
    )
    training_env: dict[str, str] = Field(
        # Cuts the first XLA compile of Gemma 4 31B from about 8 to about 3 minutes (seed paper).
        default_factory=lambda: {"XLA_FLAGS": "--xla_llvm_disable_expensive_passes=true"},
        description="Environment variables of every training container.",
    )
    # JAX warns that whoever can write a compilation cache can run code in the processes that read it:
    # each fine-tune's own cache sits beside its checkpoints, and a shared one is the platform's choice.
    compilation_cache_uri: Annotated[
        str | None,
        Field(
            pattern=r"^gs://.+",
            description="A gs:// prefix where the training, evaluation and merge pods of every namespace keep "
            "their compiled XLA programs, one folder per namespace; unset: each GemmaFineTune's own, "
            "<spec.output.uri>/compilation-cache.",
        ),
    ] = None
    termination_grace_seconds: Annotated[
        int, Field(ge=30, description="Time a preempted trainer gets to write its last checkpoint.")
    ] = 120
    # GKE gives Spot pods a best-effort 15 s after the reclaim notice; Standard node pools can raise
    # it to 120 s through the node system configuration from GKE 1.35.0-gke.1171000 (GKE docs,
    # "Spot VMs", graceful shutdown). Raise this setting only with that configuration.
    spot_termination_grace_seconds: Annotated[
        int, Field(ge=0, le=120, description="Grace a Spot pod gets after a reclaim notice (GKE: 15 s by default).")
    ] = 15
    benchmark_max_seconds: Annotated[
        int,
        Field(
            ge=30,
            le=3600,
            description="Longest benchmark a GemmaServe may ask for (spec.benchmark.timeoutSeconds): it shares "
            "the service with real traffic.",
        ),
    ] = 1800
    benchmark_cpu: str = Field(default="1", description="CPU request of a benchmark client pod.")
    benchmark_memory: str = Field(default="2Gi", description="Memory request and limit of a benchmark client pod.")
    progress_poll_seconds: Annotated[
        float, Field(gt=0, description="How often live training progress is read from pod logs.")
    ] = 30.0


def load_settings(path: str | Path | None = None) -> OperatorSettings:
    """Settings from a YAML file (or $GEMMA_TPU_SETTINGS); defaults when neither is given."""
    path = path or os.environ.get(SETTINGS_ENV)
    if not path:
        return OperatorSettings()
    data = yaml.safe_load(Path(path).read_text()) or {}
    return OperatorSettings.model_validate(data)
