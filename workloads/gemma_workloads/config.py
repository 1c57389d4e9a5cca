"""The contract between the operator and the pods it starts.

The operator renders a `TrainConfig` or `MergeConfig` into a ConfigMap; the pod reads it with
`python -m gemma_workloads train --config FILE` (or `merge`). Results come back the other way:
a JSON `TrainResult`/`MergeResult` in the pod's termination message, and `Progress` lines on
stdout that the operator reads from the pod log. This module must stay light (pydantic only):
the operator imports it and never imports jax.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Exit codes: the operator's failure policy reads these (see gemma_operator.failure_policy).
EXIT_OK = 0
EXIT_FAILED = 1  # an application error: not retried
EXIT_INVALID_INPUT = 2  # bad config or data: not retried
EXIT_PREEMPTED = 42  # stopped by SIGTERM after a checkpoint: retried, not counted as a failure
MERGE_SHARD_WRITERS = 2  # output shards the merge writes at once (what a FUSE sidecar must stage)

TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LOG_LIMIT = 4096  # bytes Kubernetes keeps of a termination message

# HF projection names -> Tunix Gemma 4 modules. k_proj also covers the global layers'
# k_einsum; on sliding layers k and v are one fused kv_einsum.
LORA_MODULES: dict[str, tuple[str, ...]] = {
    "q_proj": ("q_einsum",),
    "k_proj": ("kv_einsum", "k_einsum"),
    "v_proj": ("kv_einsum",),
    "o_proj": ("attn_vec_einsum",),
    "gate_proj": ("gate_proj",),
    "up_proj": ("up_proj",),
    "down_proj": ("down_proj",),
}

# The fields a GemmaFineTune's spec.dataset and spec.lora share with this contract, each bound,
# default and description declared once: gemma_operator.api declares its fields with these types,
# so what the API admits is what the pods accept, and the CRD documents the same bounds.
DatasetFormat = Literal["chat", "prompt-completion", "text", "preference"]
DatasetFormatField = Annotated[
    DatasetFormat,
    Field(
        default="chat",
        description="chat: {messages: [{role, content}]}; prompt-completion: {prompt, completion}; text: {text}; "
        "preference (methods dpo and orpo): {prompt: a user turn or a list of messages, chosen, rejected}.",
    ),
]
MaxSeqLen = Annotated[int, Field(default=2048, ge=16, le=262144, description="Tokens per sequence.")]
Packing = Annotated[bool, Field(default=False, description="Pack several examples into one sequence.")]
EvalFraction = Annotated[
    float, Field(default=0.0, ge=0.0, le=0.5, description="Fraction of examples held out for evaluation.")
]
SkipInvalid = Annotated[
    bool, Field(default=False, description="Skip malformed lines (and report how many) instead of failing.")
]
LoraRank = Annotated[
    int, Field(default=16, ge=1, le=1024, description="LoRA rank: the adapter's inner dimension (1-1024).")
]
LoraAlpha = Annotated[
    float, Field(default=32.0, gt=0, description="LoRA alpha: the adapter's update is scaled by alpha/rank.")
]
LoraDropout = Annotated[
    float, Field(default=0.0, ge=0.0, lt=1.0, description="Dropout on the adapter's input during training, in [0, 1).")
]

# What training optimises: supervised answers, or preference pairs (Tunix's DPO and ORPO losses).
Method = Literal["sft", "dpo", "orpo"]
PREFERENCE_METHODS = ("dpo", "orpo")
MethodField = Annotated[
    Method,
    Field(
        default="sft",
        description="sft: learn the answers of the dataset; dpo: Direct Preference Optimization on chosen/rejected "
        "pairs, the reference being the base model (the adapter off); orpo: odds-ratio preference optimisation "
        "(the chosen answers' loss plus an odds-ratio term, no reference). dpo and orpo take dataset.format "
        "preference.",
    ),
]
PreferenceBeta = Annotated[
    float,
    Field(
        default=0.1,
        gt=0,
        le=10,
        description="DPO's beta: how far the fine-tune may move from the base (smaller: further); 0 < beta <= 10.",
    ),
]
OrpoLambda = Annotated[
    float,
    Field(default=0.1, gt=0, le=10, description="ORPO's lambda: the weight of the odds-ratio term; 0 < lambda <= 10."),
]
LabelSmoothing = Annotated[
    float,
    Field(
        default=0.0,
        ge=0,
        lt=0.5,
        description="The share of pairs assumed mislabelled (conservative DPO/ORPO); 0 <= labelSmoothing < 0.5.",
    ),
]


# How the backward pass treats each decoder layer (gemma_workloads.training.remat; chosen by the operator
# from its HBM estimate, gemma_operator.fit.remat_policy): fastest first.
REMAT_POLICIES = ("none", "dots", "offload", "full")
ATTENTION_PATHS = ("auto", "reference", "xla", "cudnn", "splash")  # gemma_workloads.training.attention

# JAX's persistent compilation cache of a pod (gemma_workloads.compilation_cache says what it keys on).
CompilationCacheDir = Annotated[
    str | None,
    Field(
        description="JAX's persistent compilation cache, a local path or gs://: programs that took a second or "
        "more to compile are written there and read back by any later process compiling the same program "
        "(a restart, a resumed run, the next run of the same shapes); None: no cache."
    ),
]


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @classmethod
    def load(cls, path: str | Path):
        """Read a config file (JSON or YAML)."""
        text = Path(path).read_text()
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            import yaml

            data = yaml.safe_load(text)
        return cls.model_validate(data)

    def dumps(self) -> str:
        return self.model_dump_json(indent=2)


class DatasetConfig(_Config):
    path: str
    format: DatasetFormatField
    max_seq_len: MaxSeqLen
    packing: Packing
    eval_fraction: EvalFraction
    skip_invalid: SkipInvalid

    @property
    def chat(self) -> bool:
        """Rendered through the checkpoint's chat template (chat rows and preference pairs)."""
        return self.format in ("chat", "preference")


class LoraConfig(_Config):
    rank: LoraRank
    alpha: LoraAlpha
    dropout: LoraDropout
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_MODULES))

    @model_validator(mode="after")
    def _known_targets(self) -> LoraConfig:
        unknown = [t for t in self.target_modules if t not in LORA_MODULES]
        if unknown:
            raise ValueError(f"unknown LoRA target module(s) {unknown}; allowed: {sorted(LORA_MODULES)}")
        return self

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


class PreferenceConfig(_Config):
    """The settings of a preference method (Tunix's DPOTrainingConfig names them beta, lambda_orpo
    and label_smoothing)."""

    beta: PreferenceBeta
    orpo_lambda: OrpoLambda
    label_smoothing: LabelSmoothing


class MeshConfig(_Config):
    fsdp: Annotated[int, Field(ge=1)]
    tp: Annotated[int, Field(ge=1)]


# Metric names as they appear in status and in a GemmaServe's rollout gate.
EVAL_METRICS: dict[str, str] = {
    "evalLoss": "mean loss per answer token (lower is better)",
    "perplexity": "exp(evalLoss) (lower is better)",
    "exactMatch": "share of rows with an expected answer whose greedy answer equals it (higher is better)",
    "contains": "share of rows with an expected answer whose greedy answer contains it (higher is better)",
    "regexMatch": "share of rows with an expected pattern that the greedy answer matches (higher is better)",
    "preferenceAccuracy": "share of preference pairs whose chosen answer the model gives a higher log-probability "
    "than the rejected one (higher is better)",
    "rewardMargin": "mean over preference pairs of log p(chosen) - log p(rejected), in nats (higher is better)",
}
LOWER_IS_BETTER = frozenset({"evalLoss", "perplexity"})


class EvaluationConfig(_Config):
    """Scored after the last step, on the accelerator, for the fine-tune and the base model alike."""

    path: str | None = Field(
        default=None, description="An eval JSONL in the dataset's format; None: the held-out split."
    )
    max_rows: Annotated[int, Field(ge=1)] = 256
    max_new_tokens: Annotated[int, Field(ge=1)] = 64
    baseline: bool = Field(default=True, description="Also score the base model (the adapter off).")


class TrainConfig(_Config):
    """Everything the training pod needs; paths may be local or gs://."""

    model_path: str
    model_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    dataset: DatasetConfig
    lora: LoraConfig = Field(default_factory=LoraConfig)  # type: ignore[arg-type]  # its fields' defaults are in their Annotated Field, which the checker does not read
    method: MethodField = "sft"
    preference: PreferenceConfig = Field(default_factory=PreferenceConfig)  # type: ignore[arg-type]  # as lora
    steps: Annotated[int | None, Field(ge=1)] = None
    epochs: Annotated[int | None, Field(ge=1)] = None
    batch_size: Annotated[int, Field(ge=1, description="Rows per optimizer step (pairs, for dpo and orpo).")] = 8
    micro_batch_size: Annotated[int, Field(ge=1, description="Rows (pairs) per forward pass.")] = 1
    learning_rate: Annotated[float, Field(gt=0)] = 1e-4
    lr_schedule: Literal["cosine", "linear", "constant"] = "cosine"
    warmup_steps: Annotated[int, Field(ge=0)] = 0
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    seed: int = 0
    checkpoint_every: Annotated[int, Field(ge=1)] = 100
    keep_checkpoints: Annotated[int, Field(ge=1)] = 3
    log_every: Annotated[int, Field(ge=1)] = 10
    gradient_checkpointing: bool = True
    remat_policy: Annotated[
        Literal["none", "dots", "offload", "full"] | None,
        Field(description="What the backward pass recomputes; None: 'full' with gradient_checkpointing, else 'none'."),
    ] = None
    attention: Annotated[
        Literal["auto", "reference", "xla", "cudnn", "splash"],
        Field(
            description="Training attention kernel; auto: splash on TPU, cuDNN on GPU, Tunix's own (reference) elsewhere."
        ),
    ] = "auto"
    scan_layers: Annotated[
        bool,
        Field(
            description="Run the decoder layers as a scan over repetitions of the attention pattern, so that "
            "compiling the step takes the same time at any depth; checkpoints keep the unrolled layout."
        ),
    ] = True
    loss_chunk_tokens: Annotated[
        int | None, Field(ge=1, description="Tokens per chunk of the cross-entropy; None: whole float32 logits.")
    ] = 512
    mesh: MeshConfig | None = None
    output_dir: str
    num_hosts: Annotated[int, Field(ge=1)] = 1
    peak_tflops_per_device: Annotated[
        float | None, Field(gt=0, description="For the MFU estimate; None: derived from the device.")
    ] = None
    termination_grace_seconds: Annotated[
        float,
        Field(
            ge=0,
            description="The pod's terminationGracePeriodSeconds: on SIGTERM a final checkpoint "
            "is taken only if it fits in this time.",
        ),
    ] = 30.0
    termination_log: str = TERMINATION_LOG
    evaluation: EvaluationConfig | None = None
    compilation_cache_dir: CompilationCacheDir = None

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.steps is not None and self.epochs is not None:
            raise ValueError("set steps or epochs, not both")
        if self.steps is None and self.epochs is None:
            self.epochs = 1
        if self.batch_size % self.micro_batch_size:
            raise ValueError(
                f"batch_size {self.batch_size} is not a multiple of micro_batch_size {self.micro_batch_size}"
            )
        if (self.method in PREFERENCE_METHODS) != (self.dataset.format == "preference"):
            raise ValueError(
                f"method {self.method!r} with dataset.format {self.dataset.format!r}: the methods dpo and orpo "
                "train on the preference format, and only they do"
            )
        if self.dataset.format == "preference" and self.dataset.packing:
            raise ValueError("dataset.packing: preference pairs are not packed (each answer is its own sequence)")
        return self

    @property
    def preference_tuning(self) -> bool:
        """DPO or ORPO: a micro-batch holds pairs, two sequences each."""
        return self.method in PREFERENCE_METHODS

    @property
    def checkpoint_dir(self) -> str:
        return join(self.output_dir, CHECKPOINT_FOLDER)

    @property
    def remat(self) -> str:
        """The remat policy in force."""
        return self.remat_policy or ("full" if self.gradient_checkpointing else "none")

    @property
    def grad_accumulation(self) -> int:
        return self.batch_size // self.micro_batch_size


LORA_METADATA = "lora.json"
CHECKPOINT_FOLDER = "checkpoints"  # a run's checkpoint_dir, inside its output_dir


class LoraMetadata(BaseModel):
    """`<checkpoint_dir>/lora.json`, written by training before its first checkpoint: how the
    adapter was made, so a merge needs nothing but the checkpoint directory.

    Checkpoint layout, as Tunix's checkpoint manager writes it with Orbax (`checkpoint_dir` is
    `<output_dir>/checkpoints`; local paths and gs:// alike):

        lora.json                  this model
        <step>/                    one per saved optimizer step, the latest `keep_checkpoints` kept
          _CHECKPOINT_METADATA     JSON; `custom_metadata.data_position` = {micro_batches,
                                   micro_batch_size, epoch, row_in_epoch, fingerprint}
          model_params/            Orbax PyTree (OCDBT): the LoRA parameters only
          optimizer_state/         Orbax PyTree: `opt_state/...` (optax.MultiSteps state around
                                   inject_hyperparams(adamw) when accumulating) and `step/value`

    `model_params` is `nnx.state(model, nnx.LoRAParam)` as saved: every array sits under a trailing
    `value` key (Orbax's view of an nnx Variable) and layer indices are string keys. With D the
    hidden size, F the MLP size, N heads of H, K KV heads (of the layer's kind) and r the rank:
    `layers/<i>/attn/<m>/{w_lora_a,w_lora_b}/value` for m in q_einsum [a (D, r), b (r, N, H)],
    kv_einsum (sliding layers) [a (D, r), b (r, 2, K, H); 2 = k, v], k_einsum (global K=V layers)
    [a (D, r), b (r, K, H)], attn_vec_einsum [a (N, H, r), b (r, D)]; and
    `layers/<i>/mlp/<m>/{kernel_lora_a,kernel_lora_b}/value` for gate_proj, up_proj [a (D, r),
    b (r, F)] and down_proj [a (F, r), b (r, D)]. A weight's delta is a and b contracted over r,
    times alpha / rank, with the axes in the weight's Tunix order: q_einsum's w (N, D, H) gets
    `einsum("dr,rnh->ndh", a, b)`, kv_einsum's w (2, K, D, H) `einsum("dr,rckh->ckdh", a, b)`. A step is complete once Orbax has renamed it from
    `<step>.orbax-checkpoint-tmp-<n>` (local) or written its `commit_success.txt` (gs://); Orbax's
    step listing skips the others.
    """

    rank: int
    alpha: float
    target_modules: list[str]
    base_model_path: str
    model_dtype: str


MergeOutput = Literal["adapter", "merged", "both"]


class MergeConfig(_Config):
    """Everything the merge pod needs; paths may be local or gs://."""

    base_model_path: str
    checkpoint_dir: str
    step: Annotated[int | None, Field(ge=0, description="None: the latest complete checkpoint.")] = None
    output_dir: str
    dtype: Annotated[
        Literal["bfloat16", "float16", "float32"] | None,
        Field(description="dtype of the merged projections; None: each keeps the base's dtype."),
    ] = None
    shard_size_bytes: Annotated[int, Field(ge=1)] = 5 * 10**9
    workers: Annotated[int, Field(ge=1)] = 2
    lora: LoraConfig | None = Field(
        default=None, description="None: read rank/alpha/targets from the checkpoint's metadata."
    )
    output: Annotated[MergeOutput, Field(description="What to write: the merged model, the PEFT adapter, or both.")] = (
        "both"
    )
    adapter_dir: Annotated[
        str | None, Field(description="The PEFT adapter's folder; None: `<output_dir>-adapter`.")
    ] = None
    termination_log: str = TERMINATION_LOG
    compilation_cache_dir: CompilationCacheDir = None

    @property
    def adapter_folder(self) -> str:
        return self.adapter_dir or f"{self.output_dir.rstrip('/')}-adapter"


# ---------------------------------------------------------------------------- results


class Progress(BaseModel):
    """One progress line on the training pod's stdout: `{"event": "progress", ...}`."""

    event: Literal["progress"] = "progress"
    step: int
    total_steps: int
    loss: float | None = None
    tokens_per_second: float | None = None
    mfu: float | None = None
    eval_loss: float | None = None

    def line(self) -> str:
        return self.model_dump_json(exclude_none=True)

    @classmethod
    def last_in(cls, log: str) -> Progress | None:
        """The latest progress line in a log tail, if any."""
        for raw in reversed(log.splitlines()):
            raw = raw.strip()
            if raw.startswith("{") and '"progress"' in raw:
                try:
                    return cls.model_validate_json(raw)
                except ValueError:
                    continue
        return None


class MetricResult(BaseModel):
    """One evaluation figure, with the base model's value on the same rows."""

    name: str
    value: float
    baseline: float | None = None
    rows: int


class TrainResult(BaseModel):
    """The training pod's termination message."""

    status: Literal["succeeded", "preempted", "failed"]
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    eval_loss: float | None = None
    tokens_per_second: float | None = None
    checkpoint: str | None = None
    evaluation: list[MetricResult] | None = None
    error: str | None = None


class MergeResult(BaseModel):
    """The merge pod's termination message."""

    status: Literal["succeeded", "failed"]
    output: str | None = None
    tensors_merged: int | None = None
    bytes_written: int | None = None
    adapter: str | None = None
    adapter_bytes: int | None = None
    adapter_error: str | None = None
    seconds: float | None = None
    error: str | None = None


def write_termination_message(result: BaseModel, path: str = TERMINATION_LOG) -> None:
    """Write a result where Kubernetes picks it up, trimmed to the 4 KiB it keeps."""
    text = result.model_dump_json(exclude_none=True)
    error = getattr(result, "error", None)
    if len(text.encode()) > TERMINATION_LOG_LIMIT and error:
        overflow = len(text.encode()) - TERMINATION_LOG_LIMIT + 16
        result = result.model_copy(update={"error": error[: max(0, len(error) - overflow)] + "…"})
        text = result.model_dump_json(exclude_none=True)
    with contextlib.suppress(OSError):  # not in a pod (or no such path): the result is also logged by the caller
        Path(path).write_text(text)


def join(base: str, *parts: str) -> str:
    """Join path parts for local paths and gs:// URIs alike."""
    out = base.rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}"
    return out


def run_dir(output_uri: str, run: str) -> str:
    """Each run of a fine-tune writes under its own folder, so a re-run never overwrites one."""
    return join(output_uri, "runs", run)
