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

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gemma_operator import api, benchmark_results, failure_policy, reasons
from gemma_operator.children import benchmark as benchmark_child
from gemma_operator.conditions import condition
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


def rejected_runs(benchmark: api.Benchmark | None, status: Mapping[str, Any] | None) -> frozenset[str]:
    """The runs rolled back under the SLO the spec has now: a changed SLO tries them again."""
    if benchmark is None:
        return frozenset()
    current = slo_key(benchmark.slo)
    return frozenset(r["run"] for r in (status or {}).get("rejectedRuns") or [] if r.get("slo") == current)


@dataclass
class _Step:
    """One reconcile's benchmark step: the resource as observed, its plan, its benchmark, the decision."""

    view: ResourceView
    plan: ServePlan
    seen: BenchmarkView
    d: Decision

    @property
    def st(self) -> dict[str, Any]:
        return self.d.status

    @property
    def bench(self) -> api.Benchmark:
        assert self.plan.spec.benchmark is not None
        return self.plan.spec.benchmark


def step(view: ResourceView, plan: ServePlan, seen: BenchmarkView, d: Decision, settings: OperatorSettings) -> None:
    """The benchmark of the revision once it is Ready, its result in the status, and the SLO gate."""
    st = d.status
    if plan.spec.benchmark is None:
        st.pop("benchmark", None)
        _drop_slo_met(st)
        return
    # An earlier revision's benchmark still running would measure this revision's pods as that one's.
    d.delete += [j for j in seen.others if failure_policy.job_outcome(j).state not in FINISHED]
    if st.get("phase") != reasons.READY or st.get("revision") != plan.revision:
        return  # measured once Ready; until then status.benchmark is the last revision's
    s = _Step(view, plan, seen, d)
    key = benchmark_child.load_key(plan)
    done = next((r for r in st.get("benchmarks") or [] if r.get("key") == key), None)
    if done is None:
        done = _finished(s, key)
        if done is None:  # not finished: (re)created idempotently, its name is its key
            d.create.append(benchmark_child.job(plan, settings, view.owner))
            st["benchmark"] = {**_identity(s, key), "state": reasons.RUNNING, "message": "measuring"}
            _drop_slo_met(st)
            return
        st["benchmarks"] = benchmark_results.remember(st.get("benchmarks") or [], done)
        if done["state"] == reasons.FAILED:
            d.events.append(("Warning", reasons.BENCHMARK_FAILED, f"revision {plan.revision}: {done['message']}"))
        else:
            d.events.append(
                ("Normal", reasons.BENCHMARKED, f"revision {plan.revision}: " + benchmark_results.describe(done))
            )
    _judge(s, done)


def _identity(s: _Step, key: str) -> dict[str, Any]:
    out = {"revision": s.plan.revision, "key": key, "job": benchmark_child.name(s.plan)}
    return {**out, "run": s.st["run"]} if s.st.get("run") else out


def _finished(s: _Step, key: str) -> dict[str, Any] | None:
    """The result of this revision's Job once it has finished, from its pod's termination message."""
    if s.seen.job is None:
        return None
    outcome = failure_policy.job_outcome(s.seen.job)
    if outcome.state not in FINISHED:
        return None
    out = {**_identity(s, key), "state": outcome.state}
    message = _termination_message(s.seen.pods)
    figures = benchmark_results.read(message) if outcome.state == reasons.SUCCEEDED else None
    if isinstance(figures, dict):
        return {**out, **benchmark_results.with_cost(figures, s.plan.cost, int(s.st.get("replicas") or 0))}
    why = figures or (message or "").strip()[-500:] or outcome.message or outcome.reason or "the Job failed"
    return {**out, "state": reasons.FAILED, "message": why}


def _termination_message(pods: list[dict]) -> str | None:
    for pod in sorted(pods, key=lambda x: x["metadata"].get("creationTimestamp", ""), reverse=True):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if t := (cs.get("state") or {}).get("terminated"):
                return t.get("message")
    return None


def _judge(s: _Step, done: dict[str, Any]) -> None:
    """status.benchmark and SLOMet from the revision's result, under the SLO the spec has now."""
    st, b = s.st, s.bench
    current = {k: x for k, x in done.items() if k != "sloMet"}
    if b.slo is None or done["state"] == reasons.FAILED:
        st["benchmark"] = current
        _drop_slo_met(st)
        return
    verdict = benchmark_results.judge(done, b.slo)
    st["benchmark"] = {**current, "sloMet": verdict.met, "message": verdict.message}
    if verdict.met:
        _slo_met(s, True, reasons.WITHIN_SLO, f"revision {done['revision']}: {verdict.message}")
        return
    earlier = _earlier_run(s)
    if b.on_miss == "rollback" and earlier:
        run = st["run"]
        message = f"run {run} missed the SLO ({verdict.message}): rolling back to run {earlier}"
        rejected = {"run": run, "revision": done["revision"], "slo": slo_key(b.slo), "message": verdict.message}
        others = [r for r in st.get("rejectedRuns") or [] if r.get("run") != run]
        st["rejectedRuns"] = [rejected, *others][: api.MAX_ITEMS["rejectedRuns"]]
        _slo_met(s, False, reasons.ROLLED_BACK, message)
        # Deploying: the rollout gate now picks the earlier run, and the poller comes back soon.
        st.update(phase=reasons.DEPLOYING, message=message)
        return
    why = "" if b.on_miss == "report" else f"; not rolled back: {_why_not_rolled_back(s)}"
    _slo_met(s, False, reasons.SLO_MISSED, f"revision {done['revision']} missed the SLO: {verdict.message}{why}")


def _earlier_run(s: _Step) -> str | None:
    """The run a rollback goes to: the newest other run that passes the gate, with no pinned run."""
    ref = s.plan.spec.model.fine_tune_ref
    if ref is None or ref.run is not None or s.st.get("run") is None:
        return None
    return next((r for r in s.st.get("passedRuns") or [] if r != s.st["run"]), None)


def _why_not_rolled_back(s: _Step) -> str:
    ref = s.plan.spec.model.fine_tune_ref
    if ref is not None and ref.run is not None:
        return f"fineTuneRef.run pins run {ref.run}"
    return "no earlier run of the fine-tune passes the rollout gate"


def _slo_met(s: _Step, met: bool, reason: str, message: str) -> None:
    """SLOMet, with an Event (a Warning for a miss) whenever it changes."""
    before = condition(s.st.get("conditions"), reasons.SLO_MET) or {}
    if before.get("status") != str(met) or before.get("message") != message:
        s.d.events.append(("Normal" if met else "Warning", reason, message))
    set_cond(s.view, s.st, reasons.SLO_MET, met, reason, message)


def _drop_slo_met(st: dict[str, Any]) -> None:
    if condition(st.get("conditions"), reasons.SLO_MET):
        st["conditions"] = [c for c in st["conditions"] if c["type"] != reasons.SLO_MET]
