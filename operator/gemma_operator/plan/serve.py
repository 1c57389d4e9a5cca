"""GemmaServe spec + operator settings -> a ServePlan: the slice or GPUs, the HBM fit at the
tensor-parallel size, the start-up budget and the disk an hf:// model is downloaded to, or a SpecError."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gemma_operator import api, fit, host, mounts, pricing
from gemma_operator.model_shapes import PRESETS, ModelShape, infer_preset
from gemma_operator.model_uri import HF_SCHEME, ModelUri
from gemma_operator.plan.common import Placement, SpecError, check_paths, digest, hf_source_checks, parse, placement
from gemma_operator.settings import OperatorSettings

# A first start of 31B on v6e-8 compiles for about 8 minutes, 10 with the download (seed paper).
MIN_STARTUP_SECONDS = {"gemma4-31b": 600, "gemma4-26b-a4b": 600}


def default_startup_seconds(place: Placement, shape: ModelShape | None) -> int:
    """Loading plus compilation (XLA on TPU; torch.compile and CUDA graphs on GPU) grows with the
    model: 5 minutes plus 20 s per billion parameters (15 minutes for 31B), 30 minutes when the
    size is unknown, 10 on CPU."""
    if not place.accelerated:
        return 600
    if shape is None:
        return 1800
    return max(600, int(300 + 20 * shape.params / 1e9))


@dataclass(frozen=True)
class ServePlan:
    name: str
    namespace: str
    spec: api.GemmaServeSpec
    placement: Placement
    model_uri: str | None  # None: waiting for the referenced fine-tune
    served_name: str
    preset: str | None
    tensor_parallel: int
    memory: fit.MemoryEstimate | None
    image: str
    service_account: str | None
    queue: str | None
    startup_seconds: int
    staging: host.HostPlan | None = None  # the disk an hf:// model is downloaded to (its staging fields)
    cost: pricing.ServingCost | None = None
    warnings: tuple[str, ...] = ()  # what may go wrong but is not refused

    @property
    def multi_host(self) -> bool:
        return self.placement.hosts > 1

    @property
    def revision(self) -> str:
        """Changes whenever the pods must be replaced: a new model or a new pod-relevant spec."""
        # The gate and the pin choose the model (model_uri): by themselves they replace no pod.
        # The benchmark measures pods; it replaces none. An unset gpu is left out, so that the
        # revisions of services from before the field existed are what they were.
        unset = {"gpu": True} if self.spec.gpu is None else {}
        spec = self.spec.model_dump(
            mode="json",
            exclude={
                "replicas": True,
                "benchmark": True,
                "rollout": {"gate"},
                "model": {"fine_tune_ref": {"run"}},
                **unset,
            },
        )
        return digest({"model": self.model_uri, "spec": spec})


def _memory(
    spec: api.GemmaServeSpec, place: Placement, shape: ModelShape | None, preset: str | None, tp: int
) -> tuple[fit.MemoryEstimate | None, list[str]]:
    """HBM per chip or GPU at this tensor-parallel size, known with a model preset on TPU chips or GPUs."""
    if shape is None or place.device is None:
        return None, []
    memory = fit.serving_memory(
        shape,
        tp=tp,
        max_model_len=spec.vllm.max_model_len,
        hbm_gib=place.device.hbm_gib_per_chip,
        gpu_memory_utilization=spec.vllm.gpu_memory_utilization,
        max_num_batched_tokens=spec.vllm.max_num_batched_tokens
        or (place.gpus.type.vllm_max_num_batched_tokens if place.gpus else None),
        unit=f"per {place.device_word}",
    )
    if memory.fits:
        return memory, []
    larger = "more GPUs (gpu.count) or a GPU with more memory" if place.gpus else "a larger topology"
    return memory, [
        f"{place.field}: {preset} does not fit {place.label} for serving: {memory.describe()} "
        f"(TP {tp}, maxModelLen {spec.vllm.max_model_len}); use {larger} or a shorter maxModelLen"
    ]


def _startup(spec: api.GemmaServeSpec, place: Placement, shape: ModelShape | None) -> tuple[int, list[str]]:
    startup = spec.startup_timeout_seconds or default_startup_seconds(place, shape)
    if shape is not None and place.accelerated and startup < MIN_STARTUP_SECONDS.get(shape.preset, 0):
        return startup, [
            f"spec.startupTimeoutSeconds: {startup} is too short for {shape.preset}: loading and XLA compilation "
            f"take up to {MIN_STARTUP_SECONDS[shape.preset] // 60} minutes on a first start"
        ]
    return startup, []


def _staging(
    uri: str | None, place: Placement, shape: ModelShape | None, preset: str | None, settings: OperatorSettings
) -> tuple[host.HostPlan | None, list[str]]:
    """Every host downloads an hf:// model whole before loading it: onto a disk planned like
    training's, not the node's boot disk, which a 31B download fills (the kubelet then evicts the pod)."""
    if place.node is None or not uri or ModelUri.parse(uri).scheme != HF_SCHEME:
        return None, []
    staging = replace(host.plan_host(shape, uri, "bfloat16", place.node, settings), memory=None)
    return staging, host.problems(staging, preset or "the model", place.host_label, place.node, place.field)


def _cost(spec: api.GemmaServeSpec, place: Placement, settings: OperatorSettings) -> pricing.ServingCost | None:
    """What the service's TPU slices, GPUs or vCPUs cost: a replica holds a whole slice (or its GPUs, or
    the vCPUs a CPU pod requests), and an autoscaled service runs between minReplicas and maxReplicas."""
    a = spec.autoscaling
    replicas = (
        {"replicas": spec.replicas} if a is None else {"minReplicas": a.min_replicas, "maxReplicas": a.max_replicas}
    )
    if not place.accelerated:
        vcpus = pricing.cpu_cores(settings.resources.cpu_profile_cpu)
        return pricing.ServingCost(pricing.vcpu_hour_price(settings), vcpus, replicas)
    return pricing.ServingCost(pricing.chip_hour_price(settings, place.accelerator, place.spot), place.chips, replicas)


def _benchmark_problems(spec: api.GemmaServeSpec, settings: OperatorSettings) -> list[str]:
    """A benchmark longer than the cluster allows (the schema's own bound is the absolute one)."""
    b = spec.benchmark
    if b is None or b.timeout_seconds <= settings.benchmark_max_seconds:
        return []
    return [
        f"spec.benchmark.timeoutSeconds: {b.timeout_seconds} is above this cluster's limit: 30 to "
        f"{settings.benchmark_max_seconds} seconds (operator setting benchmark_max_seconds)"
    ]


def _default_image(place: Placement, settings: OperatorSettings) -> str:
    """vLLM's build for the device: TPU, CUDA, or CPU."""
    if place.gpus:
        return settings.images.serving_gpu
    return settings.images.serving_tpu if place.accelerated else settings.images.serving_cpu


def plan_serve(
    name: str,
    namespace: str,
    spec: dict[str, Any] | api.GemmaServeSpec,
    settings: OperatorSettings,
    *,
    model_uri: str | None = None,
    fine_tune_preset: str | None = None,
    labels: dict[str, str] | None = None,
) -> ServePlan:
    """Everything the serving children need. `model_uri` is the resolved fineTuneRef output."""
    spec = spec if isinstance(spec, api.GemmaServeSpec) else parse(api.GemmaServeSpec, spec)
    v6e = spec.tpu is not None and spec.tpu.accelerator == "v6e"
    node_pool = settings.serving_node_pools.get(spec.tpu.topology or "2x4") if spec.tpu and v6e else None
    place = placement(spec.tpu, spec.gpu, node_pool=node_pool)
    preset = spec.model.preset or infer_preset(spec.model.hf_repo) or fine_tune_preset
    shape = PRESETS.get(preset) if preset else None
    tp = place.chips or 1
    memory, problems = _memory(spec, place, shape, preset, tp)
    prompts = spec.benchmark.prompts_uri if spec.benchmark else None
    problems += check_paths(
        {"spec.model.uri": spec.model.uri, "spec.benchmark.promptsUri": prompts}, spec.storage, place.accelerator
    )
    problems += _benchmark_problems(spec, settings)
    source_problems, warnings = hf_source_checks(spec.model.hf_repo, spec.model.preset, spec.model.hf_token_secret_ref)
    problems += source_problems
    problems += mounts.storage_problems(spec.storage, (*mounts.SERVING, host.STAGING_DIR))
    startup, too_short = _startup(spec, place, shape)
    uri = spec.model.uri or (str(ModelUri.hf(spec.model.hf_repo)) if spec.model.hf_repo else model_uri)
    staging, no_room = _staging(uri, place, shape, preset, settings)
    if problems := problems + too_short + no_room:
        raise SpecError(problems)
    image = spec.vllm.image or _default_image(place, settings)
    return ServePlan(
        name=name,
        namespace=namespace,
        spec=spec,
        placement=place,
        model_uri=uri,
        served_name=spec.model.served_name or name,
        preset=preset,
        tensor_parallel=tp,
        memory=memory,
        image=image,
        service_account=spec.service_account_name or settings.serving_service_account,
        queue=(labels or {}).get("kueue.x-k8s.io/queue-name") or settings.serving_kueue_queue,
        startup_seconds=startup,
        staging=staging,
        cost=_cost(spec, place, settings),
        warnings=tuple(warnings),
    )
