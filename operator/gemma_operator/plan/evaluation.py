"""`spec.evaluation` -> the training pod's EvaluationConfig, the checks on it, and its cost.

The evaluation runs in the training pod on the training slice (or GPUs) after the last step, so it
costs the slice's chips for as long as it takes. Its cost is bounded by the spec: at most `maxRows`
rows, each a forward pass over the row (up to `dataset.maxSeqLen` tokens, twice for a preference
pair) and up to
`maxNewTokens` greedy steps (one forward token each); all of it twice with `baseline` (the base
model is scored on the same rows). The time uses the training estimate's model: forward FLOPs
(2 per parameter per token) at the operator's assumed MFU. Greedy decoding of one row at a time
is bound by HBM bandwidth rather than FLOPs, so its share is a floor, not a ceiling.
"""

from __future__ import annotations

from dataclasses import dataclass

from gemma_operator import api
from gemma_operator.model_shapes import ModelShape
from gemma_operator.plan.common import Placement
from gemma_operator.training_method import METHOD_COST
from gemma_workloads.config import EvaluationConfig


@dataclass(frozen=True)
class EvaluationEstimate:
    rows: int
    tokens_per_row: int  # the row's forward pass (both sequences of a pair) plus the greedy steps
    sequences_per_row: int  # 2 for a preference pair
    models: int  # 2 with the baseline
    tokens: int
    hours: float
    chip_hours: float
    cost: float


def train_config(spec: api.GemmaFineTuneSpec) -> EvaluationConfig | None:
    """What the training pod is told to score."""
    ev = spec.evaluation
    if ev is None:
        return None
    return EvaluationConfig(path=ev.uri, max_rows=ev.max_rows, max_new_tokens=ev.max_new_tokens, baseline=ev.baseline)


def run_inputs(spec: api.GemmaFineTuneSpec) -> dict:
    """What the evaluation adds to a run's identity: changing it makes new figures, so a new run.
    Nothing without an evaluation, so the runs of fine-tunes without one keep their ids."""
    return {} if spec.evaluation is None else {"evaluation": spec.evaluation.model_dump(mode="json")}


def estimate(
    spec: api.GemmaFineTuneSpec, shape: ModelShape | None, place: Placement, mfu: float, price: float
) -> EvaluationEstimate | None:
    """The evaluation's extra time and cost on the training slice or GPUs; None without a model size
    or an accelerator."""
    ev = spec.evaluation
    if ev is None or shape is None or place.device is None:
        return None
    models = 2 if ev.baseline else 1
    sequences = METHOD_COST[spec.method].sequences_per_row  # a preference pair: both of its sequences are scored
    per_row = spec.dataset.max_seq_len * sequences + ev.max_new_tokens
    tokens = ev.max_rows * per_row * models
    peak = place.chips * place.device.peak_bf16_tflops * 1e12
    hours = tokens * shape.forward_flops_per_token() / (peak * mfu) / 3600
    device_hours = hours * place.chips
    return EvaluationEstimate(
        ev.max_rows, per_row, sequences, models, tokens, hours, device_hours, device_hours * price
    )


def describe(ev: api.Evaluation | None, est: EvaluationEstimate | None) -> dict | None:
    """The evaluation in `gemma-tpu plan -o json`."""
    if ev is None:
        return None
    return {
        "rows": ev.uri or "the held-out split (dataset.evalFraction)",
        "maxRows": ev.max_rows,
        "maxNewTokens": ev.max_new_tokens,
        "baseline": ev.baseline,
        "estimate": None
        if est is None
        else {
            "tokensPerRow": est.tokens_per_row,
            "sequencesPerRow": est.sequences_per_row,
            "models": est.models,
            "tokens": est.tokens,
            "hours": round(est.hours, 3),
            "chipHours": round(est.chip_hours, 3),
            "cost": round(est.cost, 2),
        },
    }


def text(d: dict, price: float, device: str = "chip") -> str:
    """The evaluation's line of `gemma-tpu plan`; `device` is what a chip-hour is of (chip or GPU)."""
    models = "fine-tune and base model" if d["baseline"] else "fine-tune only"
    what = f"up to {d['maxRows']} rows of {d['rows']}, {models}"
    est = d["estimate"]
    if est is None:
        return f"{what}; cost unknown (needs a model preset on TPU chips or GPUs)"
    sequences, forward = est["sequencesPerRow"], est["tokensPerRow"] - d["maxNewTokens"]
    forwards = f"{forward}-token forward" if sequences == 1 else f"{sequences} x {forward // sequences}-token forward"
    return (
        f"{what}: {d['maxRows']} x ({forwards} + {d['maxNewTokens']} "
        f"greedy steps) x {est['models']} = {est['tokens'] / 1e6:.2f} M tokens, +{est['hours'] * 60:.1f} min, "
        f"{est['chipHours']:.2f} {device}-hours, ${est['cost']:.2f} at ${price:.2f}/{device}-hour"
    )
