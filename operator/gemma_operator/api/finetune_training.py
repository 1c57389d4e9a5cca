"""GemmaFineTune's training settings: the data, the LoRA adapter, the optimisation and the
preference methods' settings. Most of their fields are declared once, by the training contract
(gemma_workloads.config), so whatever the API admits the training pod accepts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from gemma_operator.api.common import MAX_ITEMS, Model, Uri
from gemma_workloads import config

# Hugging Face projection names, as the training workload maps them (its LORA_MODULES).
if TYPE_CHECKING:
    LoraTarget = str  # a type checker cannot read a Literal built at run time
else:
    LoraTarget = Literal[tuple(config.LORA_MODULES)]
LrSchedule = Literal["cosine", "linear", "constant"]


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
        if self.steps is not None and self.warmup_steps >= self.steps:
            raise ValueError(
                f"warmupSteps: {self.warmup_steps} must be below steps {self.steps}: the training pod refuses a run "
                "that would end inside its warmup"
            )
        if self.micro_batch_size is not None and self.batch_size % self.micro_batch_size:
            raise ValueError(f"microBatchSize: {self.micro_batch_size} does not divide batchSize {self.batch_size}")
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
