"""GemmaFineTune spec + operator settings -> a FineTunePlan holding every derived value, or a
SpecError listing every problem.

Each part is its own small builder: the JAX mesh, the micro-batch, the paths the pods must reach,
the HBM fit, the host's memory and disk, the two workload configs and the cost. `plan_finetune`
runs the checks first and builds the configs only for a spec that can be scheduled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gemma_operator import api, fit, host, mounts, pricing
from gemma_operator.model_shapes import PRESETS, ModelShape, infer_preset
from gemma_operator.model_uri import ModelUri
from gemma_operator.plan import evaluation
from gemma_operator.plan.common import (
    Placement,
    SpecError,
    assumed_mfu,
    check_paths,
    digest,
    grace_seconds,
    hf_source_checks,
    parse,
    placement,
)
from gemma_operator.settings import OperatorSettings
from gemma_operator.training_method import METHOD_COST
from gemma_workloads.config import (
    DatasetConfig,
    LoraConfig,
    MergeConfig,
    MeshConfig,
    PreferenceConfig,
    TrainConfig,
    join,
    run_dir,
)

MAX_TP = 4  # Gemma 4 31B's global layers have 4 KV heads: TP=8 does not divide them.
# What to change when a model does not fit, by the spec's block of the accelerator.
LARGER = {"spec.tpu": "a larger topology", "spec.gpu": "more GPUs (gpu.count) or a GPU with more memory"}

# A fine-tune's own JAX compilation cache, beside its runs in its output, when no cluster-wide one is set.
COMPILATION_CACHE_FOLDER = "compilation-cache"


@dataclass(frozen=True)
class RunEstimate:
    steps: int
    tokens: int
    hours: float
    chip_hours: float
    cost: float


@dataclass(frozen=True)
class FineTunePlan:
    name: str
    namespace: str
    spec: api.GemmaFineTuneSpec
    preset: str | None
    shape: ModelShape | None
    placement: Placement
    mesh: MeshConfig
    micro_batch: int
    run: str
    merge_id: str
    run_dir: str
    merged_dir: str
    adapter_dir: str
    train: TrainConfig
    merge: MergeConfig
    memory: fit.MemoryEstimate | None
    estimate: RunEstimate | None
    image: str
    merge_image: str
    merge_memory_gib: int
    service_account: str | None
    queue: str | None  # the training workload's (the CR's label, else settings.kueue_queue)
    merge_queue: str | None
    price_per_chip_hour: float
    host: host.HostPlan | None = None  # memory and staging disk of a TPU training pod
    evaluation: evaluation.EvaluationEstimate | None = None  # the evaluation's extra time and cost
    price: pricing.Price | None = None  # price_per_chip_hour, with its basis (Spot or on demand) and source
    warnings: tuple[str, ...] = ()  # what may go wrong but is not refused

    @property
    def multi_host(self) -> bool:
        return self.placement.hosts > 1

    @property
    def model_label(self) -> str:
        return self.preset or (self.spec.model.hf_repo or self.spec.model.uri or "").rsplit("/", 1)[-1]


def default_mesh(devices: int, shape: ModelShape | None) -> MeshConfig:
    """As the seed paper on v5p: tp up to 4 (4 devices -> 1x4, 8 -> 2x4, 16 -> 4x4), then fsdp."""
    tp = 1
    for candidate in range(min(MAX_TP, devices), 0, -1):
        if devices % candidate == 0 and _divides_heads(candidate, shape):
            tp = candidate
            break
    return MeshConfig(fsdp=devices // tp, tp=tp)


def _divides_heads(tp: int, shape: ModelShape | None) -> bool:
    if shape is None:
        return True
    return all(n % tp == 0 for n in (shape.heads, shape.kv_heads, shape.global_kv_heads))


def _model_path(spec: api.ModelSource) -> str:
    return spec.uri if spec.uri else str(ModelUri.hf(spec.hf_repo or ""))


# ---------------------------------------------------------------------------- checks


def _mesh(
    spec: api.GemmaFineTuneSpec, place: Placement, shape: ModelShape | None, preset: str | None
) -> tuple[MeshConfig, list[str]]:
    """The spec's mesh, which must cover the slice and divide the heads, or the default one."""
    devices = place.chips or 1
    if spec.training.mesh is None:
        return default_mesh(devices, shape), []
    mesh = MeshConfig(fsdp=spec.training.mesh.fsdp, tp=spec.training.mesh.tp)
    if mesh.fsdp * mesh.tp != devices:
        return mesh, [
            f"spec.training.mesh: fsdp {mesh.fsdp} x tp {mesh.tp} = {mesh.fsdp * mesh.tp} devices, "
            f"but {place.label} has {devices}"
        ]
    if shape is not None and not _divides_heads(mesh.tp, shape):
        return mesh, [
            f"spec.training.mesh.tp: {mesh.tp} does not divide {preset}'s attention heads "
            f"({shape.heads}), KV heads ({shape.kv_heads}) and global KV heads ({shape.global_kv_heads})"
        ]
    return mesh, []


def _slice_and_mesh(
    spec: api.GemmaFineTuneSpec, shape: ModelShape | None, preset: str | None
) -> tuple[Placement, MeshConfig, list[str]]:
    """The slice and its mesh, with their problems; a slice that cannot be placed is reported with
    whatever else is wrong."""
    try:
        place = placement(spec.tpu, spec.gpu)
        mesh, problems = _mesh(spec, place, shape, preset)
    except SpecError as e:
        return Placement("cpu", None, {}, []), MeshConfig(fsdp=1, tp=1), e.problems
    return place, mesh, problems


def _micro_batch(spec: api.GemmaFineTuneSpec, mesh: MeshConfig) -> tuple[int, list[str]]:
    batch = spec.training.batch_size
    micro = spec.training.micro_batch_size or min(batch, mesh.fsdp)
    problems = []
    if batch % micro:
        problems.append(f"spec.training.microBatchSize: {micro} does not divide batchSize {batch}")
    if micro % mesh.fsdp:
        problems.append(
            f"spec.training.microBatchSize: {micro} must be a multiple of the mesh's fsdp size {mesh.fsdp} "
            "(each data-parallel shard takes whole sequences)"
        )
    return micro, problems


def _reachable(spec: api.GemmaFineTuneSpec) -> list[str]:
    """Paths the pods must reach, a storage mount that clashes with none of theirs, and the evaluation's rows."""
    accelerator = spec.gpu.type if spec.gpu else spec.tpu.accelerator if spec.tpu else "cpu"
    problems = check_paths(
        {
            "spec.model.uri": spec.model.uri,
            "spec.dataset.uri": spec.dataset.uri,
            "spec.output.uri": spec.output.uri,
            "spec.evaluation.uri": spec.evaluation.uri if spec.evaluation else None,
        },
        spec.storage,
        accelerator,
    )
    problems += mounts.storage_problems(
        spec.storage, (mounts.CONFIG_DIR, mounts.SHM_DIR, host.STAGING_DIR), mounts.GCS_MOUNT_ROOT
    )
    return problems


def _hbm(
    spec: api.GemmaFineTuneSpec,
    place: Placement,
    shape: ModelShape | None,
    preset: str | None,
    mesh: MeshConfig,
    micro: int,
    settings: OperatorSettings,
) -> tuple[fit.MemoryEstimate | None, list[str]]:
    """HBM per chip or GPU for training, known with a model preset on TPU chips or GPUs."""
    if shape is None or place.device is None:
        return None, []
    memory = fit.training_memory(
        shape,
        dtype=spec.model.dtype,
        fsdp=mesh.fsdp,
        tp=mesh.tp,
        micro_batch=micro,
        seq_len=spec.dataset.max_seq_len,
        lora_rank=spec.lora.rank,
        lora_targets=spec.lora.target_modules,
        remat=spec.training.gradient_checkpointing,
        hbm_gib=place.device.hbm_gib_per_chip,
        usable_fraction=settings.hbm_usable_fraction,
        method=spec.method,
        unit=f"per {place.device_word}",
    )
    if memory.fits:
        return memory, []
    hint = "" if spec.training.gradient_checkpointing else "; enable training.gradientCheckpointing"
    training = "training" if spec.method == "sft" else f"{spec.method} training"
    return memory, [
        f"{place.field}: {preset} does not fit {place.label} for {training}: {memory.describe()} "
        f"(seq {spec.dataset.max_seq_len}, micro-batch {METHOD_COST[spec.method].rows(micro)}, "
        f"LoRA rank {spec.lora.rank}){hint}; "
        f"use {LARGER[place.field]}, a shorter dataset.maxSeqLen or a smaller microBatchSize"
    ]


def _host(
    spec: api.GemmaFineTuneSpec,
    place: Placement,
    shape: ModelShape | None,
    preset: str | None,
    settings: OperatorSettings,
) -> tuple[host.HostPlan | None, list[str]]:
    """Memory and staging disk of a TPU or GPU training host, with the problems of a host too small."""
    if place.node is None:
        return None, []
    plan = host.plan_host(shape, _model_path(spec.model), spec.model.dtype, place.node, settings)
    return plan, host.problems(plan, preset or "the model", place.host_label, place.node, place.field)


# ---------------------------------------------------------------------------- the workload configs


def compilation_cache_dir(spec: api.GemmaFineTuneSpec, namespace: str, settings: OperatorSettings) -> str | None:
    """Where the fine-tune's pods keep compiled XLA programs (JAX's persistent cache): the settings'
    cluster-wide prefix, a folder per namespace, or else beside the fine-tune's runs, which all share
    it; None with spec.training.compilationCache off."""
    if not spec.training.compilation_cache:
        return None
    if settings.compilation_cache_uri:
        return join(settings.compilation_cache_uri, namespace)
    return join(spec.output.uri, COMPILATION_CACHE_FOLDER)


def train_config(
    spec: api.GemmaFineTuneSpec,
    place: Placement,
    mesh: MeshConfig,
    micro: int,
    output_dir: str,
    settings: OperatorSettings,
    memory: fit.MemoryEstimate | None = None,
    cache_dir: str | None = None,
) -> TrainConfig:
    """The training pod's config. The dataset and LoRA fields are the contract's own (api declares
    them with its types), so they are handed over whole; only the dataset's location is renamed.
    Preference settings the spec leaves unset take the contract's defaults.
    With gradient checkpointing on, the remat policy is the fastest the HBM estimate fits."""
    t = spec.training
    return TrainConfig(
        model_path=_model_path(spec.model),
        model_dtype=spec.model.dtype,
        dataset=DatasetConfig(path=spec.dataset.uri, **spec.dataset.model_dump(exclude={"uri"})),
        lora=LoraConfig(**spec.lora.model_dump()),
        method=spec.method,
        preference=PreferenceConfig(**(spec.preference.model_dump(exclude_none=True) if spec.preference else {})),
        steps=t.steps,
        epochs=t.epochs,
        batch_size=t.batch_size,
        micro_batch_size=micro,
        learning_rate=t.learning_rate,
        lr_schedule=t.lr_schedule,
        warmup_steps=t.warmup_steps,
        weight_decay=t.weight_decay,
        seed=t.seed,
        checkpoint_every=t.checkpoint_every,
        keep_checkpoints=t.keep_checkpoints,
        log_every=t.log_every,
        gradient_checkpointing=t.gradient_checkpointing,
        remat_policy=fit.remat_policy(memory) if memory is not None and t.gradient_checkpointing else None,
        mesh=mesh,
        output_dir=output_dir,
        num_hosts=place.hosts,
        # The trainer decides whether a final checkpoint fits in the pod's grace period.
        termination_grace_seconds=grace_seconds(place.spot, settings),
        peak_tflops_per_device=place.device.peak_bf16_tflops if place.device else None,
        evaluation=evaluation.train_config(spec),
        scan_layers=t.scan_layers,
        compilation_cache_dir=cache_dir,
    )


def merge_config(spec: api.GemmaFineTuneSpec, train: TrainConfig, merged_dir: str, adapter_dir: str) -> MergeConfig:
    return MergeConfig(
        base_model_path=train.model_path,
        checkpoint_dir=train.checkpoint_dir,
        # The merge publishes its output folders by a rename: it writes files, through a FUSE mount.
        output_dir=mounts.fuse_path(merged_dir),
        adapter_dir=mounts.fuse_path(adapter_dir),
        output=spec.merge.output,
        dtype=spec.merge.dtype,
        shard_size_bytes=fit.parse_size(spec.merge.shard_size),
        compilation_cache_dir=train.compilation_cache_dir,
    )


def _estimate(
    spec: api.GemmaFineTuneSpec, shape: ModelShape | None, place: Placement, settings: OperatorSettings, price: float
) -> RunEstimate | None:
    """Duration and cost at the assumed MFU; known only with a model preset, TPU chips or GPUs, and
    steps. Every sequence of a row counts (a preference pair's two), at its method's FLOPs per token."""
    if shape is None or place.device is None or spec.training.steps is None:
        return None
    cost = METHOD_COST[spec.method]
    tokens = spec.training.steps * spec.training.batch_size * cost.sequences_per_row * spec.dataset.max_seq_len
    peak = place.chips * place.device.peak_bf16_tflops * 1e12
    hours = tokens * cost.flops_per_token(shape) / (peak * assumed_mfu(place, settings)) / 3600
    chip_hours = hours * place.chips
    return RunEstimate(spec.training.steps, tokens, hours, chip_hours, chip_hours * price)


def _merge_memory_gib(shape: ModelShape | None, spec: api.GemmaFineTuneSpec, workers: int) -> int:
    """Streaming merge: per worker a target tensor in float32 three times (base, delta, sum),
    plus the LoRA state in float32, plus room for read/write buffers."""
    if shape is None:
        return 16
    tensor = shape.largest_target_elements(spec.lora.target_modules) * 4 * 3
    lora_state = shape.lora_params(spec.lora.rank, spec.lora.target_modules) * 4
    return math.ceil((workers * tensor + lora_state) / fit.GIB) + 2


# ---------------------------------------------------------------------------- the plan


def _run_ids(spec: api.GemmaFineTuneSpec) -> tuple[str, str]:
    """(run, merge id): hashes of the inputs of training and of the merge's settings. The method
    joins them only when it is not sft, so the runs of sft fine-tunes keep their ids."""
    method = {} if spec.method == "sft" else spec.model_dump(mode="json", include={"method", "preference"})
    run = digest(
        {
            # How the step is compiled does not change what a run computes (the scanned layers' and the
            # unrolled ones' checkpoints are the same): switching either keeps the run and resumes it.
            **spec.model_dump(
                mode="json",
                include={"model", "dataset", "lora", "training"},
                exclude={"training": {"compilation_cache", "scan_layers"}},
            ),
            **method,
            **evaluation.run_inputs(spec),
        }
    )
    # Which outputs are kept does not change what is in them: a run's folders keep their names.
    return run, digest(spec.merge.model_dump(mode="json", exclude={"enabled", "output"}), 6)


def plan_finetune(
    name: str,
    namespace: str,
    spec: dict[str, Any] | api.GemmaFineTuneSpec,
    settings: OperatorSettings,
    labels: dict[str, str] | None = None,
) -> FineTunePlan:
    """Everything the children of a GemmaFineTune need, or a SpecError listing every problem."""
    spec = spec if isinstance(spec, api.GemmaFineTuneSpec) else parse(api.GemmaFineTuneSpec, spec)
    preset = spec.model.preset or infer_preset(spec.model.hf_repo)
    shape = PRESETS.get(preset) if preset else None
    place, mesh, problems = _slice_and_mesh(spec, shape, preset)
    micro, batch_problems = _micro_batch(spec, mesh)
    memory, hbm_problems = _hbm(spec, place, shape, preset, mesh, micro, settings)
    host_plan, host_problems = _host(spec, place, shape, preset, settings)
    source_problems, warnings = hf_source_checks(spec.model.hf_repo, spec.model.preset, spec.model.hf_token_secret_ref)
    problems = problems + batch_problems + source_problems + _reachable(spec) + hbm_problems + host_problems
    if problems:
        raise SpecError(problems)

    run, merge_id = _run_ids(spec)
    rdir = run_dir(spec.output.uri, run)
    merged, adapter = join(rdir, f"merged-{merge_id}"), join(rdir, f"adapter-{merge_id}")
    train = train_config(
        spec, place, mesh, micro, rdir, settings, memory, compilation_cache_dir(spec, namespace, settings)
    )
    merge = merge_config(spec, train, merged, adapter)
    price = pricing.chip_hour_price(settings, place.accelerator, place.spot)
    return FineTunePlan(
        name=name,
        namespace=namespace,
        spec=spec,
        preset=preset,
        shape=shape,
        placement=place,
        mesh=mesh,
        micro_batch=micro,
        run=run,
        merge_id=merge_id,
        run_dir=rdir,
        merged_dir=merged,
        adapter_dir=adapter,
        train=train,
        merge=merge,
        memory=memory,
        estimate=_estimate(spec, shape, place, settings, price.per_chip_hour),
        image=spec.images.training or (settings.images.workloads_cuda if place.gpus else settings.images.workloads),
        merge_image=spec.images.merge or settings.images.workloads,
        merge_memory_gib=_merge_memory_gib(shape, spec, merge.workers),
        service_account=spec.service_account_name or settings.training_service_account,
        queue=(labels or {}).get("kueue.x-k8s.io/queue-name") or settings.kueue_queue,
        merge_queue=settings.merge_kueue_queue,
        price_per_chip_hour=price.per_chip_hour,
        host=host_plan,
        evaluation=evaluation.estimate(spec, shape, place, assumed_mfu(place, settings), price.per_chip_hour),
        price=price,
        warnings=tuple(warnings),
    )
