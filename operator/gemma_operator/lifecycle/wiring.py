"""Each kind's lifecycle as the controller drives it: what its plan depends on, how it is planned,
what its decision needs read, how what was found becomes its view, how it decides, and what it
records in the metrics. The controller (reconcile.py) does the same for every kind: read, plan,
read, view, decide, apply; everything that differs between the kinds is here, as data and pure
functions."""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from gemma_operator import api, prometheus_metrics, reasons
from gemma_operator.children import benchmark, common, serving, training
from gemma_operator.kinds import where
from gemma_operator.lifecycle import finetune, serve, serve_benchmark
from gemma_operator.lifecycle.common import Decision, ResourceView
from gemma_operator.lifecycle.reads import AddOns, Found, Get, Listed, Pods, ProgressLog, Read, Refusal
from gemma_operator.plan import FineTunePlan, ServePlan, SpecError, plan_finetune, plan_serve
from gemma_operator.plan.served_model import ServedModel, fine_tune_plan, served_model
from gemma_operator.prometheus_metrics import PhaseTracker
from gemma_operator.settings import OperatorSettings

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"

P = TypeVar("P", FineTunePlan, ServePlan)
V = TypeVar("V", bound=ResourceView)


@dataclass(frozen=True)
class Lifecycle(Generic[P, V]):
    """One kind, as the controller drives it."""

    kind: api.Kind
    inputs: Callable[[dict], list[Read[Any]]]  # the CR -> what its plan depends on, read first
    plan: Callable[[dict, Found, OperatorSettings], tuple[P | None, list[str]]]  # -> (plan, problems)
    plan_key: Callable[[dict, Found], Hashable]  # everything the plan is made from, as a key to reuse it by
    reads: Callable[[dict, P], list[Read[Any]]]  # (previous status, plan) -> what the decision needs
    view: Callable[[dict, dict, P | None, list[str], Found], V]  # (resource fields, CR, plan, problems, found)
    decide: Callable[[V, OperatorSettings], Decision[Any]]
    record: Callable[[PhaseTracker, dict, V, Decision[Any]], None]  # metrics beyond the phase


# ---------------------------------------------------------------------------- GemmaFineTune

JOBSET_ADDON = AddOns((("JobSet", True),))  # a multi-host run cannot do without JobSet


class FineTuneReads(NamedTuple):
    """The reads of finetune.reads(), by what they are for."""

    want: finetune.Reads
    addons: AddOns | None
    workload: Get
    pods: Pods
    progress: ProgressLog | None
    refusal: Refusal
    stale: Listed | None

    def declared(self) -> list[Read[Any]]:
        reads = (self.addons, self.workload, self.pods, self.progress, self.refusal, self.stale)
        return [r for r in reads if r is not None]


def finetune_reads(status: dict, plan: FineTunePlan) -> FineTuneReads:
    want = finetune.reads(status, plan)
    workload = Get(want.kind, want.name)
    pods = Pods(workload, f"{JOBSET_NAME_LABEL if want.kind == 'JobSet' else JOB_NAME_LABEL}={want.name}")
    earlier = f"{common.FINETUNE_LABEL}={common.label_value(plan.name)},{common.RUN_LABEL}!={plan.run}"
    return FineTuneReads(
        want,
        JOBSET_ADDON if want.training and want.kind == "JobSet" else None,
        workload,
        pods,
        ProgressLog(workload, pods, training.CONTAINER) if want.training else None,
        Refusal(workload, pods),
        Listed(finetune.STALE_KINDS, earlier) if want.earlier_runs else None,
    )


def _plan_finetune(body: dict, _: Found, settings: OperatorSettings) -> tuple[FineTunePlan | None, list[str]]:
    meta = body["metadata"]
    try:
        return plan_finetune(meta["name"], meta["namespace"], body.get("spec") or {}, settings, meta.get("labels")), []
    except SpecError as e:
        return None, e.problems


def _finetune_view(
    fields: dict, _: dict, plan: FineTunePlan | None, problems: list[str], found: Found
) -> finetune.FineTuneView:
    view = finetune.FineTuneView(**fields, plan=plan, problems=problems)
    if plan is None:
        return view
    r = finetune_reads(fields["status"], plan)
    view.missing = found[r.addons] if r.addons else []
    if r.progress:
        view.training, view.training_pods, view.progress = found[r.workload], found[r.pods], found[r.progress]
    else:
        view.merge, view.merge_pods = found[r.workload], found[r.pods]
    view.refusal = found[r.refusal]
    view.stale = found[r.stale] if r.stale else []
    return view


def _finetune_metrics(tracker: PhaseTracker, body: dict, view: finetune.FineTuneView, d: Decision[Any]) -> None:
    """The chips held while training, and the chip-hours this reconcile added to the run's."""
    if view.plan is None:
        return
    st, before = d.status_model, body.get("status") or {}
    held = view.plan.placement.chips if st.phase == reasons.TRAINING else 0
    tracker.chips(view.namespace, view.name, view.plan.placement.accelerator, held)
    added = (st.chip_hours or 0) - float(before.get("chipHours") or 0)
    if added > 0 and st.run == before.get("run"):
        prometheus_metrics.CHIP_HOURS.labels(view.plan.placement.accelerator).inc(added)


def _identity(body: dict) -> tuple[Hashable, ...]:
    """What every plan is made from of the CR itself: which object it is, its spec (by its
    generation) and its labels (a Kueue queue, say)."""
    meta = body["metadata"]
    labels = tuple(sorted((meta.get("labels") or {}).items()))
    return body["kind"], meta["namespace"], meta["name"], meta.get("uid"), meta.get("generation"), labels


FINETUNE: Lifecycle[FineTunePlan, finetune.FineTuneView] = Lifecycle(
    api.FINETUNE,
    inputs=lambda _: [],
    plan=_plan_finetune,
    plan_key=lambda body, _: _identity(body),
    reads=lambda status, plan: finetune_reads(status, plan).declared(),
    view=_finetune_view,
    decide=finetune.decide,
    record=_finetune_metrics,
)


# ---------------------------------------------------------------------------- GemmaServe


class BenchmarkReads(NamedTuple):
    """With spec.benchmark: the current revision's benchmark Job, its pods, and every benchmark Job
    of the GemmaServe (the others among them are stopped while they run)."""

    job: Get
    pods: Pods
    jobs: Listed

    def declared(self) -> list[Read[Any]]:
        return [self.job, self.pods, self.jobs]


class ServeReads(NamedTuple):
    """The reads of serve.reads(), by what they are for."""

    addons: AddOns
    children: tuple[Get, ...]  # every serving kind, by the plan's name
    workload: Get  # the one of them that is the workload
    pods: Pods
    refusal: Refusal
    benchmark: BenchmarkReads | None

    def declared(self) -> list[Read[Any]]:
        bench = self.benchmark.declared() if self.benchmark else []
        return [self.addons, *self.children, self.pods, self.refusal, *bench]


def serve_reads(plan: ServePlan) -> ServeReads | None:
    want = serve.reads(plan)
    if want is None:
        return None
    workload = Get(want.workload_kind, want.name)
    pods = Pods(workload, _selector(serving.selector(plan)))
    children = tuple(Get(kind, want.name) for kind in where(serving=True))
    bench = None
    if want.benchmark_job:
        job = Get("Job", want.benchmark_job)
        bench = BenchmarkReads(
            job,
            Pods(job, f"{JOB_NAME_LABEL}={want.benchmark_job}"),
            Listed(("Job",), _selector(benchmark.labels(plan))),
        )
    return ServeReads(AddOns(tuple(want.addons.items())), children, workload, pods, Refusal(workload, pods), bench)


def _selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def fine_tune_ref(spec: Mapping[str, Any]) -> str | None:
    """The GemmaFineTune a GemmaServe spec serves, if any."""
    return ((spec.get("model") or {}).get("fineTuneRef") or {}).get("name")


def _fine_tune(body: dict) -> Get | None:
    ref = fine_tune_ref(body.get("spec") or {})
    return Get(api.FINETUNE.kind, ref) if ref else None


def _plan_serve(body: dict, found: Found, settings: OperatorSettings) -> tuple[ServePlan | None, list[str]]:
    ref = _fine_tune(body)
    return serve_plan(body, ref.name if ref else None, found[ref] if ref else None, settings)


def serve_plan(
    body: dict, ref: str | None, fine_tune: dict | None, settings: OperatorSettings
) -> tuple[ServePlan | None, list[str]]:
    """(plan, problems) of a GemmaServe as read, serving what its fineTuneRef resolves to now."""
    meta, spec = body["metadata"], body.get("spec") or {}
    source = ServedModel(None, None, None)
    if ref:
        observed = fine_tune or {}
        plan = fine_tune_plan(fine_tune, settings) if fine_tune else None
        status = body.get("status") or {}
        source = served_model(spec, plan, observed, status.get("modelUri"), serve.rejected_runs(spec, status))
    try:
        labels = meta.get("labels")
        return plan_serve(
            meta["name"],
            meta["namespace"],
            spec,
            settings,
            model_uri=source.uri,
            fine_tune_preset=source.preset,
            labels=labels,
        ), []
    except SpecError as e:
        return None, e.problems


def _serve_view(fields: dict, body: dict, plan: ServePlan | None, problems: list[str], found: Found) -> serve.ServeView:
    ref = _fine_tune(body)
    view = serve.ServeView(
        **fields,
        plan=plan,
        problems=problems,
        fine_tune_name=ref.name if ref else None,
        fine_tune=found[ref] if ref else None,
    )
    r = serve_reads(plan) if plan is not None else None
    if r is None:
        return view
    view.missing = found[r.addons]
    view.workload = found[r.workload]
    view.extras = [o for child in r.children if child != r.workload and (o := found[child]) is not None]
    view.pods, view.refusal = found[r.pods], found[r.refusal]
    if b := r.benchmark:
        others = [j for j in found[b.jobs] if j["metadata"]["name"] != b.job.name]
        view.benchmark = serve_benchmark.BenchmarkView(found[b.job], found[b.pods], others)
    return view


def _serve_metrics(_: PhaseTracker, __: dict, view: serve.ServeView, d: Decision[Any]) -> None:
    """The figures of the current revision's benchmark (none without one)."""
    prometheus_metrics.benchmark(view.namespace, view.name, d.status.get("benchmark"))


def _serve_plan_key(body: dict, found: Found) -> Hashable:
    """With a fineTuneRef the plan serves what the fine-tune holds now, and what the status says
    was served and rejected: the fine-tune's version and the whole status are part of the key."""
    ref = _fine_tune(body)
    if ref is None:
        return _identity(body)
    fine_tune = found[ref]
    version = (fine_tune or {}).get("metadata", {}).get("resourceVersion")
    return _identity(body), version, json.dumps(body.get("status"), sort_keys=True)


SERVE: Lifecycle[ServePlan, serve.ServeView] = Lifecycle(
    api.SERVE,
    inputs=lambda body: [ref] if (ref := _fine_tune(body)) else [],
    plan=_plan_serve,
    plan_key=_serve_plan_key,
    reads=lambda _, plan: r.declared() if (r := serve_reads(plan)) else [],
    view=_serve_view,
    decide=serve.decide,
    record=_serve_metrics,
)

LIFECYCLES: dict[str, Lifecycle[Any, Any]] = {lc.kind.kind: lc for lc in (FINETUNE, SERVE)}
