"""Which run of a fine-tune a GemmaServe serves: its rollout gate and its pin, as tables.

The rule, in one sentence: serve the newest run whose evaluation passes `spec.rollout.gate`
(or exactly the run `fineTuneRef.run` pins, if it passes); when no run qualifies, the output
already served keeps serving, and with nothing served there is nothing to deploy yet. Without
a gate every run passes, so a GemmaServe rolls to every new merged output, as it always has.

Bounds are inclusive (`min`: value >= min; `max`: value <= max). `baseline` compares with the
base model's figure on the same rows, in the metric's direction: `better` is strict, `noWorse`
allows equality. A gate on a figure the run did not produce (or without its baseline) blocks:
an output is never promoted on a figure nobody measured. A pinned run is held to the gate too:
whoever wrote the gate need not trust whoever pins; to serve a failing run, change the gate.

Everything here is a pure function of (the runs and their figures, the gate, the pin, what is
served now), so a restarted operator decides the same.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gemma_operator import api, evaluation, reasons
from gemma_workloads.config import LOWER_IS_BETTER

Compare = Callable[[float, float], bool]

# An absolute bound: how it is checked, and how a failure reads.
BOUNDS: dict[str, tuple[Compare, str]] = {
    "min": (operator.ge, "is below the minimum"),
    "max": (operator.le, "is above the maximum"),
}
# A bound relative to the base model: (lower is better, mode) -> check of (value, baseline).
BASELINE: dict[tuple[bool, str], Compare] = {
    (True, "better"): operator.lt,
    (True, "noWorse"): operator.le,
    (False, "better"): operator.gt,
    (False, "noWorse"): operator.ge,
}
BASELINE_WORDS = {"better": "is not better than", "noWorse": "is worse than"}


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str  # Passed | MetricFailed | MetricMissing | NotEvaluated
    message: str


def check(gate: list[api.GateCondition], run: dict[str, Any]) -> Verdict:
    """Does one run pass every condition of the gate? The first failure names the metric and both values."""
    rid = run.get("run", "?")
    if not gate:
        return Verdict(True, reasons.PASSED, f"run {rid}: no gate")
    if run.get("evaluation") is None:
        return Verdict(
            False, reasons.NOT_EVALUATED, f"run {rid} has no evaluation (set spec.evaluation on the GemmaFineTune)"
        )
    figures = {m["name"]: m for m in run["evaluation"]}
    for g in gate:
        m = figures.get(g.metric)
        if m is None:
            had = ", ".join(figures) or "no figures"
            return Verdict(False, reasons.METRIC_MISSING, f"run {rid} did not produce {g.metric} (it reported {had})")
        value = m["value"]
        for bound, (passes, fails) in BOUNDS.items():
            threshold = getattr(g, bound)
            if threshold is not None and not passes(value, threshold):
                return Verdict(
                    False, reasons.METRIC_FAILED, f"run {rid}: {g.metric} {value:.4g} {fails} {threshold:.4g}"
                )
        if g.baseline is not None:
            base = m.get("baseline")
            if base is None:
                return Verdict(
                    False,
                    reasons.METRIC_MISSING,
                    f"run {rid}: {g.metric} has no base model figure "
                    "(set spec.evaluation.baseline on the GemmaFineTune)",
                )
            if not BASELINE[(g.metric in LOWER_IS_BETTER, g.baseline)](value, base):
                return Verdict(
                    False,
                    reasons.METRIC_FAILED,
                    f"run {rid}: {g.metric} {value:.4g} {BASELINE_WORDS[g.baseline]} the base model's {base:.4g}",
                )
    passed = ", ".join(evaluation.summary([figures[g.metric]]) or g.metric for g in gate)
    return Verdict(True, reasons.PASSED, f"run {rid} passes the gate: {passed}")


class Action(enum.Enum):
    ROLL_OUT = "roll out"  # serve the chosen run's output (nothing changes when it is already served)
    KEEP = "keep"  # no run qualifies: the output served now keeps serving
    WAIT = "wait"  # no run qualifies and nothing is served: nothing to deploy yet


# (a run qualifies, an output is served now) -> what happens.
ACTIONS: dict[tuple[bool, bool], Action] = {
    (True, True): Action.ROLL_OUT,
    (True, False): Action.ROLL_OUT,
    (False, True): Action.KEEP,
    (False, False): Action.WAIT,
}


@dataclass(frozen=True)
class Selection:
    action: Action
    model_uri: str | None  # what to serve: the chosen run's output, the one served now, or None
    run: str | None  # the run of that output, when known
    verdict: Verdict | None  # the candidate's (newest or pinned run) verdict; None: no run yet
    pin_missing: str | None = None  # why the pinned run cannot be found
    passed: list[str] = field(default_factory=list)  # runs that pass, newest first


def select(
    gate: list[api.GateCondition],
    runs: list[dict[str, Any]],
    served: str | None,
    pin: str | None,
    rejected: Collection[str] = (),
) -> Selection:
    """What to serve, from the fine-tune's runs (newest first), the gate, the pin and the output served
    now. A run `rejected` by the benchmark's SLO (lifecycle/serve_benchmark.py) is not a candidate,
    unless pinned: a pin is a person's explicit choice."""
    eligible = runs if pin is not None else [r for r in runs if r["run"] not in rejected]
    verdicts = [(r, check(gate, r)) for r in eligible]
    passed = [r["run"] for r, v in verdicts if v.passed]
    pin_missing = None
    if pin is not None:
        pinned = [(r, v) for r, v in verdicts if r["run"] == pin]
        if not pinned:
            known = ", ".join(r["run"] for r in runs) or "none yet"
            pin_missing = f"run {pin} is not one of the fine-tune's runs with a merged output ({known})"
        candidates = pinned
    else:
        candidates = verdicts
    verdict = candidates[0][1] if candidates else None
    chosen = next((r for r, v in candidates if v.passed), None)
    action = ACTIONS[(chosen is not None, served is not None)]
    uri = chosen["merged"] if chosen else served
    run = next((r["run"] for r in runs if r["merged"] == uri), None) if uri else None
    return Selection(action, uri if action is not Action.WAIT else None, run, verdict, pin_missing, passed)


def select_for(
    spec: dict[str, Any], fine_tune: dict[str, Any] | None, served: str | None, rejected: Collection[str] = ()
) -> Selection:
    """`select` for a GemmaServe spec as stored (a gate that does not parse counts as none: the
    spec is then refused as invalid anyway) and the referenced GemmaFineTune as read."""
    model = spec.get("model") or {}
    try:
        gate = api.Rollout.model_validate(spec.get("rollout") or {}).gate
    except ValidationError:
        gate = []
    pin = (model.get("fineTuneRef") or {}).get("run")
    return select(gate, evaluation.runs_of((fine_tune or {}).get("status") or {}), served, pin, rejected)


def describe(gate: list[api.GateCondition]) -> str:
    """A gate in words, for `gemma-tpu plan`."""
    words = {"better": "better than the base model", "noWorse": "no worse than the base model"}
    parts = []
    for g in gate:
        bounds = [
            f">= {g.min:g}" if g.min is not None else "",
            f"<= {g.max:g}" if g.max is not None else "",
            words.get(g.baseline or "", ""),
        ]
        parts.append(f"{g.metric} " + " and ".join(b for b in bounds if b))
    return ", ".join(parts) or "none (every new output rolls out)"
