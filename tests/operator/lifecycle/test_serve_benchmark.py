"""The benchmark step of the GemmaServe lifecycle: once per revision, its figures in the status,
and the SLO gate that reports or rolls back to the previous run without looping.

Each case calls the pure `decide` with what a cluster would show (the manifests the operator
renders, with the status their controllers set), then feeds the status it wrote into the next
call, as the operator does from one reconcile to the next.
"""

from __future__ import annotations

import datetime
import json

import pytest

from gemma_operator import reasons
from gemma_operator.children import benchmark, serving_objects
from gemma_operator.conditions import condition
from gemma_operator.lifecycle import serve as serve_lifecycle
from gemma_operator.lifecycle.serve_benchmark import BenchmarkView
from gemma_operator.plan import plan_serve
from tests.support.builders import serve
from tests.support.phases import COMPLETE, DEPLOYMENT_READY, NS, SETTINGS, T0, pod, serve_view, with_status

RUN_OLD, RUN_NEW = "aaaaaa01", "bbbbbb02"
FINE_TUNE = {
    "status": {
        "phase": "Succeeded",
        "outputs": {"merged": f"gs://out/ft/{RUN_NEW}/merged"},
        "runs": [
            {"run": RUN_NEW, "merged": f"gs://out/ft/{RUN_NEW}/merged"},
            {"run": RUN_OLD, "merged": f"gs://out/ft/{RUN_OLD}/merged"},
        ],
    }
}
# The keys `vllm bench serve --save-result` writes (vllm/benchmarks/serve.py), as the pod copies them.
RESULT = {
    "duration": 12.5,
    "completed": 8,
    "failed": 0,
    "request_throughput": 0.64,
    "request_goodput": 0.48,
    "output_throughput": 40.96,
    "p50_ttft_ms": 210.0,
    "p90_ttft_ms": 380.0,
    "p99_ttft_ms": 401.5,
    "p50_tpot_ms": 20.0,
    "p99_tpot_ms": 31.0,
    "p50_itl_ms": 19.0,
    "p99_itl_ms": 45.0,
}


def spec(**bench) -> dict:
    return serve("chat").fine_tune("ft").set("benchmark", {"numPrompts": 8, "inputLen": 64, **bench}).spec


class Cluster:
    """One GemmaServe over reconciles: its status carried from one decision to the next."""

    def __init__(self, spec: dict, fine_tune: dict = FINE_TUNE) -> None:
        self.spec, self.fine_tune, self.status = spec, fine_tune, {}

    def plan(self):
        uri = serve_lifecycle.resolve_model("ft", self.fine_tune, self.status, self.spec)
        return plan_serve("chat", NS, self.spec, SETTINGS, model_uri=uri, fine_tune_preset="gemma4-31b")

    def reconcile(self, job: dict | None = None, pods: list[dict] = (), ready: bool = True, now=T0, others=()):
        plan = self.plan()
        deployment = serving_objects(plan, SETTINGS)[0]
        deployment["metadata"]["generation"] = 1
        rolling = {**DEPLOYMENT_READY, "readyReplicas": 0}
        view = serve_view(
            plan,
            self.status,
            now=now,
            fine_tune_name="ft",
            fine_tune=self.fine_tune,
            workload=with_status(deployment, DEPLOYMENT_READY if ready else rolling),
            benchmark=BenchmarkView(job, list(pods), list(others)),
        )
        d = serve_lifecycle.decide(view, SETTINGS)
        self.status = d.status
        return d, plan


def jobs(d) -> list[dict]:
    return [o for o in d.create if o["kind"] == "Job"]


def finished(job: dict, result: dict | None = RESULT, failed: bool = False) -> tuple[dict, list[dict]]:
    message = json.dumps(result) if result is not None else "Traceback ... ConnectionRefusedError"
    if failed:
        status = {"failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}
        return with_status(job, status), [pod("Failed", "benchmark", {"exitCode": 1, "message": message})]
    return with_status(job, COMPLETE), [pod("Succeeded", "benchmark", {"exitCode": 0, "message": message})]


def test_no_benchmark_until_the_revision_is_ready_then_one_job_named_from_it():
    c = Cluster(spec())
    d, plan = c.reconcile(ready=False)
    assert jobs(d) == [] and "benchmark" not in c.status
    d, plan = c.reconcile()
    [job] = jobs(d)
    assert job["metadata"]["name"] == benchmark.name(plan)
    assert c.status["benchmark"]["state"] == "Running" and c.status["benchmark"]["revision"] == plan.revision
    assert c.status["phase"] == reasons.READY, "a running benchmark does not hold the service back"


def test_figures_reach_the_status_once_and_the_job_is_never_made_again():
    c = Cluster(spec())
    d, plan = c.reconcile()
    job = jobs(d)[0]
    # The operator restarts while the benchmark runs: it decides from the status and the Job as
    # read, and asks for the same Job (created idempotently), not a second one.
    c.status = json.loads(json.dumps(c.status))
    d, _ = c.reconcile(job=with_status(job, {"active": 1, "ready": 1}), pods=[pod("Running", "benchmark")])
    assert [j["metadata"]["name"] for j in jobs(d)] == [job["metadata"]["name"]]
    d, _ = c.reconcile(job=finished(job)[0], pods=finished(job)[1])
    b = c.status["benchmark"]
    assert b["state"] == "Succeeded" and b["ttftP99Ms"] == RESULT["p99_ttft_ms"]
    assert b["outputTokensPerSecond"] == RESULT["output_throughput"] and b["errors"] == 0
    assert b["goodput"] == pytest.approx(0.75)
    assert [e[1] for e in d.events] == [reasons.BENCHMARKED]
    assert jobs(d) == []
    # Later reconciles (the Job gone to its TTL, or a restart) keep the figures and create nothing.
    d, _ = c.reconcile()
    assert jobs(d) == [] and c.status["benchmark"] == b and d.events == []


def test_cost_per_hour_and_per_million_output_tokens_at_the_measured_throughput():
    c = Cluster(spec())
    d, plan = c.reconcile()
    c.reconcile(*finished(jobs(d)[0]))
    b = c.status["benchmark"]
    hourly = plan.cost.hourly(1)  # 1 replica x 8 chips x the v6e price of the settings
    assert b["costPerHour"] == pytest.approx(hourly, rel=1e-4)
    assert b["costPerMillionOutputTokens"] == pytest.approx(
        hourly / (RESULT["output_throughput"] * 3600) * 1e6, rel=1e-4
    )


def test_a_failed_benchmark_says_why_and_is_not_retried_for_that_revision():
    c = Cluster(spec(slo={"ttftP99Ms": 1000}))
    d, _ = c.reconcile()
    d, _ = c.reconcile(*finished(jobs(d)[0], None, failed=True))
    assert c.status["benchmark"]["state"] == "Failed" and "ConnectionRefusedError" in c.status["benchmark"]["message"]
    assert [e[:2] for e in d.events] == [("Warning", reasons.BENCHMARK_FAILED)]
    assert condition(c.status["conditions"], reasons.SLO_MET) is None, "nothing measured, nothing judged"
    d, _ = c.reconcile()
    assert jobs(d) == []


def test_within_the_slo():
    c = Cluster(spec(slo={"ttftP99Ms": 500, "minOutputTokensPerSecond": 10}))
    d, _ = c.reconcile()
    c.reconcile(*finished(jobs(d)[0]))
    met = condition(c.status["conditions"], reasons.SLO_MET)
    assert (met["status"], met["reason"]) == ("True", reasons.WITHIN_SLO) and c.status["benchmark"]["sloMet"] is True


def test_a_miss_with_on_miss_report_only_reports():
    c = Cluster(spec(slo={"ttftP99Ms": 1}, onMiss="report"))
    d, plan = c.reconcile()
    d, _ = c.reconcile(*finished(jobs(d)[0]))
    missed = condition(c.status["conditions"], reasons.SLO_MET)
    assert (missed["status"], missed["reason"]) == ("False", reasons.SLO_MISSED)
    assert "ttftP99Ms 401.5 is above 1" in missed["message"]
    assert ("Warning", reasons.SLO_MISSED) in [e[:2] for e in d.events]
    assert c.status["phase"] == reasons.READY and c.status.get("rejectedRuns", []) == []
    assert c.plan().revision == plan.revision, "the revision keeps serving"


def test_a_miss_with_rollback_restores_the_previous_run_once_and_does_not_loop():
    c = Cluster(spec(slo={"ttftP99Ms": 300}, onMiss="rollback"))
    d, new_plan = c.reconcile()
    assert c.status["run"] == RUN_NEW
    d, _ = c.reconcile(*finished(jobs(d)[0]))
    assert c.status["rejectedRuns"][0]["run"] == RUN_NEW
    rolled = condition(c.status["conditions"], reasons.SLO_MET)
    assert (rolled["status"], rolled["reason"]) == ("False", reasons.ROLLED_BACK)
    assert (
        c.status["phase"] == reasons.DEPLOYING
        and [e[:2] for e in d.events].count(("Warning", reasons.ROLLED_BACK)) == 1
    )
    # The next reconcile serves the previous run: a new revision, rolled out, then measured.
    old_plan = c.plan()
    assert old_plan.model_uri.endswith(f"{RUN_OLD}/merged") and old_plan.revision != new_plan.revision
    d, _ = c.reconcile(ready=False)
    assert c.status["run"] == RUN_OLD and c.status["passedRuns"] == [RUN_OLD]
    d, _ = c.reconcile()
    [job] = jobs(d)
    assert job["metadata"]["name"] == benchmark.name(old_plan)
    # The previous run misses too: with no earlier run left it is only reported, and it stays.
    d, _ = c.reconcile(*finished(job))
    missed = condition(c.status["conditions"], reasons.SLO_MET)
    assert missed["reason"] == reasons.SLO_MISSED and "no earlier run" in missed["message"]
    assert [r["run"] for r in c.status["rejectedRuns"]] == [RUN_NEW]
    for _ in range(3):
        d, _ = c.reconcile()
        assert jobs(d) == [] and c.plan().revision == old_plan.revision and c.status["phase"] == reasons.READY


def test_a_changed_slo_tries_the_rejected_run_again_without_measuring_it_again():
    c = Cluster(spec(slo={"ttftP99Ms": 300}, onMiss="rollback"))
    d, new_plan = c.reconcile()
    c.reconcile(*finished(jobs(d)[0]))
    assert c.plan().model_uri.endswith(f"{RUN_OLD}/merged")
    c.spec = spec(slo={"ttftP99Ms": 500}, onMiss="rollback")
    assert c.plan().revision == new_plan.revision, "the newest run is served again"
    d, _ = c.reconcile()
    assert jobs(d) == [], "its figures are kept for its revision and load"
    met = condition(c.status["conditions"], reasons.SLO_MET)
    assert (met["status"], c.status["run"]) == ("True", RUN_NEW)


def test_a_new_run_is_tried_even_after_a_rejection():
    c = Cluster(spec(slo={"ttftP99Ms": 300}, onMiss="rollback"))
    d, _ = c.reconcile()
    c.reconcile(*finished(jobs(d)[0]))
    newer = "cccccc03"
    runs = [{"run": newer, "merged": f"gs://out/ft/{newer}/merged"}, *FINE_TUNE["status"]["runs"]]
    c.fine_tune = {"status": {**FINE_TUNE["status"], "runs": runs}}
    assert c.plan().model_uri.endswith(f"{newer}/merged")


def test_a_pinned_run_is_never_rolled_back():
    pinned = serve("chat").fine_tune("ft").set("model.fineTuneRef.run", RUN_NEW).spec
    c = Cluster({**pinned, "benchmark": {"numPrompts": 8, "slo": {"ttftP99Ms": 1}, "onMiss": "rollback"}})
    d, _ = c.reconcile()
    c.reconcile(*finished(jobs(d)[0]))
    missed = condition(c.status["conditions"], reasons.SLO_MET)
    assert missed["reason"] == reasons.SLO_MISSED and f"pins run {RUN_NEW}" in missed["message"]
    assert c.status.get("rejectedRuns", []) == []


def test_removing_the_benchmark_removes_its_condition_and_current_figures():
    c = Cluster(spec(slo={"ttftP99Ms": 500}))
    d, _ = c.reconcile()
    c.reconcile(*finished(jobs(d)[0]))
    c.spec = serve("chat").fine_tune("ft").spec
    d, _ = c.reconcile()
    assert "benchmark" not in c.status and condition(c.status["conditions"], reasons.SLO_MET) is None
    assert jobs(d) == []


def test_the_serving_cost_so_far_accrues_for_the_slices_held():
    c = Cluster(serve("chat").fine_tune("ft").set("replicas", 2).spec)
    _, plan = c.reconcile(now=T0)
    assert c.status["servingCost"] == 0.0
    c.reconcile(now=T0 + datetime.timedelta(seconds=30))
    assert c.status["servingCost"] == 0.0, "brought up to date at most every minute"
    c.reconcile(now=T0 + datetime.timedelta(hours=3))
    # 2 replicas x 8 chips x the v6e price of the settings, for 3 hours.
    assert c.status["servingCost"] == pytest.approx(3 * 2 * 8 * SETTINGS.prices_per_chip_hour["v6e"], abs=1e-3)
    assert c.status["servingCost"] == pytest.approx(3 * plan.cost.hourly(2), abs=1e-3)


def test_an_earlier_revisions_benchmark_still_running_is_stopped():
    c = Cluster(spec())
    d, _ = c.reconcile()
    running = with_status(jobs(d)[0], {"active": 1})
    c.spec = spec(outputLen=64)  # a new load: a new benchmark, and the old one must not go on measuring
    d, _ = c.reconcile(others=[running])
    assert d.delete == [running] and len(jobs(d)) == 1 and jobs(d)[0]["metadata"]["name"] != running["metadata"]["name"]
    done = with_status(running, COMPLETE)
    d, _ = c.reconcile(others=[done])
    assert d.delete == [], "a finished one keeps its log until its TTL"
