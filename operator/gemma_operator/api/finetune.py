"""GemmaFineTune: a LoRA fine-tune of Gemma 4 on a TPU slice, merged to Hugging Face safetensors.
Its spec (the base model, where the run writes, the merge) and status (progress, outputs, the runs
a GemmaServe can serve); the training settings are in finetune_training.py."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from gemma_operator import reasons
from gemma_operator.api.common import (
    GPU,
    MAX_ITEMS,
    TPU,
    HfRepo,
    Image,
    Kind,
    Model,
    Name,
    ObservedStatus,
    Preset,
    SecretKeyRef,
    Size,
    StatusModel,
    StatusName,
    StatusRun,
    StatusUri,
    Storage,
    Text,
    Timestamp,
    Uri,
    one_accelerator,
)
from gemma_operator.api.evaluation import Evaluation, MetricFigure, RunEvaluation
from gemma_operator.api.finetune_training import Dataset, Lora, Preference, Training
from gemma_workloads import config

DType = Literal["bfloat16", "float32"]
MergeDType = Literal["bfloat16", "float16", "float32"]
MergeOutputKind = Literal["adapter", "merged", "both"]


# ---------------------------------------------------------------------------- spec


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
    shard_size: Annotated[Size, Field(description="Largest output shard, e.g. 5GB.")] = "5GB"
    output: Annotated[
        MergeOutputKind,
        Field(
            description="What the merge writes: the merged model and a PEFT adapter folder beside it (both), "
            "the merged model only (merged), or the adapter only (adapter: a GemmaServe cannot serve such a run)."
        ),
    ] = "both"


class Images(Model):
    """Per-resource image overrides; the operator's settings give the defaults."""

    training: Annotated[
        Image | None, Field(description="Image of the training pods (default: the operator's workloads image).")
    ] = None
    merge: Annotated[
        Image | None, Field(description="Image of the merge Job (default: the operator's workloads image).")
    ] = None


class GemmaFineTuneSpec(Model):
    """GemmaFineTune: a LoRA fine-tune of Gemma 4 on a TPU slice or GPUs, merged to HF safetensors."""

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
    tpu: Annotated[TPU | None, Field(description="The TPU slice; unset, and no gpu: v5p 2x2x1 (a v5p-8).")] = None
    gpu: Annotated[
        GPU | None, Field(description="NVIDIA GPUs of a GKE GPU node pool instead of a TPU slice; not with tpu.")
    ] = None
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
    def _accelerator(self) -> GemmaFineTuneSpec:
        self.tpu = one_accelerator(self.tpu, self.gpu, TPU)
        return self

    @model_validator(mode="after")
    def _evaluation_rows(self) -> GemmaFineTuneSpec:
        if self.evaluation is not None and self.evaluation.uri is None and self.dataset.eval_fraction == 0:
            raise ValueError(
                "evaluation has no rows: set spec.evaluation.uri (an eval JSONL) or spec.dataset.evalFraction "
                "above 0 (a held-out split)"
            )
        if self.evaluation is not None and self.evaluation.max_new_tokens >= self.dataset.max_seq_len:
            raise ValueError(
                f"evaluation.maxNewTokens: {self.evaluation.max_new_tokens} leaves no room for a prompt within "
                f"dataset.maxSeqLen {self.dataset.max_seq_len}"
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


# ---------------------------------------------------------------------------- status


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


class FineTuneRun(StatusModel):
    """A run whose merged output exists: what a GemmaServe can serve, roll back to, or gate."""

    run: Annotated[StatusRun, Field(description="Run id: a hash of the training inputs.")]
    merged: Annotated[StatusUri, Field(description="The run's merged Hugging Face model directory.")]
    completion_time: Annotated[Timestamp | None, Field(description="When the merge finished (RFC 3339).")] = None
    evaluation: Annotated[
        list[MetricFigure] | None,
        Field(max_length=MAX_ITEMS["metrics"], description="The run's evaluation figures, if it was evaluated."),
    ] = None


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
    chip_hours: Annotated[
        float | None, Field(description="TPU chip-hours (or GPU-hours, on GPUs) used by this run.")
    ] = None
    estimated_cost: Annotated[
        float | None,
        Field(
            description="chipHours at the plan's price per chip- or GPU-hour (settings; Spot rate on Spot where set), in dollars."
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


# ---------------------------------------------------------------------------- the kind


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
