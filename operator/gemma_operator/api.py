"""The GemmaFineTune and GemmaServe custom resources: types, defaults and field rules only.

These pydantic models are the one source of the CRD schemas (`crd.py` turns them into
openAPIV3Schema) and of the operator's parsing of a CR. Nothing here knows how a resource is
reconciled. Field names are the public contract: add fields, never rename them.

It is long because it is one schema: the two kinds share their pieces (model sources, TPU,
storage, images), and one file read top to bottom is how `kubectl explain` reads too.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from gemma_operator import reasons
from gemma_operator.vllm_flags import check_extra_args
from gemma_workloads import config

GROUP = "gemma-tpu.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

Accelerator = Literal["v5p", "v6e", "cpu"]
Preset = Literal["gemma4-31b", "gemma4-26b-a4b", "gemma4-e4b", "gemma4-e2b", "tiny"]
DType = Literal["bfloat16", "float32"]
MergeDType = Literal["bfloat16", "float16", "float32"]
MergeOutputKind = Literal["adapter", "merged", "both"]
# Hugging Face projection names, as the training workload maps them (its LORA_MODULES).
if TYPE_CHECKING:
    LoraTarget = str  # a type checker cannot read a Literal built at run time
else:
    LoraTarget = Literal[tuple(config.LORA_MODULES)]
LrSchedule = Literal["cosine", "linear", "constant"]
# Evaluation figures (the training workload's names: gemma_workloads.config.EVAL_METRICS).
EvalMetric = Literal[
    "evalLoss", "perplexity", "exactMatch", "contains", "regexMatch", "preferenceAccuracy", "rewardMargin"
]

# A Kubernetes object name (RFC 1123 subdomain) and a size such as "5GB" or "4Gi".
_DNS_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
_SIZE = r"^[0-9]+(\.[0-9]+)?(B|KB|MB|GB|TB|Ki|Mi|Gi|Ti)?$"
_URI = r"^(gs://[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9](/.*)?|/.+)$"
_HF_REPO = r"^[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+$"
_TOPOLOGY = r"^[0-9]+(x[0-9]+){1,2}$"
_RUN = r"^[0-9a-f]{6,64}$"
PATTERN_HINTS = {
    _DNS_NAME: "is not a valid Kubernetes name (lowercase letters, digits, '-' and '.')",
    _SIZE: "is not a size such as 5GB or 4Gi",
    _URI: "is neither a gs://bucket/path URI (bucket: 3-63 of a-z, 0-9, -, _ and .) nor an absolute path",
    _HF_REPO: "is not a Hugging Face repo id such as google/gemma-4-31B-it",
    _TOPOLOGY: "is not a topology such as 2x2x1 or 2x4",
    _RUN: "is not a run id (6 to 64 hexadecimal digits)",
}

# The longest value of every free string and the most items of every list, in both CRDs. The
# Kubernetes API conventions ask for them, and the API server needs them: before it accepts a CRD it
# estimates each CEL rule's worst-case cost from the declared bounds of what the rule reads, and
# refuses a rule over an unbounded list or string (tests/operator/test_crd_bounds.py says where).
MAX_LENGTH = {
    "name": 253,  # an object name: RFC 1123 subdomain (Secret, PVC, ServiceAccount, GemmaFineTune)
    "label": 63,  # an RFC 1123 label: a node pool, a reservation
    "secretKey": 253,  # a key of a Secret's data (Kubernetes' IsConfigMapKey)
    "uri": 2048,  # a gs:// URI or an absolute path
    "hfRepo": 200,  # owner/name: Hugging Face caps each at 96 characters
    "image": 512,  # registry/repository:tag@sha256:digest
    "path": 1024,  # a mount path in the container
    "quantity": 64,  # a Kubernetes quantity or a size: 5GB, 4Gi, "-1"
    "flag": 1024,  # one vLLM flag or one gcsfuse mount option
    "metric": 253,  # a Prometheus metric name as the metrics adapter exposes it
    "run": 64,  # a run id: a sha256 prefix
    "time": 64,  # an RFC 3339 timestamp
    "text": 1024,  # a short status value: a model label, a topology, a summary, an endpoint
    "conditionType": 316,  # metav1.Condition's own bounds: type, reason, message
    "reason": 1024,
    "message": 32768,
}
MAX_ITEMS = {
    "targetModules": len(config.LORA_MODULES),  # each projection once
    "extraArgs": 64,
    "mountOptions": 64,
    "gate": 16,
    "conditions": 32,  # one per condition type (a list map keyed by type)
    "metrics": 16,  # one figure per evaluation metric (seven today)
    "runs": 10,  # status.runs: enough to roll back, small enough for the status
    "passedRuns": 10,  # a subset of the fine-tune's status.runs
    "rejectedRuns": 10,  # runs whose benchmark missed the SLO (bounded like status.runs)
    "benchmarks": 10,  # benchmark results kept, one per revision and load
}


# Bounded string types, named for what they hold.
Name = Annotated[str, Field(pattern=_DNS_NAME, max_length=MAX_LENGTH["name"])]
NodeLabel = Annotated[str, Field(pattern=_DNS_NAME, max_length=MAX_LENGTH["label"])]
Uri = Annotated[str, Field(pattern=_URI, max_length=MAX_LENGTH["uri"])]
HfRepo = Annotated[str, Field(pattern=_HF_REPO, max_length=MAX_LENGTH["hfRepo"])]
Image = Annotated[str, Field(min_length=1, max_length=MAX_LENGTH["image"])]
Quantity = Annotated[str, Field(min_length=1, max_length=MAX_LENGTH["quantity"])]
RunId = Annotated[str, Field(pattern=_RUN, max_length=MAX_LENGTH["run"])]
Timestamp = Annotated[str, Field(max_length=MAX_LENGTH["time"])]
Text = Annotated[str, Field(max_length=MAX_LENGTH["text"])]
# Status values: bounded, not matched (the operator writes them; a pattern could only fail its write).
StatusName = Annotated[str, Field(max_length=MAX_LENGTH["name"])]
StatusUri = Annotated[str, Field(max_length=MAX_LENGTH["uri"])]
StatusRun = Annotated[str, Field(max_length=MAX_LENGTH["run"])]


class Model(BaseModel):
    """Common settings: camelCase on the wire, unknown fields refused (a typo must not pass)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", validate_default=True)


class StatusModel(Model):
    """A part of a status: the operator's own record, read back on every reconcile. A field it does
    not know (written by another version of the operator) is kept as it is, not refused."""

    model_config = ConfigDict(extra="allow")


# ---------------------------------------------------------------------------- shared pieces


class SecretKeyRef(Model):
    """A key of a Secret in the CR's namespace. Only the reference is stored; never the value."""

    name: Annotated[Name, Field(description="Secret name.")]
    key: Annotated[
        str, Field(min_length=1, max_length=MAX_LENGTH["secretKey"], description="Key inside the Secret.")
    ] = "token"


class TPU(Model):
    """Where the pods run: a TPU generation and slice topology, or `cpu` for clusters without TPUs."""

    accelerator: Annotated[Accelerator, Field(description="TPU generation (v5p, v6e) or cpu.")] = "v5p"
    topology: Annotated[
        str | None,
        Field(
            pattern=_TOPOLOGY,
            max_length=MAX_LENGTH["label"],
            description="Slice topology, e.g. 2x2x1 (v5p-8) or 2x4 (v6e-8). Default: the "
            "generation's smallest single-host slice (v5p 2x2x1, v6e 2x4).",
        ),
    ] = None
    spot: Annotated[
        bool, Field(description="Schedule on Spot TPU nodes (cheaper, may be reclaimed with 15 s notice).")
    ] = False
    reservation: Annotated[NodeLabel | None, Field(description="Name of a specific TPU reservation.")] = None
    node_pool: Annotated[NodeLabel | None, Field(description="Pin the pods to this GKE node pool.")] = None


class ServeTPU(TPU):
    """The serving slice: TPU v6e unless said otherwise."""

    accelerator: Annotated[Accelerator, Field(description="TPU generation (v5p, v6e) or cpu.")] = "v6e"


class Storage(Model):
    """A PersistentVolumeClaim mounted in every pod, for local-path URIs on a real cluster."""

    persistent_volume_claim: Annotated[Name, Field(description="Name of a PVC in the CR's namespace.")]
    mount_path: Annotated[
        str,
        Field(
            pattern=r"^/.+",
            max_length=MAX_LENGTH["path"],
            description="Where the PVC is mounted in every pod; local-path URIs must lie under it.",
        ),
    ] = "/data"


class Images(Model):
    """Per-resource image overrides; the operator's settings give the defaults."""

    training: Annotated[
        Image | None, Field(description="Image of the training pods (default: the operator's workloads image).")
    ] = None
    merge: Annotated[
        Image | None, Field(description="Image of the merge Job (default: the operator's workloads image).")
    ] = None


class Condition(StatusModel):
    """A Kubernetes condition (the metav1.Condition shape)."""

    type: Annotated[
        str, Field(max_length=MAX_LENGTH["conditionType"], description="What the condition is about, e.g. Ready.")
    ]
    status: Annotated[Literal["True", "False", "Unknown"], Field(description="True, False or Unknown.")]
    reason: Annotated[
        str, Field(max_length=MAX_LENGTH["reason"], description="A CamelCase word for the last transition.")
    ]
    message: Annotated[
        str, Field(max_length=MAX_LENGTH["message"], description="Details of the last transition, for people.")
    ] = ""
    last_transition_time: Annotated[Timestamp | None, Field(description="When status last changed (RFC 3339).")] = None
    observed_generation: Annotated[
        int | None, Field(description="The metadata.generation the condition was set for.")
    ] = None


class ObservedStatus(StatusModel):
    """What both kinds' status says: the operator's last word, for people and for tools."""

    message: Annotated[
        str | None, Field(max_length=MAX_LENGTH["message"], description="What is happening now, for people.")
    ] = None
    observed_generation: Annotated[int | None, Field(description="The metadata.generation last reconciled.")] = None
    conditions: Annotated[
        list[Condition], Field(max_length=MAX_ITEMS["conditions"], description="Conditions, one per type.")
    ] = Field(default_factory=list)


# ---------------------------------------------------------------------------- evaluation and gate


class Evaluation(Model):
    """Scored by the training pod after the last step, for the fine-tune and the base model alike.
    Changing it starts a new run: the figures belong to the run that computed them."""

    uri: Annotated[
        Uri | None,
        Field(description="An eval JSONL in the dataset's format; unset: the rows held out by dataset.evalFraction."),
    ] = None
    max_rows: Annotated[int, Field(ge=1, le=100000, description="Rows scored at most (bounds the cost).")] = 256
    max_new_tokens: Annotated[
        int, Field(ge=1, le=8192, description="Greedy tokens generated at most per row with an expected answer.")
    ] = 64
    baseline: Annotated[
        bool, Field(description="Also score the base model on the same rows (doubles the evaluation's cost).")
    ] = True


class MetricFigure(StatusModel):
    """One evaluation figure of a run, with the base model's on the same rows."""

    name: Annotated[
        str,
        Field(
            max_length=MAX_LENGTH["metric"],
            description="evalLoss, perplexity, exactMatch, contains, regexMatch, preferenceAccuracy or rewardMargin.",
        ),
    ]
    value: Annotated[float, Field(description="The fine-tune's figure.")]
    baseline: Annotated[float | None, Field(description="The base model's figure on the same rows.")] = None
    rows: Annotated[int, Field(description="Rows the figure was computed on.")]


class RunEvaluation(StatusModel):
    """The evaluation figures of one run."""

    run: Annotated[StatusRun, Field(description="The run that computed these figures.")]
    summary: Annotated[Text | None, Field(description="The headline figure, as `kubectl get` shows it.")] = None
    metrics: Annotated[
        list[MetricFigure], Field(max_length=MAX_ITEMS["metrics"], description="One figure per metric.")
    ] = Field(default_factory=list)


class FineTuneRun(StatusModel):
    """A run whose merged output exists: what a GemmaServe can serve, roll back to, or gate."""

    run: Annotated[StatusRun, Field(description="Run id: a hash of the training inputs.")]
    merged: Annotated[StatusUri, Field(description="The run's merged Hugging Face model directory.")]
    completion_time: Annotated[Timestamp | None, Field(description="When the merge finished (RFC 3339).")] = None
    evaluation: Annotated[
        list[MetricFigure] | None,
        Field(max_length=MAX_ITEMS["metrics"], description="The run's evaluation figures, if it was evaluated."),
    ] = None


class GateCondition(Model):
    """One condition an output must meet to be rolled out. Bounds are inclusive (min: value >= min;
    max: value <= max); `baseline` compares with the base model's figure on the same rows, in the
    metric's direction: `better` is strict, `noWorse` allows equality. All the bounds set must hold."""

    metric: Annotated[EvalMetric, Field(description="evalLoss and perplexity: lower is better; the others higher.")]
    min: Annotated[float | None, Field(description="Passes when the value is at least this.")] = None
    max: Annotated[float | None, Field(description="Passes when the value is at most this.")] = None
    baseline: Annotated[
        Literal["better", "noWorse"] | None,
        Field(description="better: strictly better than the base model's value; noWorse: better or equal."),
    ] = None

    @model_validator(mode="after")
    def _some_bound(self) -> GateCondition:
        if self.min is None and self.max is None and self.baseline is None:
            raise ValueError(f"gate on {self.metric}: set min, max or baseline")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"gate on {self.metric}: min {self.min} is above max {self.max}: nothing could pass")
        return self


# ---------------------------------------------------------------------------- GemmaFineTune


class ModelSource(Model):
    """The base weights: a Hugging Face-format checkpoint at a URI, or a Hugging Face repo."""

    uri: Annotated[Uri | None, Field(description="gs:// prefix or path of an HF-format safetensors checkpoint.")] = None
    hf_repo: Annotated[
        HfRepo | None,
        Field(description="Hugging Face repository id, e.g. google/gemma-4-31B-it (a Gemma 4 model)."),
    ] = None
    hf_token_secret_ref: Annotated[
        SecretKeyRef | None,
        Field(description="Secret holding the Hugging Face token (google/ Gemma repositories are gated)."),
    ] = None
    preset: Annotated[
        Preset | None,
        Field(
            description="Model size used for planning (HBM fit, cost); inferred from a known "
            "hfRepo. The workloads always read the architecture from config.json."
        ),
    ] = None
    dtype: Annotated[DType, Field(description="dtype of the base weights during training.")] = "bfloat16"

    @model_validator(mode="after")
    def _one_source(self) -> ModelSource:
        if (self.uri is None) == (self.hf_repo is None):
            raise ValueError("set exactly one of uri or hfRepo")
        if self.hf_token_secret_ref is not None and self.hf_repo is None:
            raise ValueError("hfTokenSecretRef is only used with hfRepo")
        return self


class Dataset(Model):
    """Training data: JSONL, one example a line."""

    uri: Annotated[Uri, Field(description="gs:// URI or path of a JSONL file.")]
    # The rest is the training contract's (gemma_workloads.config.DatasetConfig), declared there.
    format: config.DatasetFormatField
    max_seq_len: config.MaxSeqLen
    packing: config.Packing
    eval_fraction: config.EvalFraction
    skip_invalid: config.SkipInvalid

    @model_validator(mode="after")
    def _pairs_unpacked(self) -> Dataset:
        if self.format == "preference" and self.packing:
            raise ValueError("packing: preference pairs are not packed (each answer is its own sequence); set it false")
        return self


class Lora(Model):
    """LoRA adapter settings (Qwix). Targets use Hugging Face projection names."""

    # Declared by the training contract (gemma_workloads.config.LoraConfig); the targets here are typed.
    rank: config.LoraRank
    alpha: config.LoraAlpha
    dropout: config.LoraDropout
    target_modules: Annotated[
        list[LoraTarget],
        Field(
            min_length=1,
            max_length=MAX_ITEMS["targetModules"],
            description="Projections to adapt, each once (default: all seven). k_proj covers the global layers' "
            "keys too; on sliding layers k_proj and v_proj are one fused projection, so list both or neither.",
        ),
    ] = Field(default_factory=lambda: list(config.LORA_MODULES))

    @field_validator("target_modules")
    @classmethod
    def _kv_together(cls, targets: list[str]) -> list[str]:
        if len(set(targets)) != len(targets):
            raise ValueError("targetModules lists a module twice")
        if ("k_proj" in targets) != ("v_proj" in targets):
            raise ValueError(
                "k_proj and v_proj share one fused projection (kv_einsum) on sliding layers: list both or neither"
            )
        return targets


class Mesh(Model):
    """JAX device mesh: fsdp x tp must equal the slice's chip count."""

    fsdp: Annotated[int, Field(ge=1, description="Devices the parameters and the batch are sharded over (FSDP).")]
    tp: Annotated[
        int, Field(ge=1, description="Tensor-parallel devices; must divide the attention and KV heads (at most 4).")
    ]


class Training(Model):
    """Optimisation settings. The effective batch is batchSize rows (sequences, or pairs with method dpo or
    orpo) per optimizer step."""

    steps: Annotated[int | None, Field(ge=1, description="Optimizer steps (or set epochs).")] = None
    epochs: Annotated[int | None, Field(ge=1, description="Passes over the data (or set steps); default 1.")] = None
    batch_size: Annotated[
        int,
        Field(ge=1, description="Global batch: rows per step (sequences; pairs with method dpo or orpo)."),
    ] = 8
    micro_batch_size: Annotated[
        int | None,
        Field(
            ge=1,
            description="Rows (sequences, or pairs) per forward pass across the slice; batchSize/microBatchSize "
            "is the gradient accumulation. Default: the mesh's data-parallel size.",
        ),
    ] = None
    learning_rate: Annotated[
        float, Field(gt=0, le=1.0, description="Peak learning rate of AdamW, reached after warmupSteps (0 < lr <= 1).")
    ] = 1e-4
    lr_schedule: Annotated[
        LrSchedule,
        Field(description="After warmup: cosine (decays to 0 at the last step), linear (decays to 0) or constant."),
    ] = "cosine"
    warmup_steps: Annotated[
        int, Field(ge=0, description="Steps of linear warmup from 0 to learningRate; must be below steps.")
    ] = 0
    weight_decay: Annotated[float, Field(ge=0, description="AdamW's decoupled weight decay (0: none).")] = 0.0
    seed: Annotated[
        int, Field(ge=0, description="Seeds the data shuffle, the held-out split and the adapter's init.")
    ] = 0
    checkpoint_every: Annotated[int, Field(ge=1, description="Steps between checkpoints.")] = 100
    keep_checkpoints: Annotated[int, Field(ge=1, description="Checkpoints kept.")] = 3
    log_every: Annotated[int, Field(ge=1, description="Steps between progress reports.")] = 10
    gradient_checkpointing: Annotated[
        bool,
        Field(
            description="Rematerialise decoder layers where HBM needs it: the plan keeps all activations, "
            "the matmul outputs, or only layer inputs, the fastest its HBM estimate fits."
        ),
    ] = True
    mesh: Annotated[Mesh | None, Field(description="Override the derived mesh.")] = None
    compilation_cache: Annotated[
        bool,
        Field(
            description="Keep the compiled XLA programs of the training, evaluation and merge pods in a persistent "
            "cache (under output.uri, or the operator's cluster-wide one), so that a restarted attempt, a resumed "
            "run and the next run of the same shapes read them instead of compiling; false: every pod compiles anew."
        ),
    ] = True
    scan_layers: Annotated[
        bool,
        Field(
            description="Compile one period of the attention pattern and scan it over the decoder's depth, so "
            "compiling takes the same time at any depth; false: every layer unrolled in the program. "
            "Checkpoints are the same either way: switching resumes the run."
        ),
    ] = True

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> Training:
        # No defaulting here: an API-server default for epochs would clash with a later steps.
        if self.steps is not None and self.epochs is not None:
            raise ValueError("set steps or epochs, not both")
        return self


def _unset_by_default(contract_field: Any) -> Any:
    """A contract field (its type, bounds and description) that stays unset unless the CR sets it: the
    API server then stores no default, so a rule can tell a value set for the other method from none,
    and the plan hands the contract's default to the pod."""
    base, declared = get_args(contract_field)
    return Annotated[
        Annotated[base, *declared.metadata] | None,
        Field(description=f"{declared.description} Unset: {declared.default:g}."),
    ]


if TYPE_CHECKING:
    DpoBeta = float | None  # a type checker cannot read a type built at run time
    OrpoLambda = float | None
else:
    DpoBeta = _unset_by_default(config.PreferenceBeta)
    OrpoLambda = _unset_by_default(config.OrpoLambda)


class Preference(Model):
    """The settings of the preference methods (Tunix's DPO trainer: beta, lambda_orpo, label_smoothing).
    beta is dpo's and orpoLambda orpo's: either one set for the other method is refused."""

    beta: DpoBeta = None
    orpo_lambda: OrpoLambda = None
    label_smoothing: config.LabelSmoothing


class Output(Model):
    """Where the run writes: runs/<run>/ holds the checkpoints and the merged model."""

    uri: Annotated[Uri, Field(description="Where checkpoints and the merged model are written.")]


class Merge(Model):
    """The merge of the LoRA adapter into full Hugging Face safetensors after training."""

    enabled: Annotated[bool, Field(description="Merge after training (false: keep the LoRA checkpoint only).")] = True
    dtype: Annotated[
        MergeDType | None,
        Field(description="dtype of the merged projections; unset: each keeps the base checkpoint's dtype."),
    ] = None
    shard_size: Annotated[
        str, Field(pattern=_SIZE, max_length=MAX_LENGTH["quantity"], description="Largest output shard, e.g. 5GB.")
    ] = "5GB"
    output: Annotated[
        MergeOutputKind,
        Field(
            description="What the merge writes: the merged model and a PEFT adapter folder beside it (both), "
            "the merged model only (merged), or the adapter only (adapter: a GemmaServe cannot serve such a run)."
        ),
    ] = "both"


class GemmaFineTuneSpec(Model):
    """GemmaFineTune: a LoRA fine-tune of Gemma 4 on a TPU slice, merged to HF safetensors."""

    model: ModelSource
    dataset: Dataset
    output: Output
    lora: Lora = Field(default_factory=Lora)
    training: Training = Field(default_factory=Training)
    # What training optimises: the training contract's (gemma_workloads.config.TrainConfig.method).
    method: config.MethodField
    preference: Annotated[
        Preference | None,
        Field(description="Settings of method dpo or orpo; unset: their defaults. Only with those methods."),
    ] = None
    tpu: TPU = Field(default_factory=TPU)
    merge: Merge = Field(default_factory=Merge)
    suspend: Annotated[bool, Field(description="Stop (or hold) training; resume later.")] = False
    service_account_name: Annotated[
        Name | None, Field(description="ServiceAccount of the workload pods (default: the operator's setting).")
    ] = None
    images: Images = Field(default_factory=Images)
    storage: Storage | None = None
    backoff_limit: Annotated[
        int,
        Field(ge=0, le=100, description="Pod failures tolerated (preemptions are not counted)."),
    ] = 3
    evaluation: Annotated[
        Evaluation | None, Field(description="Score the fine-tune and its base model after training.")
    ] = None

    @model_validator(mode="after")
    def _evaluation_rows(self) -> GemmaFineTuneSpec:
        if self.evaluation is not None and self.evaluation.uri is None and self.dataset.eval_fraction == 0:
            raise ValueError(
                "evaluation has no rows: set spec.evaluation.uri (an eval JSONL) or spec.dataset.evalFraction "
                "above 0 (a held-out split)"
            )
        return self

    @model_validator(mode="after")
    def _method_settings(self) -> GemmaFineTuneSpec:
        if problem := _preference_problem(self.method, self.dataset.format, self.preference):
            raise ValueError(problem)
        return self


def _preference_problem(method: str, dataset_format: str, preference: Preference | None) -> str | None:
    """What is wrong with a method's data and settings: dpo and orpo train on preference pairs and
    only they do, and each takes its own setting (the CRD's CEL rules say the same)."""
    pairs = method in config.PREFERENCE_METHODS
    if pairs and dataset_format != "preference":
        return (
            f"method {method} trains on dataset.format preference ({{prompt, chosen, rejected}} rows), "
            f"not {dataset_format}"
        )
    if not pairs and dataset_format == "preference":
        return f"dataset.format preference is for method dpo or orpo (method is {method})"
    if preference is None:
        return None
    if not pairs:
        return f"preference is only used with method dpo or orpo (method is {method})"
    if preference.beta is not None and method != "dpo":
        return f"preference.beta is only used with method dpo (method is {method}: its weight is orpoLambda)"
    if preference.orpo_lambda is not None and method != "orpo":
        return f"preference.orpoLambda is only used with method orpo (method is {method}: its setting is beta)"
    return None


class Progress(StatusModel):
    """Live training progress, read from the training pod's log."""

    step: Annotated[int, Field(description="The last optimizer step reported.")] = 0
    total_steps: Annotated[int | None, Field(description="Steps of the whole run.")] = None
    loss: Annotated[float | None, Field(description="Training loss at that step.")] = None
    tokens_per_second: Annotated[float | None, Field(description="Training throughput over the slice.")] = None


class FineTuneOutputs(StatusModel):
    """What the current run has written."""

    checkpoint: Annotated[StatusUri | None, Field(description="The final LoRA checkpoint (Orbax).")] = None
    step: Annotated[int | None, Field(description="The training step of that checkpoint.")] = None
    merged: Annotated[StatusUri | None, Field(description="The merged Hugging Face model directory.")] = None
    adapter: Annotated[
        StatusUri | None,
        Field(
            description="The LoRA adapter as a Hugging Face PEFT folder (adapter_config.json, adapter_model.safetensors)."
        ),
    ] = None


class FineTuneChildren(StatusModel):
    """The names of the objects the operator created for the current run."""

    config_map: Annotated[StatusName | None, Field(description="The workload config's ConfigMap.")] = None
    training: Annotated[StatusName | None, Field(description="The training Job or JobSet.")] = None
    merge: Annotated[StatusName | None, Field(description="The merge Job.")] = None


class GemmaFineTuneStatus(ObservedStatus):
    """What the operator observed of a GemmaFineTune."""

    phase: Annotated[
        reasons.FineTunePhase | None,
        Field(description="Where the fine-tune is in its life."),
    ] = None
    model: Annotated[Text | None, Field(description="The base model, as planned.")] = None
    topology: Annotated[Text | None, Field(description="The slice, e.g. v5p 2x2x1.")] = None
    run: Annotated[StatusRun | None, Field(description="Id of the current run: a hash of the training inputs.")] = None
    attempt: Annotated[
        int | None, Field(description="Attempt of the current run: grows when its workload is recreated.")
    ] = None
    children: Annotated[FineTuneChildren | None, Field(description="The current run's objects.")] = None
    progress: Annotated[Progress | None, Field(description="Live training progress.")] = None
    outputs: Annotated[FineTuneOutputs | None, Field(description="What the current run has written.")] = None
    start_time: Annotated[Timestamp | None, Field(description="When training started (RFC 3339).")] = None
    completion_time: Annotated[
        Timestamp | None, Field(description="When the fine-tune succeeded or failed (RFC 3339).")
    ] = None
    chip_hours: Annotated[float | None, Field(description="TPU chip-hours used by this run.")] = None
    estimated_cost: Annotated[
        float | None,
        Field(
            description="chipHours at the plan's price per chip-hour (settings; Spot rate on Spot where set), in dollars."
        ),
    ] = None
    accounted_at: Annotated[Timestamp | None, Field(description="When chipHours was last brought up to date.")] = None
    restarts: Annotated[int | None, Field(description="Pod failures counted against spec.backoffLimit.")] = None
    preemptions: Annotated[
        int | None, Field(description="Preemptions survived (resumed from a checkpoint, not counted as failures).")
    ] = None
    evaluation: Annotated[RunEvaluation | None, Field(description="The current run's evaluation figures.")] = None
    runs: Annotated[
        list[FineTuneRun],
        Field(
            max_length=MAX_ITEMS["runs"],
            description="Runs whose merged output exists, newest first (bounded): what a GemmaServe can pin.",
        ),
    ] = Field(default_factory=list)


# ---------------------------------------------------------------------------- GemmaServe


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
    """Where the XLA compilation cache persists across restarts and replicas (VLLM_XLA_CACHE_PATH).
    Without it every restart compiles again (about 8 minutes for 31B on v6e-8)."""

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


# The longest benchmark a spec may ask for: it shares the service with real traffic.
MAX_BENCHMARK_SECONDS = 3600
MAX_BENCHMARK_REQUESTS = 10000


class BenchmarkSLO(Model):
    """What a revision must serve under the benchmark's load. Every bound set must hold; each is
    positive. Latencies are the p99 over the benchmark's requests, in milliseconds."""

    ttft_p99_ms: Annotated[
        float | None, Field(gt=0, le=3600000, description="Time to first token, p99, at most this (ms).")
    ] = None
    tpot_p99_ms: Annotated[
        float | None,
        Field(gt=0, le=600000, description="Time per output token after the first, p99, at most this (ms)."),
    ] = None
    itl_p99_ms: Annotated[
        float | None, Field(gt=0, le=600000, description="Inter-token latency, p99, at most this (ms).")
    ] = None
    min_output_tokens_per_second: Annotated[
        float | None, Field(gt=0, description="Output tokens per second over the benchmark, at least this.")
    ] = None

    @model_validator(mode="after")
    def _some_bound(self) -> BenchmarkSLO:
        if None is self.ttft_p99_ms is self.tpot_p99_ms is self.itl_p99_ms is self.min_output_tokens_per_second:
            raise ValueError("slo: set at least one of ttftP99Ms, tpotP99Ms, itlP99Ms or minOutputTokensPerSecond")
        return self


class Benchmark(Model):
    """A load measured once per revision after it becomes Ready, by `vllm bench serve` from the
    serving image, against the service: random prompts of inputLen tokens (or those of promptsUri),
    each answered with outputLen tokens, at most maxConcurrency in flight (and requestRate per
    second, if set)."""

    input_len: Annotated[int, Field(ge=1, le=262144, description="Prompt tokens per request.")] = 256
    output_len: Annotated[int, Field(ge=1, le=262144, description="Output tokens per request (EOS ignored).")] = 128
    num_prompts: Annotated[
        int, Field(ge=1, le=MAX_BENCHMARK_REQUESTS, description="Requests sent in all (unless durationSeconds).")
    ] = 64
    prompts_uri: Annotated[
        Uri | None,
        Field(
            description="A JSONL of prompts to send instead of random ones, one object with a `prompt` field "
            "per line (an evaluation set in the prompt-completion format): gs:// or a path under "
            "spec.storage.mountPath. inputLen is then the prompts' own; each is answered with outputLen tokens.",
        ),
    ] = None
    max_concurrency: Annotated[
        int, Field(ge=1, le=1024, description="Requests in flight at most: bounds the load real traffic competes with.")
    ] = 4
    request_rate: Annotated[
        float | None, Field(gt=0, description="Requests started per second (Poisson); unset: as fast as allowed.")
    ] = None
    duration_seconds: Annotated[
        int | None,
        Field(
            ge=1,
            le=MAX_BENCHMARK_SECONDS,
            description="With requestRate: send requestRate x durationSeconds requests (instead of numPrompts), "
            "so the load lasts about this long; below timeoutSeconds.",
        ),
    ] = None
    timeout_seconds: Annotated[
        int,
        Field(
            ge=30,
            le=MAX_BENCHMARK_SECONDS,
            description="The benchmark Job's deadline (activeDeadlineSeconds); the operator's "
            "benchmark_max_seconds may set a lower limit.",
        ),
    ] = 600
    slo: Annotated[BenchmarkSLO | None, Field(description="What the revision must serve; unset: only measured.")] = None

    @model_validator(mode="after")
    def _duration(self) -> Benchmark:
        if self.duration_seconds is None:
            return self
        if self.request_rate is None:
            raise ValueError("benchmark.durationSeconds needs benchmark.requestRate: it sets how many requests")
        if self.duration_seconds >= self.timeout_seconds:
            raise ValueError(
                f"benchmark.durationSeconds {self.duration_seconds} must be below timeoutSeconds {self.timeout_seconds}"
            )
        if self.requests > MAX_BENCHMARK_REQUESTS:
            raise ValueError(
                f"benchmark.requestRate x durationSeconds is {self.requests} requests: at most {MAX_BENCHMARK_REQUESTS}"
            )
        return self

    @property
    def requests(self) -> int:
        """The requests sent: numPrompts, or requestRate x durationSeconds."""
        if self.duration_seconds is None or self.request_rate is None:
            return self.num_prompts
        return math.ceil(self.request_rate * self.duration_seconds)

    on_miss: Annotated[
        Literal["rollback", "report"],
        Field(
            description="A missed SLO: report (SLOMet False and a Warning Event), or rollback to the previous "
            "run of the fine-tune (the run is rejected until it or the SLO changes)."
        ),
    ] = "report"


class BenchmarkResult(Model):
    """The figures of one benchmark of one revision, and what serving costs at them."""

    revision: Annotated[Text, Field(description="The revision measured.")]
    key: Annotated[Text, Field(description="Hash of the revision and the load: one benchmark per key.")]
    run: Annotated[StatusRun | None, Field(description="The fine-tune run served at that revision.")] = None
    job: Annotated[StatusName | None, Field(description="The benchmark Job.")] = None
    state: Annotated[Literal["Running", "Succeeded", "Failed"], Field(description="Where the benchmark is.")]
    message: Annotated[Text | None, Field(description="Why it failed, or the SLO verdict.")] = None
    ttft_p50_ms: Annotated[float | None, Field(description="Time to first token, median (ms).")] = None
    ttft_p90_ms: Annotated[float | None, Field(description="Time to first token, p90 (ms).")] = None
    ttft_p99_ms: Annotated[float | None, Field(description="Time to first token, p99 (ms).")] = None
    tpot_p50_ms: Annotated[float | None, Field(description="Time per output token, median (ms).")] = None
    tpot_p99_ms: Annotated[float | None, Field(description="Time per output token, p99 (ms).")] = None
    itl_p50_ms: Annotated[float | None, Field(description="Inter-token latency, median (ms).")] = None
    itl_p99_ms: Annotated[float | None, Field(description="Inter-token latency, p99 (ms).")] = None
    output_tokens_per_second: Annotated[float | None, Field(description="Output tokens per second.")] = None
    requests_per_second: Annotated[float | None, Field(description="Requests completed per second.")] = None
    goodput: Annotated[
        float | None, Field(description="Share of requests within the SLO's ttft and tpot bounds (0-1).")
    ] = None
    completed: Annotated[int | None, Field(description="Requests that completed.")] = None
    errors: Annotated[int | None, Field(description="Requests that failed.")] = None
    duration_seconds: Annotated[float | None, Field(description="Wall time of the benchmark.")] = None
    cost_per_hour: Annotated[
        float | None, Field(description="Serving cost: replicas x chips x price per chip-hour (settings), $/hour.")
    ] = None
    cost_per_million_output_tokens: Annotated[
        float | None, Field(description="costPerHour at the measured output tokens per second, $ per 1M tokens.")
    ] = None
    slo_met: Annotated[bool | None, Field(description="Whether the figures meet spec.benchmark.slo.")] = None


class RejectedRun(Model):
    """A fine-tune run whose revision missed the benchmark's SLO under onMiss: rollback."""

    run: Annotated[StatusRun, Field(description="The rejected run.")]
    revision: Annotated[Text, Field(description="Its revision that was measured.")]
    slo: Annotated[Text, Field(description="Hash of the SLO it missed: a changed SLO tries the run again.")]
    message: Annotated[Text | None, Field(description="The figures that missed.")] = None


class GemmaServeSpec(Model):
    """GemmaServe: an OpenAI-compatible vLLM service of a Gemma 4 model on TPU."""

    model: ServeModel
    tpu: ServeTPU = Field(default_factory=ServeTPU)
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
            description="What the service's TPU slices have cost so far: replicas x chips x the price per "
            "chip-hour (settings), in dollars; none on the cpu profile."
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


# ---------------------------------------------------------------------------- the kinds


class Kind:
    """What crd.py and the handlers need to know of one custom resource kind."""

    def __init__(
        self,
        kind: str,
        plural: str,
        short_name: str,
        spec: type[Model],
        status: type[Model],
        columns: list[dict],
    ) -> None:
        self.kind, self.plural, self.short_name = kind, plural, short_name
        self.spec, self.status, self.columns = spec, status, columns
        self.singular = kind.lower()


FINETUNE = Kind(
    "GemmaFineTune",
    "gemmafinetunes",
    "gft",
    GemmaFineTuneSpec,
    GemmaFineTuneStatus,
    [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
        {"name": "Total", "type": "integer", "jsonPath": ".status.progress.totalSteps"},
        {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss", "priority": 1},
        {"name": "Model", "type": "string", "jsonPath": ".status.model"},
        {"name": "Slice", "type": "string", "jsonPath": ".status.topology"},
        {"name": "Eval", "type": "string", "jsonPath": ".status.evaluation.summary"},
        {"name": "Merged", "type": "string", "jsonPath": ".status.outputs.merged", "priority": 1},
        {"name": "Adapter", "type": "string", "jsonPath": ".status.outputs.adapter", "priority": 1},
        {"name": "Chip-Hours", "type": "number", "jsonPath": ".status.chipHours", "priority": 1},
        {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ],
)

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

KINDS = {k.kind: k for k in (FINETUNE, SERVE)}
