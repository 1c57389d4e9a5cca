"""GemmaServe: an OpenAI-compatible vLLM service of a Gemma 4 model on TPU. Its spec (what to serve,
the vLLM server, rollout, autoscaling, metrics) and status; the benchmark and its SLO are in
serve_benchmark.py."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from gemma_operator import reasons
from gemma_operator.api.common import (
    GPU,
    MAX_ITEMS,
    MAX_LENGTH,
    TPU,
    Accelerator,
    HfRepo,
    Image,
    Kind,
    Model,
    Name,
    ObservedStatus,
    Preset,
    Quantity,
    RunId,
    SecretKeyRef,
    StatusRun,
    Storage,
    Text,
    Timestamp,
    Uri,
    one_accelerator,
)
from gemma_operator.api.evaluation import GateCondition
from gemma_operator.api.serve_benchmark import Benchmark, BenchmarkResult, RejectedRun
from gemma_operator.vllm_flags import check_extra_args

# ---------------------------------------------------------------------------- spec


class FineTuneRef(Model):
    """A GemmaFineTune in the same namespace whose merged output is served."""

    name: Annotated[Name, Field(description="Name of the GemmaFineTune.")]
    run: Annotated[
        RunId | None,
        Field(
            description="Serve this run's merged output (one of the fine-tune's "
            "status.runs) instead of the newest: a rollback is this one field.",
        ),
    ] = None


class ServeModel(Model):
    """What to serve: the merged output of a GemmaFineTune, a URI, or a Hugging Face repo."""

    fine_tune_ref: Annotated[
        FineTuneRef | None,
        Field(description="Serve a GemmaFineTune's merged output; the server waits until it exists."),
    ] = None
    uri: Annotated[Uri | None, Field(description="gs:// prefix or path of a Hugging Face-format model directory.")] = (
        None
    )
    hf_repo: Annotated[HfRepo | None, Field(description="Hugging Face repository id, e.g. google/gemma-4-31B-it.")] = (
        None
    )
    hf_token_secret_ref: Annotated[
        SecretKeyRef | None,
        Field(description="Secret holding the Hugging Face token (google/ Gemma repositories are gated)."),
    ] = None
    preset: Annotated[
        Preset | None,
        Field(description="Model size used for planning (HBM fit, start-up budget); inferred from a known hfRepo."),
    ] = None
    served_name: Annotated[
        str | None,
        Field(max_length=MAX_LENGTH["name"], description="Model name in the OpenAI API (default: the CR name)."),
    ] = None

    @model_validator(mode="after")
    def _one_source(self) -> ServeModel:
        sources = [s for s in (self.fine_tune_ref, self.uri, self.hf_repo) if s is not None]
        if len(sources) != 1:
            raise ValueError("set exactly one of fineTuneRef, uri or hfRepo")
        if self.hf_token_secret_ref is not None and self.hf_repo is None:
            raise ValueError("hfTokenSecretRef is only used with hfRepo")
        return self


class ServeTPU(TPU):
    """The serving slice: TPU v6e unless said otherwise."""

    accelerator: Annotated[Accelerator, Field(description="TPU generation (v5p, v6e) or cpu.")] = "v6e"


class VLLM(Model):
    """The vLLM server's settings (vLLM's flags of the same names)."""

    image: Annotated[
        Image | None,
        Field(description="vLLM image (default: the operator's vLLM-TPU image, or its CPU image on accelerator cpu)."),
    ] = None
    max_model_len: Annotated[
        int,
        Field(ge=16, le=262144, description="--max-model-len: tokens per sequence, prompt and answer together."),
    ] = 4096
    max_num_seqs: Annotated[
        int, Field(ge=1, le=4096, description="--max-num-seqs: sequences decoded together per replica.")
    ] = 64
    max_num_batched_tokens: Annotated[
        int | None,
        Field(ge=16, description="--max-num-batched-tokens: tokens per scheduler step; unset: vLLM's default."),
    ] = None
    gpu_memory_utilization: Annotated[
        float,
        Field(
            gt=0.0,
            le=1.0,
            description="--gpu-memory-utilization: share of each chip's HBM vLLM may use (on TPU too), in (0, 1].",
        ),
    ] = 0.9
    dtype: Annotated[
        Literal["bfloat16", "float16", "float32"],
        Field(description="Serving dtype on the cpu profile (TPU serves the checkpoint's dtype)."),
    ] = "bfloat16"
    extra_args: Annotated[
        list[Annotated[str, Field(max_length=MAX_LENGTH["flag"])]],
        Field(
            max_length=MAX_ITEMS["extraArgs"],
            description="More vLLM flags; the model, name, host, port and API key are the operator's.",
        ),
    ] = Field(default_factory=list)
    api_key_secret_ref: Annotated[
        SecretKeyRef | None, Field(description="Secret holding the API key clients must send (--api-key).")
    ] = None

    @field_validator("extra_args")
    @classmethod
    def _no_owned_flags(cls, args: list[str]) -> list[str]:
        check_extra_args(tuple(args))
        return args


class CompilationCache(Model):
    """Where the XLA compilation cache persists across restarts and replicas (VLLM_XLA_CACHE_PATH;
    on GPUs and the CPU vLLM's cache root, VLLM_CACHE_ROOT). Without it every restart compiles
    again (about 8 minutes for 31B on v6e-8)."""

    uri: Annotated[
        str | None,
        Field(pattern=r"^gs://.+", max_length=MAX_LENGTH["uri"], description="gs:// prefix, mounted read-write."),
    ] = None
    pvc: Annotated[Name | None, Field(description="A ReadWriteMany PVC.")] = None

    @model_validator(mode="after")
    def _one_place(self) -> CompilationCache:
        if (self.uri is None) == (self.pvc is None):
            raise ValueError("set exactly one of uri or pvc")
        return self


class GcsFuse(Model):
    """Cloud Storage FUSE settings for gs:// models (the CSI driver's sidecar and caches)."""

    file_cache_capacity: Annotated[
        Quantity, Field(description="fileCacheCapacity of the volume; -1: as large as the cache volume.")
    ] = "-1"
    cache_medium: Annotated[
        Literal["Memory", "Disk"], Field(description="Where the file cache lives (Memory: fastest loads).")
    ] = "Memory"
    sidecar_cpu_limit: Annotated[Quantity, Field(description='gke-gcsfuse/cpu-limit; "0": no limit.')] = "0"
    sidecar_memory_limit: Annotated[Quantity, Field(description='gke-gcsfuse/memory-limit; "0": no limit.')] = "0"
    sidecar_ephemeral_storage_limit: Annotated[
        Quantity, Field(description='gke-gcsfuse/ephemeral-storage-limit; "0": no limit.')
    ] = "0"
    mount_options: Annotated[
        list[Annotated[str, Field(max_length=MAX_LENGTH["flag"])]],
        Field(max_length=MAX_ITEMS["mountOptions"], description="More gcsfuse mount options."),
    ] = Field(default_factory=list)


class Rollout(Model):
    """How new pods replace old ones. The default needs no spare TPU capacity."""

    max_surge: Annotated[int, Field(ge=0, description="Extra pods during a rollout (each needs a TPU slice).")] = 0
    max_unavailable: Annotated[
        int, Field(ge=0, description="Pods that may be down during a rollout (frees a slice for the new one).")
    ] = 1
    gate: Annotated[
        list[GateCondition],
        Field(
            max_length=MAX_ITEMS["gate"],
            description="Conditions on a fine-tune run's evaluation: a run that fails one is not rolled out "
            "and the output already served keeps serving. Empty: every new output rolls out.",
        ),
    ] = Field(default_factory=list)

    @model_validator(mode="after")
    def _progress(self) -> Rollout:
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise ValueError("maxSurge and maxUnavailable cannot both be 0: the rollout could never progress")
        return self


class Autoscaling(Model):
    """A HorizontalPodAutoscaler on a per-pod vLLM metric, served by a custom-metrics adapter."""

    min_replicas: Annotated[int, Field(ge=1, description="Fewest replicas (each holds a TPU slice).")] = 1
    max_replicas: Annotated[
        int, Field(ge=1, le=1000, description="Most replicas: the plan prices the service at this many.")
    ]
    metric: Annotated[
        str, Field(max_length=MAX_LENGTH["metric"], description="Pods metric name as the metrics adapter exposes it.")
    ] = "vllm:num_requests_waiting"
    target_average_value: Annotated[float, Field(gt=0, description="Target of the metric per pod.")] = 5.0

    @model_validator(mode="after")
    def _bounds(self) -> Autoscaling:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"maxReplicas {self.max_replicas} is below minReplicas {self.min_replicas}")
        return self


class Metrics(Model):
    """Scrape objects for vLLM's Prometheus metrics."""

    pod_monitor: Annotated[
        bool, Field(description="Create a PodMonitor (prometheus-operator) for vLLM's /metrics.")
    ] = False
    pod_monitoring: Annotated[
        bool, Field(description="Create a PodMonitoring (GKE Managed Service for Prometheus) for vLLM's /metrics.")
    ] = False


class GemmaServeSpec(Model):
    """GemmaServe: an OpenAI-compatible vLLM service of a Gemma 4 model on TPU or GPUs."""

    model: ServeModel
    tpu: Annotated[ServeTPU | None, Field(description="The serving slice; unset, and no gpu: v6e 2x4 (a v6e-8).")] = (
        None
    )
    gpu: Annotated[
        GPU | None,
        Field(
            description="NVIDIA GPUs of a GKE GPU node pool instead of a TPU slice (tensor parallel over them); not with tpu."
        ),
    ] = None
    replicas: Annotated[int, Field(ge=0, le=1000, description="Ignored while autoscaling is set.")] = 1
    vllm: VLLM = Field(default_factory=VLLM)
    compilation_cache: CompilationCache | None = None
    startup_timeout_seconds: Annotated[
        int | None,
        Field(ge=60, description="Budget for loading and XLA compilation; default from the model size."),
    ] = None
    rollout: Rollout = Field(default_factory=Rollout)
    autoscaling: Autoscaling | None = None
    metrics: Metrics = Field(default_factory=Metrics)
    gcs_fuse: GcsFuse = Field(default_factory=GcsFuse)
    service_account_name: Annotated[
        Name | None, Field(description="ServiceAccount of the vLLM pods (default: the operator's setting).")
    ] = None
    storage: Storage | None = None
    benchmark: Annotated[
        Benchmark | None,
        Field(description="Measure every revision once it is Ready (status.benchmark), and gate it on an SLO."),
    ] = None

    @model_validator(mode="after")
    def _accelerator(self) -> GemmaServeSpec:
        self.tpu = one_accelerator(self.tpu, self.gpu, ServeTPU)
        return self

    @model_validator(mode="after")
    def _gate_needs_runs(self) -> GemmaServeSpec:
        if self.rollout.gate and self.model.fine_tune_ref is None:
            raise ValueError(
                "rollout.gate is only used with model.fineTuneRef: evaluations come from a fine-tune's runs"
            )
        b = self.benchmark
        if b and b.on_miss == "rollback" and self.model.fine_tune_ref is None:
            raise ValueError(
                "benchmark.onMiss rollback is only used with model.fineTuneRef: it rolls back to an earlier run"
            )
        if b and b.input_len + b.output_len > self.vllm.max_model_len:
            raise ValueError(
                f"benchmark.inputLen + benchmark.outputLen is {b.input_len + b.output_len}: at most "
                f"vllm.maxModelLen ({self.vllm.max_model_len}) tokens fit one sequence"
            )
        return self


# ---------------------------------------------------------------------------- status


class GemmaServeStatus(ObservedStatus):
    """What the operator observed of a GemmaServe."""

    phase: Annotated[
        reasons.ServePhase | None,
        Field(description="Where the service is in its life."),
    ] = None
    model_uri: Annotated[
        str | None, Field(max_length=MAX_LENGTH["uri"], description="The model served (gs://, path or hf://).")
    ] = None
    served_model_name: Annotated[
        str | None, Field(max_length=MAX_LENGTH["name"], description="The model's name in the OpenAI API.")
    ] = None
    revision: Annotated[
        Text | None, Field(description="Hash of the model and pod settings: changes when pods are replaced.")
    ] = None
    replicas: Annotated[int | None, Field(description="Replicas asked of the workload.")] = None
    ready_replicas: Annotated[int | None, Field(description="Replicas serving.")] = None
    updated_replicas: Annotated[int | None, Field(description="Replicas at the current revision.")] = None
    endpoint: Annotated[Text | None, Field(description="The OpenAI-compatible base URL inside the cluster.")] = None
    run: Annotated[StatusRun | None, Field(description="The fine-tune run whose output is served.")] = None
    passed_runs: Annotated[
        list[StatusRun],
        Field(
            max_length=MAX_ITEMS["passedRuns"],
            description="The fine-tune's runs that pass rollout.gate (all of them without a gate), newest "
            "first: set model.fineTuneRef.run to one of them to roll back.",
        ),
    ] = Field(default_factory=list)
    serving_cost: Annotated[
        float | None,
        Field(
            description="What the service's TPU slices or GPUs have cost so far: replicas x chips (or GPUs) x "
            "the price per chip- or GPU-hour (settings), in dollars; none on the cpu profile."
        ),
    ] = None
    cost_accounted_at: Annotated[
        Timestamp | None, Field(description="When servingCost was last brought up to date.")
    ] = None
    rejected_runs: Annotated[
        list[RejectedRun],
        Field(
            max_length=MAX_ITEMS["rejectedRuns"],
            description="Runs rolled back because their revision missed spec.benchmark.slo (onMiss: rollback), "
            "newest first: never rolled out again under the same SLO.",
        ),
    ] = Field(default_factory=list)
    benchmark: Annotated[
        BenchmarkResult | None, Field(description="The benchmark of the current revision under spec.benchmark.")
    ] = None
    benchmarks: Annotated[
        list[BenchmarkResult],
        Field(
            max_length=MAX_ITEMS["benchmarks"],
            description="Finished benchmarks, newest first (bounded): a revision served again is not measured again.",
        ),
    ] = Field(default_factory=list)


# ---------------------------------------------------------------------------- the kind


SERVE = Kind(
    "GemmaServe",
    "gemmaserves",
    "gsv",
    GemmaServeSpec,
    GemmaServeStatus,
    [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Model", "type": "string", "jsonPath": ".status.modelUri"},
        {"name": "Run", "type": "string", "jsonPath": ".status.run", "priority": 1},
        {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint"},
        {"name": "TTFT-P99-ms", "type": "number", "jsonPath": ".status.benchmark.ttftP99Ms", "priority": 1},
        {"name": "Tokens/s", "type": "number", "jsonPath": ".status.benchmark.outputTokensPerSecond", "priority": 1},
        {
            "name": "$/1M-Tokens",
            "type": "number",
            "jsonPath": ".status.benchmark.costPerMillionOutputTokens",
            "priority": 1,
        },
        {"name": "Cost-$", "type": "number", "jsonPath": ".status.servingCost", "priority": 1},
        {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ],
)
