"""Spec + operator settings -> a Plan holding every derived value, or a SpecError.

A plan is computed before anything is scheduled: a spec that cannot work (unknown topology, a
mesh that does not match the slice, a model that does not fit in HBM, a local path no pod can
reach) is refused here with one message per problem, naming the field.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ValidationError

from gemma_operator import api, fit, host, mounts, tpu
from gemma_operator.models import PRESETS, ModelShape, infer_preset
from gemma_operator.settings import OperatorSettings
from gemma_workloads.config import DatasetConfig, LoraConfig, MergeConfig, MeshConfig, TrainConfig, join, run_dir

CONFIG_DIR = "/etc/gemma-tpu"  # where the pods find their workload config
GCS_MOUNT_ROOT = "/gcs"  # where a Cloud Storage FUSE mount puts a bucket a workload writes files to
TRAIN_CONFIG_FILE = "train.json"
MERGE_CONFIG_FILE = "merge.json"
MAX_TP = 4  # Gemma 4 31B's global layers have 4 KV heads: TP=8 does not divide them.


class SpecError(ValueError):
    """A spec that cannot be scheduled; each problem names its field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _problems(error: ValidationError, root: str) -> list[str]:
    out = []
    for err in error.errors():
        loc = ".".join(str(p) for p in (root, *err["loc"]))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif err["type"] == "string_pattern_mismatch":
            pattern = err["ctx"]["pattern"]
            msg = f"{err['input']!r} " + api.PATTERN_HINTS.get(pattern, f"does not match {pattern}")
        out.append(f"{loc}: {msg}")
    return out


def parse(model: type[BaseModel], spec: dict[str, Any] | None, root: str = "spec") -> Any:
    """Validate a CR's spec, turning pydantic's errors into field-named problems."""
    try:
        return model.model_validate(spec or {})
    except ValidationError as e:
        raise SpecError(_problems(e, root)) from None


def digest(data: Any, length: int = 8) -> str:
    """A short stable hash of JSON-able data: names runs and revisions."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def fuse_path(uri: str) -> str:
    """A gs:// URI as seen through a Cloud Storage FUSE mount of its bucket (other paths unchanged)."""
    return f"{GCS_MOUNT_ROOT}/{uri.removeprefix('gs://')}" if uri.startswith("gs://") else uri


# ---------------------------------------------------------------------------- placement


@dataclass(frozen=True)
class Placement:
    """Where pods go: the slice (None for the cpu profile), and how to select its nodes."""

    accelerator: str
    slice: tpu.Slice | None
    node_selector: dict[str, str]
    tolerations: list[dict[str, str]]

    @property
    def hosts(self) -> int:
        return self.slice.hosts if self.slice else 1

    @property
    def chips(self) -> int:
        return self.slice.chips if self.slice else 0

    @property
    def chips_per_host(self) -> int:
        return self.slice.chips_per_host if self.slice else 0

    @property
    def label(self) -> str:
        return f"{self.slice.name} ({self.slice.topology})" if self.slice else "cpu"


def placement(spec_tpu: api.TPU, node_pool: str | None = None) -> Placement:
    if spec_tpu.accelerator == "cpu":
        problems = [f"spec.tpu.{f}: not used with accelerator cpu" for f in ("topology", "reservation")
                    if getattr(spec_tpu, f)]  # fmt: skip
        if problems:
            raise SpecError(problems)
        selector = {"cloud.google.com/gke-nodepool": spec_tpu.node_pool} if spec_tpu.node_pool else {}
        return Placement("cpu", None, selector, [])
    try:
        slice_ = tpu.resolve(spec_tpu.accelerator, spec_tpu.topology)
    except KeyError as e:
        raise SpecError([f"spec.tpu.topology: {e.args[0]}"]) from None
    selector = tpu.node_selector(
        slice_, spot=spec_tpu.spot, reservation=spec_tpu.reservation, node_pool=spec_tpu.node_pool or node_pool
    )
    tolerations = [dict(tpu.TPU_TOLERATION)] + ([dict(tpu.SPOT_TOLERATION)] if spec_tpu.spot else [])
    return Placement(spec_tpu.accelerator, slice_, selector, tolerations)


def grace_seconds(spec_tpu: api.TPU, settings: OperatorSettings) -> int:
    """The time a training pod has between SIGTERM and SIGKILL: on Spot, what GKE grants after a
    reclaim notice, whatever the pod asks for."""
    if spec_tpu.spot:
        return min(settings.termination_grace_seconds, settings.spot_termination_grace_seconds)
    return settings.termination_grace_seconds


def _check_paths(uris: dict[str, str | None], storage: api.Storage | None, accelerator: str) -> list[str]:
    """Local paths must be reachable from the pods: under the mounted PVC (cpu may use host paths)."""
    problems = []
    for field, uri in uris.items():
        if not uri or uri.startswith("gs://"):
            continue
        if storage is not None:
            mount = storage.mount_path.rstrip("/") + "/"
            if not uri.startswith(mount):
                problems.append(f"{field}: {uri} is not under spec.storage.mountPath {storage.mount_path}")
        elif accelerator != "cpu":
            problems.append(
                f"{field}: {uri} is a local path; set spec.storage.persistentVolumeClaim so the pods "
                "can reach it, or use a gs:// URI"
            )
    return problems


# ---------------------------------------------------------------------------- fine-tune


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
    return spec.uri if spec.uri else f"hf://{spec.hf_repo}"


def plan_finetune(
    name: str,
    namespace: str,
    spec: dict[str, Any] | api.GemmaFineTuneSpec,
    settings: OperatorSettings,
    labels: dict[str, str] | None = None,
) -> FineTunePlan:
    """Everything the children of a GemmaFineTune need, or a SpecError listing every problem."""
    if not isinstance(spec, api.GemmaFineTuneSpec):
        spec = parse(api.GemmaFineTuneSpec, spec)
    problems: list[str] = []
    try:
        place = placement(spec.tpu)
    except SpecError as e:  # report it with whatever else is wrong
        problems += e.problems
        place = Placement("cpu", None, {}, [])
    preset = spec.model.preset or infer_preset(spec.model.hf_repo)
    shape = PRESETS.get(preset) if preset else None

    devices = place.chips or 1
    if problems:
        mesh = MeshConfig(fsdp=1, tp=1)
    elif spec.training.mesh is not None:
        mesh = MeshConfig(fsdp=spec.training.mesh.fsdp, tp=spec.training.mesh.tp)
        if mesh.fsdp * mesh.tp != devices:
            problems.append(
                f"spec.training.mesh: fsdp {mesh.fsdp} x tp {mesh.tp} = {mesh.fsdp * mesh.tp} devices, "
                f"but {place.label} has {devices}"
            )
        elif not _divides_heads(mesh.tp, shape):
            problems.append(
                f"spec.training.mesh.tp: {mesh.tp} does not divide {preset}'s attention heads "
                f"({shape.heads}), KV heads ({shape.kv_heads}) and global KV heads ({shape.global_kv_heads})"
            )
    else:
        mesh = default_mesh(devices, shape)

    batch = spec.training.batch_size
    micro = spec.training.micro_batch_size or min(batch, mesh.fsdp)
    if batch % micro:
        problems.append(f"spec.training.microBatchSize: {micro} does not divide batchSize {batch}")
    if micro % mesh.fsdp:
        problems.append(
            f"spec.training.microBatchSize: {micro} must be a multiple of the mesh's fsdp size {mesh.fsdp} "
            "(each data-parallel shard takes whole sequences)"
        )
    problems += _check_paths(
        {"spec.model.uri": spec.model.uri, "spec.dataset.uri": spec.dataset.uri, "spec.output.uri": spec.output.uri},
        spec.storage,
        spec.tpu.accelerator,
    )
    problems += mounts.storage_problems(spec.storage, (CONFIG_DIR, mounts.SHM_DIR, host.STAGING_DIR), GCS_MOUNT_ROOT)

    memory = None
    if shape is not None and place.slice is not None:
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
            hbm_gib=tpu.GENERATIONS[place.accelerator].hbm_gib_per_chip,
            usable_fraction=settings.hbm_usable_fraction,
        )
        if not memory.fits:
            hint = "" if spec.training.gradient_checkpointing else "; enable training.gradientCheckpointing"
            problems.append(
                f"spec.tpu: {preset} does not fit {place.label} for training: {memory.describe()} "
                f"(seq {spec.dataset.max_seq_len}, micro-batch {micro}, LoRA rank {spec.lora.rank}){hint}; "
                "use a larger topology, a shorter dataset.maxSeqLen or a smaller microBatchSize"
            )
    host_plan = None
    if place.slice is not None:
        host_plan = host.plan_host(shape, _model_path(spec.model), spec.model.dtype, place.slice, settings)
        where = f"a {place.slice.machine_type} host of {place.label}"
        problems += host.problems(host_plan, preset or "the model", where, place.slice)
    if problems:
        raise SpecError(problems)

    run = digest(spec.model_dump(mode="json", include={"model", "dataset", "lora", "training"}))
    merge_id = digest(spec.merge.model_dump(mode="json", exclude={"enabled"}), 6)
    rdir = run_dir(spec.output.uri, run)
    train = TrainConfig(
        model_path=_model_path(spec.model),
        model_dtype=spec.model.dtype,
        dataset=DatasetConfig(
            path=spec.dataset.uri,
            format=spec.dataset.format,
            max_seq_len=spec.dataset.max_seq_len,
            packing=spec.dataset.packing,
            eval_fraction=spec.dataset.eval_fraction,
            skip_invalid=spec.dataset.skip_invalid,
        ),
        lora=LoraConfig(
            rank=spec.lora.rank, alpha=spec.lora.alpha, dropout=spec.lora.dropout,
            target_modules=list(spec.lora.target_modules),
        ),  # fmt: skip
        steps=spec.training.steps,
        epochs=spec.training.epochs,
        batch_size=batch,
        micro_batch_size=micro,
        learning_rate=spec.training.learning_rate,
        lr_schedule=spec.training.lr_schedule,
        warmup_steps=spec.training.warmup_steps,
        weight_decay=spec.training.weight_decay,
        seed=spec.training.seed,
        checkpoint_every=spec.training.checkpoint_every,
        keep_checkpoints=spec.training.keep_checkpoints,
        log_every=spec.training.log_every,
        gradient_checkpointing=spec.training.gradient_checkpointing,
        remat_policy=fit.remat_policy(memory) if memory is not None and spec.training.gradient_checkpointing else None,
        mesh=mesh,
        output_dir=rdir,
        num_hosts=place.hosts,
        # The trainer decides whether a final checkpoint fits in the pod's grace period.
        termination_grace_seconds=grace_seconds(spec.tpu, settings),
        peak_tflops_per_device=(
            tpu.GENERATIONS[place.accelerator].peak_bf16_tflops if place.slice else None
        ),
    )
    merged = join(rdir, f"merged-{merge_id}")
    merge = MergeConfig(
        base_model_path=train.model_path,
        checkpoint_dir=train.checkpoint_dir,
        # The merge publishes its output folder by a rename: it writes files, through a FUSE mount.
        output_dir=fuse_path(merged),
        dtype=spec.merge.dtype,
        shard_size_bytes=fit.parse_size(spec.merge.shard_size),
    )
    price = settings.prices_per_chip_hour.get(place.accelerator, 0.0)
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
        train=train,
        merge=merge,
        memory=memory,
        estimate=_estimate(spec, shape, place, settings, price),
        image=spec.images.training or settings.images.workloads,
        merge_image=spec.images.merge or settings.images.workloads,
        merge_memory_gib=_merge_memory_gib(shape, spec, merge.workers),
        service_account=spec.service_account_name or settings.workload_service_account,
        queue=(labels or {}).get("kueue.x-k8s.io/queue-name") or settings.kueue_queue,
        merge_queue=settings.merge_kueue_queue,
        price_per_chip_hour=price,
        host=host_plan,
    )


def _estimate(
    spec: api.GemmaFineTuneSpec, shape: ModelShape | None, place: Placement, settings: OperatorSettings, price: float
) -> RunEstimate | None:
    """Duration and cost at the assumed MFU; known only with a model preset, a TPU and steps."""
    if shape is None or place.slice is None or spec.training.steps is None:
        return None
    tokens = spec.training.steps * spec.training.batch_size * spec.dataset.max_seq_len
    peak = place.chips * tpu.GENERATIONS[place.accelerator].peak_bf16_tflops * 1e12
    hours = tokens * shape.flops_per_token() / (peak * settings.assumed_mfu) / 3600
    chip_hours = hours * place.chips
    return RunEstimate(spec.training.steps, tokens, hours, chip_hours, chip_hours * price)


def _merge_memory_gib(shape: ModelShape | None, spec: api.GemmaFineTuneSpec, workers: int) -> int:
    """Streaming merge: per worker a target tensor in float32 three times (base, delta, sum),
    plus the LoRA state in float32, plus room for read/write buffers."""
    if shape is None:
        return 16
    tensor = shape.largest_target_elements(spec.lora.target_modules) * 4 * 3
    lora_state = shape.lora_params(spec.lora.rank, spec.lora.target_modules) * 4
    return max(2, math.ceil((workers * tensor + lora_state) / fit.GIB) + 2)


# ---------------------------------------------------------------------------- serve

# A first start of 31B on v6e-8 compiles for about 8 minutes, 10 with the download (seed paper).
MIN_STARTUP_SECONDS = {"gemma4-31b": 600, "gemma4-26b-a4b": 600}


def default_startup_seconds(place: Placement, shape: ModelShape | None) -> int:
    """Loading plus XLA compilation grows with the model: 5 minutes plus 20 s per billion
    parameters (15 minutes for 31B), 30 minutes when the size is unknown, 10 on CPU."""
    if place.slice is None:
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

    @property
    def multi_host(self) -> bool:
        return self.placement.hosts > 1

    @property
    def revision(self) -> str:
        """Changes whenever the pods must be replaced: a new model or a new pod-relevant spec."""
        return digest({"model": self.model_uri, "spec": self.spec.model_dump(mode="json", exclude={"replicas"})})


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
    if not isinstance(spec, api.GemmaServeSpec):
        spec = parse(api.GemmaServeSpec, spec)
    problems: list[str] = []
    node_pool = settings.serving_node_pools.get(spec.tpu.topology or "2x4") if spec.tpu.accelerator == "v6e" else None
    place = placement(spec.tpu, node_pool=node_pool)
    preset = spec.model.preset or infer_preset(spec.model.hf_repo) or fine_tune_preset
    shape = PRESETS.get(preset) if preset else None
    tp = place.chips or 1
    memory = None
    if shape is not None and place.slice is not None:
        memory = fit.serving_memory(
            shape,
            tp=tp,
            max_model_len=spec.vllm.max_model_len,
            hbm_gib=tpu.GENERATIONS[place.accelerator].hbm_gib_per_chip,
            gpu_memory_utilization=spec.vllm.gpu_memory_utilization,
        )
        if not memory.fits:
            problems.append(
                f"spec.tpu: {preset} does not fit {place.label} for serving: {memory.describe()} "
                f"(TP {tp}, maxModelLen {spec.vllm.max_model_len}); use a larger topology or a shorter maxModelLen"
            )
    problems += _check_paths({"spec.model.uri": spec.model.uri}, spec.storage, place.accelerator)
    problems += mounts.storage_problems(spec.storage, (*mounts.SERVING, host.STAGING_DIR))
    startup = spec.startup_timeout_seconds or default_startup_seconds(place, shape)
    if shape is not None and place.slice is not None and startup < MIN_STARTUP_SECONDS.get(shape.preset, 0):
        problems.append(
            f"spec.startupTimeoutSeconds: {startup} is too short for {shape.preset}: loading and XLA compilation "
            f"take up to {MIN_STARTUP_SECONDS[shape.preset] // 60} minutes on a first start"
        )
    uri = spec.model.uri or (f"hf://{spec.model.hf_repo}" if spec.model.hf_repo else model_uri)
    staging = None
    if place.slice is not None and uri and uri.startswith("hf://"):
        # Every host downloads the whole model before loading it: onto a disk planned like training's,
        # not the node's boot disk, which a 31B download fills (the kubelet then evicts the pod).
        staging = replace(host.plan_host(shape, uri, "bfloat16", place.slice, settings), memory=None)
        where = f"a {place.slice.machine_type} host of {place.label}"
        problems += host.problems(staging, preset or "the model", where, place.slice)
    if problems:
        raise SpecError(problems)
    image = spec.vllm.image or (settings.images.serving_cpu if place.accelerator == "cpu" else settings.images.serving_tpu)
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
        service_account=spec.service_account_name or settings.workload_service_account,
        queue=(labels or {}).get("kueue.x-k8s.io/queue-name") or settings.serving_kueue_queue,
        startup_seconds=startup,
        staging=staging,
    )
