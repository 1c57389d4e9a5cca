"""The GemmaServe lifecycle, as a pure function: what was observed -> what to do.

Pending -> WaitingForModel (a referenced fine-tune has no merged output yet) -> Deploying ->
Ready; Failed for an invalid spec or when no replica of a rollout ever became ready. Once a
model has been served, a re-running fine-tune does not take it away: the Deployment keeps the
previous output until the new merge lands, then rolls (maxSurge 0: no spare TPUs needed).
Which of the fine-tune's outputs is served is `rollout_gate`'s decision (the newest run that passes
spec.rollout.gate, or the pinned one); this module writes it into the status.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gemma_operator import api, evaluation, reasons, rollout_gate
from gemma_operator.api import GemmaServeStatus as Status
from gemma_operator.children import benchmark, serving, serving_objects
from gemma_operator.clock import parse_time, timestamp
from gemma_operator.conditions import condition, find
from gemma_operator.lifecycle import serve_benchmark
from gemma_operator.lifecycle.common import Decision, ResourceView, decide_with, set_cond
from gemma_operator.lifecycle.finetune import ACCOUNT_EVERY
from gemma_operator.plan import ServePlan
from gemma_operator.plan.served_model import served_model
from gemma_operator.settings import OperatorSettings
from gemma_operator.status import read as read_status


@dataclass
class ServeView(ResourceView):
    """Everything observed for one GemmaServe."""

    plan: ServePlan | None = None
    fine_tune_name: str | None = None
    fine_tune: dict | None = None  # the referenced GemmaFineTune, when found
    workload: dict | None = None  # the Deployment or LeaderWorkerSet the plan wants
    extras: list[dict] = field(default_factory=list)  # other serving children that exist now
    pods: list[dict] = field(default_factory=list)
    benchmark: serve_benchmark.BenchmarkView = field(default_factory=serve_benchmark.BenchmarkView)

    @property
    def valid_plan(self) -> ServePlan:
        """The plan: decide() runs the lifecycle's steps only for a valid spec, which always has one."""
        assert self.plan is not None
        return self.plan


@dataclass(frozen=True)
class Reads:
    """What a reconcile reads for decide() once a model is resolved: the add-ons the plan needs
    (True: it cannot do without), and its serving children, all named `name`, of which the one of
    `workload_kind` is the workload (its pods read too) and the others its extras."""

    addons: dict[str, bool]
    name: str
    workload_kind: str
    benchmark_job: str | None = None  # the Job that measures the current revision, with spec.benchmark


def reads(plan: ServePlan) -> Reads | None:
    if not plan.model_uri:  # waiting for the model: nothing to read
        return None
    m = plan.spec.metrics
    needed = (
        ("LeaderWorkerSet", True, plan.multi_host),
        ("PodMonitor", False, m.pod_monitor),
        ("PodMonitoring", False, m.pod_monitoring),
    )
    workload_kind = "LeaderWorkerSet" if plan.multi_host else "Deployment"
    return Reads(
        {kind: blocking for kind, blocking, wanted in needed if wanted},
        serving.name(plan),
        workload_kind,
        benchmark.name(plan) if plan.spec.benchmark else None,
    )


def rejected_runs(spec: dict[str, Any], raw_status: dict[str, Any] | None) -> frozenset[str]:
    """The runs the benchmark's SLO rejected, for a spec and status as stored (a spec that does not
    parse rejects none)."""
    try:
        bench = api.GemmaServeSpec.model_validate(spec).benchmark
    except ValidationError:
        return frozenset()
    return serve_benchmark.rejected_runs(bench, read_status(Status, raw_status).rejected_runs)


def resolve_model(
    ref_name: str | None, fine_tune: dict | None, status: dict[str, Any], spec: dict[str, Any] | None = None
) -> str | None:
    """The newest of the fine-tune's merged outputs that passes the spec's rollout gate (or the
    pinned run's) and was not rejected by its SLO; while none does, or while the fine-tune
    re-runs, the output already served."""
    if ref_name is None:
        return None
    spec = spec or {}
    return served_model(spec, None, fine_tune or {}, status.get("modelUri"), rejected_runs(spec, status)).uri


def decide(v: ServeView, settings: OperatorSettings) -> Decision[Status]:
    def invalid(st: Status, message: str) -> None:
        st.phase, st.message = reasons.FAILED, f"invalid spec: {message}"

    return decide_with(v, Status, lambda d: _advance(v, d, settings), invalid)


def _advance(v: ServeView, d: Decision[Status], settings: OperatorSettings) -> None:
    """The model to serve (or why none is yet), the serving children, and the rollout's progress."""
    st, p = d.status_model, v.valid_plan
    sel = _gate(v, d) if v.fine_tune_name else None
    if p.model_uri is None:
        reason, message = _blocked(sel) or _waiting(v)
        set_cond(v, st, reasons.MODEL_READY, False, reason, message)
        st.phase, st.message = reasons.WAITING_FOR_MODEL, message
        return
    _model_ready(v, st, p.model_uri, sel)
    absent = {m.kind for m in v.missing}  # an optional monitor whose CRD is not installed
    d.create += [o for o in serving_objects(p, settings, v.owner) if o["kind"] not in absent]
    wanted = {(o["kind"], o["metadata"]["name"]) for o in d.create}
    d.delete += [o for o in v.extras if (o["kind"], o["metadata"]["name"]) not in wanted]  # e.g. autoscaling removed
    st.model_uri, st.served_model_name, st.endpoint = p.model_uri, p.served_name, serving.endpoint(p)
    replicas_before = st.replicas or 0  # what the slices held since the last account
    _rollout(v, st)
    _account(v, st, replicas_before)
    serve_benchmark.step(v, p, v.benchmark, d, settings)


def _model_ready(v: ServeView, st: Status, model_uri: str, sel: rollout_gate.Selection | None) -> None:
    """ModelReady: which output is served, and why it is not the fine-tune's latest when it is not."""
    ft_status = (v.fine_tune or {}).get("status") or {}
    latest = ft_status.get("outputs", {}).get("merged")
    if sel and sel.pin_missing:
        set_cond(
            v, st, reasons.MODEL_READY, False, reasons.RUN_NOT_FOUND, f"{sel.pin_missing}; {model_uri} keeps serving"
        )
    elif sel and sel.verdict and not sel.verdict.passed:
        set_cond(
            v, st, reasons.MODEL_READY, True, reasons.PREVIOUS_OUTPUT, f"serving {model_uri}: {sel.verdict.message}"
        )
    elif v.fine_tune_name and latest != model_uri:
        set_cond(
            v,
            st,
            reasons.MODEL_READY,
            True,
            reasons.PREVIOUS_OUTPUT,
            f"serving {model_uri} while GemmaFineTune {v.fine_tune_name} is {ft_status.get('phase', 'missing')}",
        )
    else:
        set_cond(v, st, reasons.MODEL_READY, True, reasons.RESOLVED, model_uri)


def _rollout(v: ServeView, st: Status) -> None:
    """Replicas, Available and Progressing, and the phase, from the serving workload's status."""
    p, wl = v.valid_plan, v.workload
    replicas = (
        p.spec.replicas
        if p.spec.autoscaling is None
        else max(p.spec.autoscaling.min_replicas, int(((wl or {}).get("spec") or {}).get("replicas") or 0))
    )
    st.replicas = replicas
    if wl is None:
        st.phase, st.message = reasons.DEPLOYING, f"creating {serving.name(p)}"
        st.ready_replicas, st.updated_replicas = 0, 0
        return
    ws = wl.get("status") or {}
    ready, updated = int(ws.get("readyReplicas") or 0), int(ws.get("updatedReplicas") or 0)
    st.ready_replicas, st.updated_replicas = ready, updated
    template_rev = (
        (serving.pod_template(wl).get("metadata") or {}).get("annotations", {}).get(serving.REVISION_ANNOTATION)
    )
    observed = wl["kind"] != "Deployment" or int(ws.get("observedGeneration") or 0) >= int(
        wl["metadata"].get("generation") or 1
    )
    current = template_rev == p.revision and observed
    progressing = condition(ws.get("conditions"), reasons.DEPLOYMENT_PROGRESSING) or {}
    set_cond(
        v,
        st,
        reasons.DEPLOYMENT_AVAILABLE,
        ready > 0,
        reasons.MINIMUM_REPLICAS_AVAILABLE if ready else reasons.NO_REPLICA_READY,
        f"{ready}/{replicas} ready",
    )
    if (
        current
        and progressing.get("status") == "False"
        and progressing.get("reason") == reasons.PROGRESS_DEADLINE_EXCEEDED
    ):
        _stuck(v, st, ready, _pod_problem(v.pods) or progressing.get("message", ""))
    elif current and updated >= replicas and ready >= replicas:
        st.revision = p.revision
        set_cond(v, st, reasons.DEPLOYMENT_PROGRESSING, True, reasons.ROLLOUT_COMPLETE, f"revision {p.revision}")
        st.phase = reasons.READY
        st.message = f"serving {p.served_name} at {st.endpoint}" if replicas else "scaled to zero"
    else:
        progress = f"revision {p.revision}: {updated}/{replicas} updated, {ready} ready"
        set_cond(v, st, reasons.DEPLOYMENT_PROGRESSING, True, reasons.ROLLING_OUT, progress)
        problem = _pod_problem(v.pods)
        st.phase = reasons.DEPLOYING
        st.message = f"rolling out {progress}" + (f" ({problem})" if problem else "")


def _account(v: ServeView, st: Status, replicas: int) -> None:
    """status.servingCost: the slices the service holds (replicas asked x chips x the chip-hour
    price) since its workload exists, brought up to date at most every ACCOUNT_EVERY seconds, in
    whole seconds, at the replica count the previous reconcile saw (`replicas`)."""
    cost = v.valid_plan.cost
    if cost is None or v.workload is None:
        return
    now, last = v.now.replace(microsecond=0), parse_time(st.cost_accounted_at)
    if last is not None and (now - last).total_seconds() < ACCOUNT_EVERY:
        return
    if last is not None and now > last:
        held = cost.hourly(replicas) * (now - last).total_seconds() / 3600
        st.serving_cost = round((st.serving_cost or 0.0) + held, 4)
    if st.serving_cost is None:
        st.serving_cost = 0.0
    st.cost_accounted_at = timestamp(now)


def _stuck(v: ServeView, st: Status, ready: int, why: str) -> None:
    """A rollout past its progress deadline: Failed with no replica ready, else the previous revision serves."""
    revision = v.valid_plan.revision
    set_cond(v, st, reasons.DEPLOYMENT_PROGRESSING, False, reasons.PROGRESS_DEADLINE_EXCEEDED, why)
    if ready:
        st.phase = reasons.DEPLOYING
        st.message = (
            f"rollout of revision {revision} is stuck ({why}); {ready} replica(s) of the previous revision still serve"
        )
    else:
        st.phase, st.message = reasons.FAILED, f"no replica became ready: {why}"


def _gate(v: ServeView, d: Decision[Status]) -> rollout_gate.Selection:
    """The rollout gate's decision in the status: the runs that pass, the run served, GatePassed
    (with an Event when it changes)."""
    st, spec = d.status_model, v.valid_plan.spec
    ref = spec.model.fine_tune_ref
    sel = rollout_gate.select(
        spec.rollout.gate,
        evaluation.runs_of((v.fine_tune or {}).get("status") or {}),
        st.model_uri,
        ref.run if ref else None,
        serve_benchmark.rejected_runs(spec.benchmark, st.rejected_runs),
    )
    st.passed_runs = sel.passed
    st.run = sel.run or None  # None: nothing served, or an output the fine-tune no longer lists
    before = find(st.conditions, reasons.GATE_PASSED)
    if not spec.rollout.gate or sel.verdict is None:
        if not spec.rollout.gate and before:
            st.conditions = [c for c in st.conditions if c.type != reasons.GATE_PASSED]
        return sel
    ok = sel.verdict.passed
    served = (
        f"serving run {sel.run}"
        if sel.run
        else f"serving {sel.model_uri}"
        if sel.model_uri
        else "nothing is served yet"
    )
    message = sel.verdict.message if ok else f"{sel.verdict.message}: not rolled out; {served}"
    if not before or before.status != str(ok) or before.message != message:
        d.events.append(
            ("Normal" if ok else "Warning", reasons.GATE_PASSED if ok else reasons.ROLLOUT_BLOCKED, message)
        )
    set_cond(v, st, reasons.GATE_PASSED, ok, sel.verdict.reason, message)
    return sel


def _blocked(sel: rollout_gate.Selection | None) -> tuple[str, str] | None:
    """Why nothing can be served although the fine-tune has outputs: a pin to no known run, or a gate no run passes."""
    if sel is None:
        return None
    if sel.pin_missing:
        return reasons.RUN_NOT_FOUND, sel.pin_missing
    if sel.verdict is not None and not sel.verdict.passed:
        return reasons.ROLLOUT_BLOCKED, f"{sel.verdict.message}: nothing passes the gate yet"
    return None


def _waiting(v: ServeView) -> tuple[str, str]:
    if v.fine_tune is None:
        return reasons.FINE_TUNE_NOT_FOUND, f"GemmaFineTune {v.fine_tune_name} not found in {v.namespace}"
    merge_spec = (v.fine_tune.get("spec") or {}).get("merge") or {}
    if merge_spec.get("output") == "adapter":
        return reasons.ADAPTER_ONLY, (
            f"GemmaFineTune {v.fine_tune_name} keeps only a PEFT adapter (spec.merge.output: adapter); a GemmaServe "
            "serves merged models: set its spec.merge.output to both or merged"
        )
    ft = v.fine_tune.get("status") or {}
    phase = ft.get("phase") or reasons.PENDING
    reason = reasons.FINE_TUNE_FAILED if phase == reasons.FAILED else reasons.FINE_TUNE_NOT_READY
    # Only a failure's message: its progress would rewrite this status at every training step.
    detail = f": {ft['message']}" if ft.get("message") and phase == reasons.FAILED else ""
    return reason, f"waiting for GemmaFineTune {v.fine_tune_name} ({phase}{detail})"


def _pod_problem(pods: list[dict]) -> str | None:
    """Why new pods are not ready: a waiting reason (CrashLoopBackOff, ImagePullBackOff...)."""
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason"):
                return f"{pod['metadata']['name']}: {waiting['reason']} {waiting.get('message', '')}".strip()
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == reasons.POD_SCHEDULED and c.get("status") == "False":
                return f"{pod['metadata']['name']}: {c.get('message', 'unschedulable')}"
    return None
