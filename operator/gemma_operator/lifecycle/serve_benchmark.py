"""The GemmaServe lifecycle's benchmark step and its SLO gate, pure like the rest of it.

Once a revision is Ready, its benchmark Job runs (once per revision and load: a result in
status.benchmarks is never measured again); its figures reach status.benchmark and, with an SLO,
the SLOMet condition. A miss is reported (a Warning Event), and with `onMiss: rollback` the run
served is rejected (status.rejectedRuns) so that the rollout gate serves the previous run that
passes: the serving children then roll back as for any change of model. A rejected run is not
tried again under the same SLO; a new run or a changed SLO tries again. Without an earlier run to
go back to, or with a pinned run, a miss is only reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gemma_operator import api, benchmark_results, failure_policy, reasons
from gemma_operator.api import BenchmarkResult, RejectedRun
from gemma_operator.api import GemmaServeStatus as Status
from gemma_operator.children import benchmark as benchmark_child
from gemma_operator.conditions import find
from gemma_operator.lifecycle.common import Decision, ResourceView, set_cond
from gemma_operator.plan import ServePlan, digest
from gemma_operator.settings import OperatorSettings

FINISHED = (reasons.SUCCEEDED, reasons.FAILED)


@dataclass
class BenchmarkView:
    """The current revision's benchmark Job and its pods, as observed (with spec.benchmark)."""

    job: dict | None = None
    pods: list[dict] = field(default_factory=list)
    others: list[dict] = field(default_factory=list)  # the GemmaServe's other benchmark Jobs


def slo_key(slo: api.BenchmarkSLO | None) -> str:
    return digest(slo.model_dump(mode="json", by_alias=True) if slo else {}, 12)


def rejected_runs(benchmark: api.Benchmark | None, rejected: Sequence[RejectedRun]) -> frozenset[str]:
    """The runs rolled back under the SLO the spec has now: a changed SLO tries them again."""
    if benchmark is None:
        return frozenset()
    current = slo_key(benchmark.slo)
    return frozenset(r.run for r in rejected if r.slo == current)


@dataclass
class _Step:
    """One reconcile's benchmark step: the resource as observed, its plan, its benchmark, the decision."""

    view: ResourceView
    plan: ServePlan
    seen: BenchmarkView
    d: Decision[Status]

    @property
    def st(self) -> Status:
        return self.d.status_model

    @property
    def bench(self) -> api.Benchmark:
        assert self.plan.spec.benchmark is not None
        return self.plan.spec.benchmark


def step(
    view: ResourceView, plan: ServePlan, seen: BenchmarkView, d: Decision[Status], settings: OperatorSettings
) -> None:
    """The benchmark of the revision once it is Ready, its result in the status, and the SLO gate."""
    st = d.status_model
    if plan.spec.benchmark is None:
        st.benchmark = None
        _drop_slo_met(st)
        return
    # An earlier revision's benchmark still running would measure this revision's pods as that one's.
    d.delete += [j for j in seen.others if failure_policy.job_outcome(j).state not in FINISHED]
    if st.phase != reasons.READY or st.revision != plan.revision:
        return  # measured once Ready; until then status.benchmark is the last revision's
    s = _Step(view, plan, seen, d)
    key = benchmark_child.load_key(plan)
    done = next((r for r in st.benchmarks if r.key == key), None)
    if done is None:
        done = _finished(s, key)
        if done is None:  # not finished: (re)created idempotently, its name is its key
            d.create.append(benchmark_child.job(plan, settings, view.owner))
            st.benchmark = _result(s, key, state=reasons.RUNNING, message="measuring")
            _drop_slo_met(st)
            return
        st.benchmarks = [done, *(r for r in st.benchmarks if r.key != key)][: api.MAX_ITEMS["benchmarks"]]
        if done.state == reasons.FAILED:
            d.events.append(("Warning", reasons.BENCHMARK_FAILED, f"revision {plan.revision}: {done.message}"))
        else:
            headline = benchmark_results.describe(_figures(done))
            d.events.append(("Normal", reasons.BENCHMARKED, f"revision {plan.revision}: {headline}"))
    _judge(s, done)


def _result(s: _Step, key: str, **fields: object) -> BenchmarkResult:
    """A result of this revision's benchmark: its identity and `fields` (by their status names)."""
    identity = {"revision": s.plan.revision, "key": key, "job": benchmark_child.name(s.plan), "run": s.st.run}
    return BenchmarkResult.model_validate({k: x for k, x in {**identity, **fields}.items() if x is not None})


def _figures(result: BenchmarkResult) -> dict:
    """A result's figures by their status names, as benchmark_results reads them."""
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def _finished(s: _Step, key: str) -> BenchmarkResult | None:
    """The result of this revision's Job once it has finished, from its pod's termination message."""
    if s.seen.job is None:
        return None
    outcome = failure_policy.job_outcome(s.seen.job)
    if outcome.state not in FINISHED:
        return None
    message = _termination_message(s.seen.pods)
    figures = benchmark_results.read(message) if outcome.state == reasons.SUCCEEDED else None
    if isinstance(figures, dict):
        return _result(
            s, key, state=outcome.state, **benchmark_results.with_cost(figures, s.plan.cost, s.st.replicas or 0)
        )
    why = figures or (message or "").strip()[-500:] or outcome.message or outcome.reason or "the Job failed"
    return _result(s, key, state=reasons.FAILED, message=why)


def _termination_message(pods: list[dict]) -> str | None:
    for pod in sorted(pods, key=lambda x: x["metadata"].get("creationTimestamp", ""), reverse=True):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if t := (cs.get("state") or {}).get("terminated"):
                return t.get("message")
    return None


def _judge(s: _Step, done: BenchmarkResult) -> None:
    """status.benchmark and SLOMet from the revision's result, under the SLO the spec has now."""
    st, b = s.st, s.bench
    if b.slo is None or done.state == reasons.FAILED:
        st.benchmark = done.model_copy(update={"slo_met": None})
        _drop_slo_met(st)
        return
    verdict = benchmark_results.judge(_figures(done), b.slo)
    st.benchmark = done.model_copy(update={"slo_met": verdict.met, "message": verdict.message})
    if verdict.met:
        _slo_met(s, True, reasons.WITHIN_SLO, f"revision {done.revision}: {verdict.message}")
        return
    earlier = _earlier_run(s)
    if b.on_miss == "rollback" and earlier and st.run:
        run = st.run
        message = f"run {run} missed the SLO ({verdict.message}): rolling back to run {earlier}"
        rejected = RejectedRun(run=run, revision=done.revision, slo=slo_key(b.slo), message=verdict.message)
        others = [r for r in st.rejected_runs if r.run != run]
        st.rejected_runs = [rejected, *others][: api.MAX_ITEMS["rejectedRuns"]]
        _slo_met(s, False, reasons.ROLLED_BACK, message)
        # Deploying: the rollout gate now picks the earlier run, and the poller comes back soon.
        st.phase, st.message = reasons.DEPLOYING, message
        return
    why = "" if b.on_miss == "report" else f"; not rolled back: {_why_not_rolled_back(s)}"
    _slo_met(s, False, reasons.SLO_MISSED, f"revision {done.revision} missed the SLO: {verdict.message}{why}")


def _earlier_run(s: _Step) -> str | None:
    """The run a rollback goes to: the newest other run that passes the gate, with no pinned run."""
    ref = s.plan.spec.model.fine_tune_ref
    if ref is None or ref.run is not None or s.st.run is None:
        return None
    return next((r for r in s.st.passed_runs if r != s.st.run), None)


def _why_not_rolled_back(s: _Step) -> str:
    ref = s.plan.spec.model.fine_tune_ref
    if ref is not None and ref.run is not None:
        return f"fineTuneRef.run pins run {ref.run}"
    return "no earlier run of the fine-tune passes the rollout gate"


def _slo_met(s: _Step, met: bool, reason: str, message: str) -> None:
    """SLOMet, with an Event (a Warning for a miss) whenever it changes."""
    before = find(s.st.conditions, reasons.SLO_MET)
    if before is None or before.status != str(met) or before.message != message:
        s.d.events.append(("Normal" if met else "Warning", reason, message))
    set_cond(s.view, s.st, reasons.SLO_MET, met, reason, message)


def _drop_slo_met(st: Status) -> None:
    if find(st.conditions, reasons.SLO_MET):
        st.conditions = [c for c in st.conditions if c.type != reasons.SLO_MET]
