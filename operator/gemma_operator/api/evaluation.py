"""The evaluation, which both kinds read: what the fine-tune scores after training (spec.evaluation),
the figures it writes (status), and the conditions on those figures that a GemmaServe gates a
rollout on (spec.rollout.gate)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from gemma_operator.api.common import MAX_ITEMS, MAX_LENGTH, Model, StatusModel, StatusRun, Text, Uri
from gemma_workloads import config

# Evaluation figures (the training workload's names: gemma_workloads.config.EVAL_METRICS).
EvalMetric = Literal[
    "evalLoss", "perplexity", "exactMatch", "contains", "regexMatch", "preferenceAccuracy", "rewardMargin"
]


# ---------------------------------------------------------------------------- the fine-tune's evaluation


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


# ---------------------------------------------------------------------------- the serve's rollout gate


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
        # A floor on a loss or a ceiling on a match rate would let worse outputs through: most likely swapped.
        lower = self.metric in config.LOWER_IS_BETTER
        if (self.min if lower else self.max) is not None:
            right, wrong, better = ("max", "min", "lower") if lower else ("min", "max", "higher")
            raise ValueError(
                f"{wrong}: {self.metric} is better {better}, so bound it with {right} (or baseline), not {wrong}"
            )
        return self
