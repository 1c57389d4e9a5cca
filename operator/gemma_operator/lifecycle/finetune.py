"""The GemmaFineTune lifecycle, as a pure function: what was observed -> what to do.

Pending -> Training -> Merging -> Succeeded | Failed (and Suspended while spec.suspend). Every
decision reads the CR's status and the children as they are now, so a restarted operator picks
up where things stand. Terminal state, the run id and the retry budget live on the CR:
a finished run never gets its children recreated, and a training workload that disappears
mid-run is replaced as a new attempt only while the budget (spec.backoffLimit) allows.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from typing import Any

from gemma_operator import api, evaluation, failure_policy, reasons
from gemma_operator.api import GemmaFineTuneStatus as Status
from gemma_operator.children import merge, merge_objects, training, training_objects
from gemma_operator.clock import parse_time, timestamp
from gemma_operator.conditions import find
from gemma_operator.lifecycle.common import Decision, ResourceView, decide_with, set_cond
from gemma_operator.plan import FineTunePlan
from gemma_operator.settings import OperatorSettings
from gemma_workloads.config import MergeResult, Progress, TrainResult

ACCOUNT_EVERY = 60  # seconds between chip-hour updates of a running workload
RUN_FIELDS = (  # of the status: what belongs to one run, cleared when a new run starts
    "progress",
    "outputs",
    "start_time",
    "completion_time",
    "chip_hours",
    "estimated_cost",
    "restarts",
    "preemptions",
    "children",
    "accounted_at",
    "evaluation",
)
RUN_CONDITIONS = (reasons.TRAINING_COMPLETE, reasons.MERGED, reasons.COMPLETE, reasons.FAILED, reasons.SUSPENDED)
ACTIVE_STATES = (reasons.PENDING, reasons.RUNNING, reasons.SUSPENDED)  # a workload that has not finished


@dataclass
class FineTuneView(ResourceView):
    """Everything observed for one GemmaFineTune."""

    plan: FineTunePlan | None = None
    training: dict | None = None  # the current attempt's Job or JobSet
    training_pods: list[dict] = field(default_factory=list)
    merge: dict | None = None
    merge_pods: list[dict] = field(default_factory=list)
    progress: Progress | None = None
    stale: list[dict] = field(default_factory=list)  # workloads of earlier runs

    @property
    def valid_plan(self) -> FineTunePlan:
        """The plan: decide() runs the lifecycle's steps only for a valid spec, which always has one."""
        assert self.plan is not None
        return self.plan


@dataclass(frozen=True)
class Reads:
    """What a reconcile reads for decide(): until the run is trained, the training workload of the
    current attempt (with its pods and progress), then the merge Job; and the workloads of an
    earlier run, while one may still exist."""

    kind: str  # of the workload: Job or JobSet
    name: str
    training: bool  # the training workload, not the merge Job
    earlier_runs: bool


STALE_KINDS = ("Job", "JobSet")  # what workloads of an earlier run may be


def reads(status: dict[str, Any], plan: FineTunePlan) -> Reads:
    same_run = status.get("run") == plan.run
    earlier = bool(status.get("run")) and not same_run
    if same_run and status.get("phase") in (reasons.MERGING, reasons.SUCCEEDED):
        return Reads("Job", merge.name(plan), False, earlier)
    attempt = int(status.get("attempt") or 1) if same_run else 1
    return Reads("JobSet" if plan.multi_host else "Job", training.names(plan, attempt)[0], True, earlier)


def decide(v: FineTuneView, settings: OperatorSettings) -> Decision[Status]:
    return decide_with(
        v,
        Status,
        lambda d: _advance(v, d, settings),
        lambda st, message: _fail(v, st, reasons.INVALID_SPEC, f"invalid spec: {message}"),
    )


def _advance(v: FineTuneView, d: Decision[Status], settings: OperatorSettings) -> None:
    st, p = d.status_model, v.valid_plan
    st.model, st.topology = p.model_label, p.placement.label
    if st.run != p.run:
        if st.run:
            d.events.append(("Normal", reasons.NEW_RUN, f"the training inputs changed: run {p.run} replaces {st.run}"))
        for key in RUN_FIELDS:
            setattr(st, key, None)
        st.conditions = [c for c in st.conditions if c.type not in RUN_CONDITIONS]
        st.run, st.attempt, st.phase = p.run, 1, reasons.PENDING
        d.delete += [w for w in v.stale if failure_policy.outcome(w).state in ACTIVE_STATES]
    failed = find(st.conditions, reasons.FAILED)
    if st.phase == reasons.FAILED and failed and failed.reason == reasons.INVALID_SPEC:
        st.phase = reasons.PENDING  # the spec was fixed: carry on where the run stood
        st.conditions = [c for c in st.conditions if c.type != reasons.FAILED]
    phase = st.phase or reasons.PENDING
    if phase in (reasons.PENDING, reasons.TRAINING, reasons.SUSPENDED):
        _training(v, d, settings)
    elif phase == reasons.MERGING:
        _merging(v, d, settings)
    elif phase == reasons.SUCCEEDED and p.spec.merge.enabled and not _merge_outputs_current(st, p):
        _start_merge(v, d, settings, _trained_step(st))  # merge settings changed
    evaluation.record_merged_run(st, p.run, timestamp(v.now))


def _training(v: FineTuneView, d: Decision[Status], settings: OperatorSettings) -> None:
    """The training workload: created (again, when it disappeared), kept as the spec wants it, and
    followed to its outcome."""
    if v.training is None:
        _create_training(v, d, settings)
        return
    outcome = _keep_training(v, d, settings, v.training)
    _follow_training(v, d, settings, v.training, outcome)


def _create_training(v: FineTuneView, d: Decision[Status], settings: OperatorSettings) -> None:
    """The workload of the current attempt, or of the next one when it was created before and is
    gone (while the retry budget lasts)."""
    st, p = d.status_model, v.valid_plan
    attempt = st.attempt or 1
    name, _ = training.names(p, attempt)
    created_before = st.children is not None and st.children.training == name
    if created_before and not p.spec.suspend:
        restarts = (st.restarts or 0) + 1
        if restarts > p.spec.backoff_limit:
            _fail(
                v,
                st,
                reasons.BACKOFF_LIMIT_EXCEEDED,
                f"training workload {name} disappeared and the retry budget (backoffLimit {p.spec.backoff_limit}) is spent",
            )
            return
        attempt += 1
        st.attempt, st.restarts = attempt, restarts
        d.events.append(
            (
                "Warning",
                reasons.TRAINING_RECREATED,
                f"{name} disappeared; attempt {attempt} resumes from the latest checkpoint",
            )
        )
        name, _ = training.names(p, attempt)
    budget = max(0, p.spec.backoff_limit - (st.restarts or 0))  # what earlier attempts left
    d.create += training_objects(p, settings, v.owner, attempt, budget)
    _record_training(st, name)
    st.phase = reasons.SUSPENDED if p.spec.suspend else reasons.PENDING
    st.message = "suspended" if p.spec.suspend else f"created {name}"
    set_cond(v, st, reasons.SUSPENDED, p.spec.suspend, reasons.SUSPENDED if p.spec.suspend else reasons.RUNNING, "")


def _keep_training(
    v: FineTuneView, d: Decision[Status], settings: OperatorSettings, wl: dict
) -> failure_policy.Outcome:
    """The workload as the spec wants it (re-applied, suspended or resumed) and what it counts:
    restarts, preemptions, chip-hours. Returns its outcome."""
    st, p = d.status_model, v.valid_plan
    attempt = st.attempt or 1
    name, _ = training.names(p, attempt)
    _record_training(st, name)  # recorded whatever wrote it
    outcome = failure_policy.outcome(wl)
    if outcome.state in ACTIVE_STATES:  # re-applied: labels and config changed by others come back
        budget = max(0, p.spec.backoff_limit - (st.restarts or 0))
        d.create += training_objects(p, settings, v.owner, attempt, budget)
    wish = str(p.spec.suspend).lower()
    asked = (wl["metadata"].get("annotations") or {}).get(training.SUSPEND_ANNOTATION)
    if outcome.state in ACTIVE_STATES and asked != wish:
        d.patch.append(
            (
                wl["kind"],
                wl["metadata"]["name"],
                {"spec": {"suspend": p.spec.suspend}, "metadata": {"annotations": {training.SUSPEND_ANNOTATION: wish}}},
            )
        )
    budget_left = training.restart_budget(wl)
    st.restarts = max(st.restarts or 0, p.spec.backoff_limit - budget_left + outcome.restarts)
    st.preemptions = max(
        st.preemptions or 0,
        outcome.preemptions,
        sum(failure_policy.is_preemption(pod) for pod in v.training_pods),
    )
    _account(v, st, outcome)
    set_cond(v, st, reasons.SUSPENDED, p.spec.suspend, reasons.SUSPENDED if p.spec.suspend else reasons.RUNNING, "")
    return outcome


def _follow_training(
    v: FineTuneView, d: Decision[Status], settings: OperatorSettings, wl: dict, outcome: failure_policy.Outcome
) -> None:
    """The phase and message that follow from the workload's outcome."""
    st, p = d.status_model, v.valid_plan
    name, _ = training.names(p, st.attempt or 1)
    if outcome.state == reasons.SUCCEEDED:
        _trained(v, d, settings)
    elif outcome.state == reasons.FAILED:
        _fail(v, st, outcome.reason or reasons.TRAINING_FAILED, _failure_message(v.training_pods, outcome))
    elif p.spec.suspend:
        st.phase = reasons.SUSPENDED
        st.message = "suspended: checkpoints are kept and training resumes from the latest"
    elif outcome.state == reasons.SUSPENDED:  # suspended by its queue (Kueue) until admitted
        st.phase, st.message = reasons.PENDING, f"queued: {wl['kind']} {name} waits for admission"
    elif outcome.state == reasons.RUNNING:
        _running(v, st)
    else:
        st.phase = reasons.PENDING
        st.message = _scheduling_message(v.training_pods) or f"waiting for {wl['kind']} {name} to start"


def _trained(v: FineTuneView, d: Decision[Status], settings: OperatorSettings) -> None:
    """The training's outputs, progress and evaluation recorded; then the merge, or success."""
    st, p = d.status_model, v.valid_plan
    result = _train_result(v.training_pods)
    step = result.step if result else None
    st.outputs = api.FineTuneOutputs(checkpoint=result.checkpoint if result else None, step=step)
    if result:
        st.progress = _progress(result.step, result.total_steps, result.loss, result.tokens_per_second)
    d.events += evaluation.record_evaluation(
        st, p.run, result.evaluation if result else None, p.spec.evaluation is not None
    )
    set_cond(
        v, st, reasons.TRAINING_COMPLETE, True, reasons.TRAINED, f"trained {step if step is not None else '?'} steps"
    )
    if p.spec.merge.enabled:
        _start_merge(v, d, settings, step)
    else:
        _succeed(v, st, "training finished (merge disabled)")


def _running(v: FineTuneView, st: Status) -> None:
    """Training: the start time, and the latest progress the workload reported."""
    st.start_time = st.start_time or timestamp(v.now)
    st.phase = reasons.TRAINING
    if v.progress:
        st.progress = _progress(v.progress.step, v.progress.total_steps, v.progress.loss, v.progress.tokens_per_second)
    prog = st.progress
    st.message = (
        f"step {prog.step}/{prog.total_steps if prog.total_steps is not None else '?'}"
        + (f", loss {prog.loss:.4f}" if prog.loss is not None else "")
        if prog
        else "training started"
    )


def _merging(v: FineTuneView, d: Decision[Status], settings: OperatorSettings) -> None:
    st, p = d.status_model, v.valid_plan
    if v.merge is None:
        _start_merge(v, d, settings, _trained_step(st))  # lost: the merge resumes
        return
    outcome = failure_policy.outcome(v.merge)
    if outcome.state in ACTIVE_STATES:  # re-applied: labels and config changed by others come back
        d.create += merge_objects(p, settings, v.owner, _trained_step(st))
    if outcome.state == reasons.SUCCEEDED:
        result = _merge_result(v.merge_pods)
        written, outputs = _record_merge_outputs(st, p, result)
        detail = (
            f": {result.tensors_merged} tensors merged in {result.seconds:.0f} s"
            if result and result.seconds is not None and outputs.merged is not None
            else ""
        )
        if result and result.adapter_error:
            d.events.append(("Warning", reasons.ADAPTER_NOT_WRITTEN, result.adapter_error))
            detail += f"; no PEFT adapter: {result.adapter_error}"
        set_cond(v, st, reasons.MERGED, True, reasons.MERGED, f"wrote {written}{detail}")
        _succeed(v, st, written)
    elif outcome.state == reasons.FAILED:
        _fail(v, st, reasons.MERGE_FAILED, _failure_message(v.merge_pods, outcome))
    else:
        st.phase, st.message = reasons.MERGING, f"merging the adapter into {p.merged_dir}"


def _merge_outputs_current(st: Status, p: FineTunePlan) -> bool:
    """Whether status names the output this spec's merge must leave (an adapter the merge could not
    write does not count: it is reported, not retried)."""
    outputs = st.outputs or api.FineTuneOutputs()
    if p.spec.merge.output == "adapter":
        return outputs.adapter == p.adapter_dir
    return outputs.merged == p.merged_dir


def _record_merge_outputs(st: Status, p: FineTunePlan, result: MergeResult | None) -> tuple[str, api.FineTuneOutputs]:
    """status.outputs of a finished merge (URIs, not the paths inside the merge pod); returns what it says."""
    outputs = st.outputs = st.outputs or api.FineTuneOutputs()
    outputs.merged = p.merged_dir if p.spec.merge.output != "adapter" else None
    # An adapter-only merge fails rather than succeed without one.
    wrote_adapter = p.spec.merge.output == "adapter" or (p.spec.merge.output == "both" and result and result.adapter)
    outputs.adapter = p.adapter_dir if wrote_adapter else None
    said = [f"merged model at {outputs.merged}"] if outputs.merged is not None else []
    said += [f"PEFT adapter at {outputs.adapter}"] if outputs.adapter is not None else []
    return " and ".join(said), outputs


def _start_merge(v: FineTuneView, d: Decision[Status], settings: OperatorSettings, step: int | None) -> None:
    st, p = d.status_model, v.valid_plan
    d.create += merge_objects(p, settings, v.owner, step)
    st.children = st.children or api.FineTuneChildren()
    st.children.merge = merge.name(p)
    st.phase, st.message = reasons.MERGING, f"merging the adapter into {p.merged_dir}"


def _record_training(st: Status, name: str) -> None:
    """The current attempt's training workload and its ConfigMap (both named for the attempt)."""
    st.children = st.children or api.FineTuneChildren()
    st.children.config_map, st.children.training = name, name


def _trained_step(st: Status) -> int | None:
    """The step of the run's final checkpoint, once training has written it."""
    return st.outputs.step if st.outputs else None


def _account(v: FineTuneView, st: Status, outcome: failure_policy.Outcome) -> None:
    """Chip-hours: the slice's chips for as long as the workload is seen running.

    Whole seconds are accounted up to `accountedAt` (itself whole seconds), so repeated reconciles
    neither lose nor double-count the fractions; while running, the total is brought up to date at
    most every ACCOUNT_EVERY seconds so that accounting alone does not keep rewriting the status.
    A workload that stops running (finished, suspended, requeued) is accounted up to that moment.
    """
    chips = v.valid_plan.placement.chips
    last = parse_time(st.accounted_at)
    now = v.now.replace(microsecond=0)
    if outcome.state == reasons.RUNNING:
        if last is None or (now - last).total_seconds() >= ACCOUNT_EVERY:
            _add_chip_hours(st, chips, last, now)
            st.accounted_at = timestamp(now)
    else:
        finished = _finished_at(v.training) if outcome.state in (reasons.SUCCEEDED, reasons.FAILED) else None
        _add_chip_hours(st, chips, last, finished or now)
        st.accounted_at = None
    if chips:
        st.chip_hours = st.chip_hours if st.chip_hours is not None else 0.0
        st.estimated_cost = round(st.chip_hours * v.valid_plan.price_per_chip_hour, 2)


def _add_chip_hours(st: Status, chips: int, since: datetime.datetime | None, until: datetime.datetime) -> None:
    if since and until > since:
        st.chip_hours = round((st.chip_hours or 0) + chips * (until - since).total_seconds() / 3600, 6)


def _finished_at(workload: dict | None) -> datetime.datetime | None:
    """When a Job or JobSet ended: its completionTime, else when its terminal condition was set."""
    wst = (workload or {}).get("status") or {}
    ended = [
        c
        for c in wst.get("conditions") or []
        if c.get("type") in (reasons.JOB_COMPLETE, reasons.JOBSET_COMPLETED, reasons.JOB_FAILED)
        and c.get("status") == "True"
    ]
    return parse_time(wst.get("completionTime") or (ended[0].get("lastTransitionTime") if ended else None))


def _succeed(v: FineTuneView, st: Status, message: str) -> None:
    st.phase, st.message, st.completion_time = reasons.SUCCEEDED, message, timestamp(v.now)
    set_cond(v, st, reasons.COMPLETE, True, reasons.SUCCEEDED, message)


def _fail(v: FineTuneView, st: Status, reason: str, message: str) -> None:
    st.phase, st.message = reasons.FAILED, message
    if reason != reasons.INVALID_SPEC:
        st.completion_time = timestamp(v.now)
    set_cond(v, st, reasons.FAILED, True, reason, message)


def _progress(step: int | None, total: int | None, loss: float | None, tps: float | None) -> api.Progress:
    """status.progress, its figures rounded so that noise does not rewrite the status."""
    figures = {"step": step, "total_steps": total, "loss": loss, "tokens_per_second": tps}
    return api.Progress(**{k: round(x, 6) if isinstance(x, float) else x for k, x in figures.items() if x is not None})


# ---------------------------------------------------------------------------- reading pods


def _terminated(pod: dict) -> dict:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if t := (cs.get("state") or {}).get("terminated"):
            return t
    return {}


def _results(pods: list[dict], model):
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True):
        message = _terminated(pod).get("message")
        if pod.get("status", {}).get("phase") == reasons.POD_SUCCEEDED and message:
            try:
                return model.model_validate_json(message)
            except ValueError:
                continue
    return None


def _train_result(pods: list[dict]) -> TrainResult | None:
    return _results(pods, evaluation.TrainResultReader)


def _merge_result(pods: list[dict]) -> MergeResult | None:
    return _results(pods, MergeResult)


def _failure_message(pods: list[dict], outcome: failure_policy.Outcome) -> str:
    """The pod's own account of the failure (result JSON or log tail), else the Job's."""
    failed = [p for p in pods if p.get("status", {}).get("phase") == reasons.POD_FAILED]
    for pod in sorted(failed, key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True):
        t = _terminated(pod)
        message = (t.get("message") or "").strip()
        try:
            error = json.loads(message).get("error")
        except (ValueError, AttributeError):
            error = message[-1000:] if message else None
        if error:
            return f"exit code {t.get('exitCode')}: {error}"
    return outcome.message or outcome.reason or "the workload failed"


def _scheduling_message(pods: list[dict]) -> str | None:
    for pod in pods:
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == reasons.POD_SCHEDULED and c.get("status") == "False" and c.get("message"):
                return f"waiting for TPU nodes: {c['message']}"
    return None
