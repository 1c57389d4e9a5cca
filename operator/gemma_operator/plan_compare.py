"""`gemma-tpu plan --compare`: one fine-tune and its serving priced side by side on each accelerator
they are planned for, as the seed paper's tables compare a TPU v5p-8 and v6e-8 with 2x H100.

A column is a fine-tune and the GemmaServe that serves it (its fineTuneRef), or either alone. Its
rows are what the plans already derive: the training run's hours at the assumed MFU, its chip- or
GPU-hours and dollars, the dollars per million trained tokens; the service's dollars per replica-hour
and, at an output throughput the caller states (the planner cannot know it: it is what a benchmark
measures), its dollars per million output tokens; and training plus 1 or 24 hours of serving, the
paper's end-to-end figures. With two columns a third gives the second's figures over the first's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gemma_operator.plan import FineTunePlan, ServePlan

SERVING_HOURS = (1, 24)  # the paper's end-to-end totals: training plus 1 h and plus 24 h of serving


@dataclass(frozen=True)
class Column:
    fine_tune: FineTunePlan | None
    serve: ServePlan | None
    throughput: float | None  # output tokens per second of one replica, as stated; None: not stated

    @property
    def name(self) -> str:
        return (self.fine_tune or self.serve).name  # type: ignore[union-attr]  # a column has one or both


def columns(plans: list[FineTunePlan | ServePlan], throughput: dict[str | None, float]) -> list[Column]:
    """Each fine-tune with each GemmaServe that serves it (or alone), in the order of the input, then
    the services of no fine-tune in the input. The throughput is looked up by GemmaServe name, else
    the one given for every service (key None)."""
    serves = [p for p in plans if isinstance(p, ServePlan)]

    def rate(sp: ServePlan) -> float | None:
        return throughput.get(sp.name, throughput.get(None))

    def serves_it(sp: ServePlan, ft: FineTunePlan) -> bool:
        ref = sp.spec.model.fine_tune_ref
        return ref is not None and (sp.namespace, ref.name) == (ft.namespace, ft.name)

    out: list[Column] = []
    for ft in (p for p in plans if isinstance(p, FineTunePlan)):
        mine = [sp for sp in serves if serves_it(sp, ft)]
        out += [Column(ft, sp, rate(sp)) for sp in mine] or [Column(ft, None, None)]
    paired = {id(c.serve) for c in out}
    return out + [Column(None, sp, rate(sp)) for sp in serves if id(sp) not in paired]


def _training(ft: FineTunePlan | None) -> dict[str, Any] | None:
    if ft is None or ft.estimate is None or ft.price is None:
        return None
    est = ft.estimate
    return {
        "on": ft.placement.label,
        "devices": ft.placement.chips,
        "device": ft.placement.device_word,
        "hours": round(est.hours, 2),
        "deviceHours": round(est.chip_hours, 2),
        "pricePerDeviceHour": ft.price.per_chip_hour,
        "cost": round(est.cost, 2),
        "perMillionTokens": round(est.cost / est.tokens * 1e6, 2),
    }


def _serving(sp: ServePlan | None, throughput: float | None) -> dict[str, Any] | None:
    if sp is None or sp.cost is None:
        return None
    hourly = sp.cost.per_replica_hour
    return {
        "on": sp.placement.label,
        "devices": sp.placement.chips,
        "device": sp.placement.device_word,
        "perReplicaHour": round(hourly, 2),
        "outputTokensPerSecond": throughput,
        "perMillionOutputTokens": None if not throughput else round(hourly / (throughput * 3600) * 1e6, 2),
    }


def as_dict(column: Column) -> dict[str, Any]:
    training, serving = _training(column.fine_tune), _serving(column.serve, column.throughput)
    totals = None
    if training is not None and serving is not None:
        totals = {f"{h}h": round(training["cost"] + h * serving["perReplicaHour"], 2) for h in SERVING_HOURS}
    return {
        "fineTune": column.fine_tune.name if column.fine_tune else None,
        "serve": column.serve.name if column.serve else None,
        "training": training,
        "serving": serving,
        "trainingPlusServing": totals,
    }


# (row label, how to read it from a column's dict, how to write it); None: the row does not apply.
_ROWS: list[tuple[str, Any, str]] = [
    ("training on", lambda d: d["training"] and f"{d['training']['on']}", "{}"),
    ("hours", lambda d: d["training"] and d["training"]["hours"], "{:.2f} h"),
    ("device-hours", lambda d: d["training"] and (d["training"]["deviceHours"], d["training"]["device"]), "dh"),
    ("price", lambda d: d["training"] and (d["training"]["pricePerDeviceHour"], d["training"]["device"]), "rate"),
    ("training run", lambda d: d["training"] and d["training"]["cost"], "${:,.2f}"),
    ("$ / 1M trained tokens", lambda d: d["training"] and d["training"]["perMillionTokens"], "${:,.2f}"),
    ("service", lambda d: d["serving"] and d["serve"], "{}"),
    ("serving on", lambda d: d["serving"] and d["serving"]["on"], "{}"),
    ("$ / replica-hour", lambda d: d["serving"] and d["serving"]["perReplicaHour"], "${:,.2f}"),
    ("output tokens/s", lambda d: d["serving"] and d["serving"]["outputTokensPerSecond"], "{:,.0f} (stated)"),
    ("$ / 1M output tokens", lambda d: d["serving"] and d["serving"]["perMillionOutputTokens"], "${:,.2f}"),
    *[
        (
            f"training + {h} h serving",
            lambda d, h=h: d["trainingPlusServing"] and d["trainingPlusServing"][f"{h}h"],
            "${:,.2f}",
        )
        for h in SERVING_HOURS
    ],
]


def _cell(value: Any, form: str) -> str:
    if value is None:
        return "-"
    if form == "dh":
        return f"{value[0]:,.2f} {value[1]}-hours"
    if form == "rate":
        return f"${value[0]:,.2f}/{value[1]}-hour"
    return form.format(value)


def _ratio(a: Any, b: Any) -> str:
    """The second column's figure over the first's, where both are numbers."""
    a, b = (v[0] if isinstance(v, tuple) else v for v in (a, b))
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not a:
        return ""
    return f"{b / a:.2f}x"


def as_text(cols: list[Column]) -> str:
    """The comparison as a table: a row per figure, a column per fine-tune and its serving."""
    dicts = [as_dict(c) for c in cols]
    header = ["", *(c.name for c in cols), *(["second / first"] if len(cols) == 2 else [])]
    rows = [header]
    for label, read, form in _ROWS:
        values = [read(d) or None for d in dicts]
        rows.append([label, *(_cell(v, form) for v in values), *([_ratio(*values)] if len(cols) == 2 else [])])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    notes = [
        "hours at the assumed MFU (settings assumed_mfu, assumed_gpu_mfu); prices from the settings "
        "(see `gemma-tpu plan` for their sources); output tokens/s of one replica, as given by --throughput"
    ]
    return "\n".join([*lines, "", *notes])
