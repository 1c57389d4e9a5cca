"""A run's evaluation figures as the GemmaFineTune status keeps them, and the list of its runs.

The training pod reports the figures (`TrainResult.evaluation`, each with the base model's value
on the same rows); the fine-tune's lifecycle records them in `status.evaluation`, posts them in
an Event, and once the run's merged output exists keeps the run, with its figures, in
`status.runs`: the list a GemmaServe gates, rolls to and rolls back from.
"""

from __future__ import annotations

import json
import math
from typing import Any

from gemma_operator import api, reasons
from gemma_operator.status import written
from gemma_workloads.config import MetricResult, TrainResult

# The headline of `kubectl get gft`, the first of these a run has: a preference run's share of pairs
# ranked right (what dpo and orpo optimise), else the one figure every evaluation has (each row has
# answer tokens; the match rates need rows with an expected answer). Both are continuous (a small gain
# shows), and with the base model's value beside them say at a glance whether the fine-tune helped.
HEADLINES = ("preferenceAccuracy", "evalLoss")
MAX_RUNS = api.MAX_ITEMS["runs"]  # runs kept in status.runs (the CRD bounds the list)


class TrainResultReader:
    """Reads a training pod's TrainResult. Pydantic writes a figure that is not finite as null,
    which the contract's float refuses: read as NaN, the figure is then left out loudly
    (`figures`) instead of losing the whole result (the step and checkpoint with it)."""

    @staticmethod
    def model_validate_json(text: str) -> TrainResult:
        try:
            return TrainResult.model_validate_json(text)
        except ValueError:
            data = json.loads(text)  # not JSON at all: ValueError, as before
            for figure in data.get("evaluation") or []:
                if isinstance(figure, dict) and figure.get("value", 0) is None:
                    figure["value"] = math.nan
            return TrainResult.model_validate(data)


def figures(results: list[MetricResult] | None) -> tuple[list[dict[str, Any]], list[str]]:
    """The status form of a run's figures, and what was dropped: a figure that is not finite
    (a diverged model) cannot be stored as JSON and must not pass a gate, so it is left out
    (a gate on it then blocks) and reported."""
    kept, dropped = [], []
    for r in results or []:
        if not math.isfinite(r.value) or (r.baseline is not None and not math.isfinite(r.baseline)):
            dropped.append(f"{r.name} {r.value} (base {r.baseline})")
            continue
        kept.append(
            {
                "name": r.name,
                "value": r.value,
                "rows": r.rows,
                **({"baseline": r.baseline} if r.baseline is not None else {}),
            }
        )
    return kept, dropped


def _figure(m: dict[str, Any]) -> str:
    base = f" (base {m['baseline']:.4g})" if m.get("baseline") is not None else ""
    return f"{m['name']} {m['value']:.4g}{base}"


def summary(metrics: list[dict[str, Any]]) -> str | None:
    """The headline figure with its baseline, e.g. `evalLoss 1.234 (base 1.802)`."""
    by_name = {m["name"]: m for m in metrics}
    head = next((by_name[h] for h in HEADLINES if h in by_name), metrics[0] if metrics else None)
    return _figure(head) if head else None


def describe(run: str, metrics: list[dict[str, Any]]) -> str:
    """Every figure of a run, for its Event."""
    rows = sorted({m["rows"] for m in metrics})
    on = f" on {rows[0]} rows" if len(rows) == 1 else ""
    return f"run {run}: " + ", ".join(f"{_figure(m)}" + ("" if on else f" [{m['rows']} rows]") for m in metrics) + on


def status_of(run: str, metrics: list[dict[str, Any]]) -> api.RunEvaluation:
    """`status.evaluation`: the run's figures and their headline."""
    return api.RunEvaluation(
        run=run, metrics=[api.MetricFigure.model_validate(m) for m in metrics], summary=summary(metrics)
    )


def record_run(runs: list[dict[str, Any]], run: str, merged: str, at: str, metrics: list[dict] | None) -> list[dict]:
    """`status.runs` with this run first (a run merged again moves to the front), at most MAX_RUNS."""
    entry: dict[str, Any] = {"run": run, "merged": merged, "completionTime": at}
    if metrics is not None:
        entry["evaluation"] = metrics
    previous = next((r for r in runs if r.get("run") == run), None)
    if previous and {**previous, "completionTime": at} == entry:
        return runs  # already recorded: the status does not change at every reconcile
    return [entry, *(r for r in runs if r.get("run") != run)][:MAX_RUNS]


def runs_of(fine_tune_status: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of a fine-tune a GemmaServe may serve, newest first. A status written before
    `runs` existed still names its merged output: that is its one run, without figures."""
    runs = list(fine_tune_status.get("runs") or [])
    merged = (fine_tune_status.get("outputs") or {}).get("merged")
    if not runs and merged and fine_tune_status.get("phase") == reasons.SUCCEEDED:
        runs = [{"run": fine_tune_status.get("run") or "", "merged": merged}]
    return runs


def record_evaluation(
    st: api.GemmaFineTuneStatus, run: str, results: list[MetricResult] | None, expected: bool
) -> list[tuple[str, str, str]]:
    """Put a finished training run's figures in `status.evaluation`; the Events that say so."""
    metrics, dropped = figures(results)
    events = []
    if dropped:
        left_out = ", ".join(dropped)
        events.append(
            ("Warning", reasons.EVALUATION_NOT_FINITE, f"run {run}: figures that are not finite, left out: {left_out}")
        )
    if results is not None:  # evaluated, even if nothing usable came of it: a gate then names what is missing
        st.evaluation = status_of(run, metrics)
    if metrics:
        events.append(("Normal", reasons.EVALUATED, describe(run, metrics)))
    elif expected and results is None:
        message = f"run {run}: spec.evaluation is set but the training result has no figures"
        events.append(("Warning", reasons.NO_EVALUATION, message))
    return events


def record_merged_run(st: api.GemmaFineTuneStatus, run: str, at: str) -> None:
    """Keep a succeeded run whose merged output exists in `status.runs`, with its figures."""
    merged = st.outputs.merged if st.outputs else None
    if st.phase != reasons.SUCCEEDED or not merged:
        return
    ev = st.evaluation
    before = [written(r) for r in st.runs]
    runs = record_run(
        before,
        run,
        merged,
        st.completion_time or at,
        [written(m) for m in ev.metrics] if ev and ev.run == run else None,
    )
    if runs != before:
        st.runs = [api.FineTuneRun.model_validate(r) for r in runs]
