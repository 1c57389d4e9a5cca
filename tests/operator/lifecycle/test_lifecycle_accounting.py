"""The fine-tune lifecycle's status fields, not only its phase: the retry budget across attempts,
preemptions and counted restarts (single host from the pods, multi-host from the JobSet), JobSet
readings (queued, running, finished, failed) and the run without a merge.
"""

from __future__ import annotations

import datetime
import json

import pytest

from gemma_operator.children import training, training_objects
from gemma_operator.conditions import condition
from gemma_operator.lifecycle import finetune as finetune_lifecycle
from gemma_operator.plan import plan_finetune
from tests.support.builders import finetune
from tests.support.phases import COMPLETE, NS, SETTINGS, T0, finetune_statuses, pod, with_status

SPEC = finetune("ft").tpu("v5p", "2x2x1").spec
PLAN = plan_finetune("ft", NS, SPEC, SETTINGS)
BACKOFF = PLAN.spec.backoff_limit
MULTI_HOST = plan_finetune("ft", NS, finetune("ft").tpu("v5p", "2x2x2").spec, SETTINGS)
TRAINED = json.dumps({"status": "succeeded", "step": 100, "total_steps": 100, "loss": 0.5, "checkpoint": "gs://out/c"})


def _decide(status: dict, plan=PLAN, **children):
    view = finetune_lifecycle.FineTuneView(
        name="ft", namespace=NS, generation=1, status=status, owner=None, now=T0, problems=[], plan=plan, **children
    )
    return finetune_lifecycle.decide(view, SETTINGS)


def _failed_pod(code: int, *, disruption: bool = False) -> dict:
    p = pod("Failed", "trainer", {"exitCode": code})
    if disruption:
        p["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
    return p


# ---------------------------------------------------------------------------- single host: Job + pods

JOB = training_objects(PLAN, SETTINGS)[1]
RUNNING = {"active": 1, "ready": 1}

# pods seen beside a running Job (whose `failed` counts only what its policy counted) ->
# (status.preemptions, status.restarts)
POD_HISTORIES = {
    "none failed": ([], 0, (0, 0)),
    "preempted by exit 42": ([_failed_pod(42)], 0, (1, 0)),
    "preempted by disruption": ([_failed_pod(143, disruption=True)], 0, (1, 0)),
    "killed by a signal": ([_failed_pod(137)], 1, (0, 1)),
    "both preemptions and a signal": ([_failed_pod(42), _failed_pod(1, disruption=True), _failed_pod(137)], 1, (2, 1)),
}


@pytest.mark.parametrize("case", POD_HISTORIES)
def test_job_pods_count_preemptions_and_restarts(case):
    failed_pods, job_failed, (preemptions, restarts) = POD_HISTORIES[case]
    d = _decide(
        finetune_statuses()["Training"],
        training=with_status(JOB, {**RUNNING, "failed": job_failed}),
        training_pods=[*failed_pods, pod("Running", "trainer")],
    )
    assert (d.status["phase"], d.status["preemptions"], d.status["restarts"]) == ("Training", preemptions, restarts)


def test_counts_never_go_down_when_old_pods_are_gone():
    prior = {**finetune_statuses()["Training"], "preemptions": 3, "restarts": 2}
    d = _decide(prior, training=with_status(JOB, RUNNING), training_pods=[pod("Running", "trainer")])
    assert (d.status["preemptions"], d.status["restarts"]) == (3, 2)


# ---------------------------------------------------------------------------- retries across attempts


def test_a_vanished_workload_is_a_new_attempt_with_what_the_budget_left():
    prior = {**finetune_statuses()["Training"], "restarts": 1}
    d = _decide(prior)
    second, _ = training.names(PLAN, 2)
    assert (d.status["phase"], d.status["attempt"], d.status["restarts"]) == ("Pending", 2, 2)
    assert d.status["children"]["training"] == second
    job = next(o for o in d.create if o["kind"] == "Job")
    assert job["metadata"]["name"] == second
    assert job["spec"]["backoffLimit"] == BACKOFF - 2, "later attempts get what earlier ones left"
    assert ("Warning", "TrainingRecreated") in [e[:2] for e in d.events]


def test_a_later_attempt_counts_its_failures_on_top_of_the_earlier_ones():
    prior = {**finetune_statuses()["Training"], "restarts": 1, "attempt": 2}
    job = training_objects(PLAN, SETTINGS, None, 2, BACKOFF - 1)[1]
    d = _decide(prior, training=with_status(job, {**RUNNING, "failed": 1}), training_pods=[pod("Running", "trainer")])
    assert (d.status["phase"], d.status["restarts"]) == ("Training", 2)


def test_the_retry_budget_spent_fails_the_run():
    prior = {**finetune_statuses()["Training"], "restarts": BACKOFF}
    d = _decide(prior)
    failed = condition(d.status["conditions"], "Failed")
    assert (d.status["phase"], failed["reason"]) == ("Failed", "BackoffLimitExceeded")
    assert f"backoffLimit {BACKOFF}" in d.status["message"] and d.status["completionTime"]
    assert not d.create, "no attempt beyond the budget"


@pytest.mark.parametrize("running", [True, False], ids=["re-applied", "created"])
def test_a_budget_lowered_below_the_restarts_so_far_leaves_none(running):
    training_status = finetune_statuses()["Training"]
    prior = {**training_status, "restarts": BACKOFF + 2, "attempt": 1}
    if not running:  # not created before by this status: created, not counted as a retry
        prior["children"] = {**training_status["children"], "training": "elsewhere"}
    seen = {"training": with_status(JOB, RUNNING), "training_pods": [pod("Running", "trainer")]} if running else {}
    d = _decide(prior, **seen)
    job = next(o for o in d.create if o["kind"] == "Job")
    assert job["spec"]["backoffLimit"] == 0, "never a negative backoffLimit (the API server refuses it)"


def test_running_chip_hours_are_brought_up_to_date_once_a_minute():
    """Accounting alone rewrites the status at most every ACCOUNT_EVERY (60) seconds."""
    first = _decide(
        finetune_statuses()["Training"], training=with_status(JOB, RUNNING), training_pods=[pod("Running", "trainer")]
    ).status

    def later(seconds: int) -> dict:
        view = finetune_lifecycle.FineTuneView(
            name="ft",
            namespace=NS,
            generation=1,
            status=first,
            owner=None,
            now=T0 + datetime.timedelta(seconds=seconds),
            problems=[],
            plan=PLAN,
            training=with_status(JOB, RUNNING),
            training_pods=[pod("Running", "trainer")],
        )
        return finetune_lifecycle.decide(view, SETTINGS).status

    assert later(59)["accountedAt"] == first["accountedAt"] and later(59)["chipHours"] == first["chipHours"]
    assert later(60)["chipHours"] == pytest.approx(first["chipHours"] + PLAN.placement.chips * 60 / 3600, abs=1e-6)


# ---------------------------------------------------------------------------- multi-host: JobSet

JOBSET = training_objects(MULTI_HOST, SETTINGS)[1]
assert JOBSET["kind"] == "JobSet"
MH_PRIOR = finetune_statuses()["Pending (JobSet missing)"]


def _replicated(ready: int) -> list[dict]:
    return [{"name": "workers", "ready": ready, "active": 2, "succeeded": 0, "failed": 0}]


# JobSet spec + status -> (phase, status.restarts, status.preemptions, a condition that must be True)
JOBSET_CASES = {
    "queued by Kueue (suspended)": (
        {"suspend": True},
        {"replicatedJobsStatus": _replicated(0)},
        ("Pending", 0, 0, None),
    ),
    "running after a preemption and a crash": (
        {},
        {"restarts": 2, "restartsCountTowardsMax": 1, "replicatedJobsStatus": _replicated(2)},
        ("Training", 1, 1, None),
    ),
    "workers not ready yet": ({}, {"replicatedJobsStatus": _replicated(0)}, ("Pending", 0, 0, None)),
    "completed after preemptions": (
        {},
        {"restarts": 2, "conditions": [{"type": "Completed", "status": "True", "reason": "AllJobsCompleted"}]},
        ("Merging", 0, 2, "TrainingComplete"),
    ),
    "failed": (
        {},
        {
            "restarts": 1,
            "restartsCountTowardsMax": 1,
            "conditions": [{"type": "Failed", "status": "True", "reason": "FailedJobs", "message": "workers-0 failed"}],
        },
        ("Failed", 1, 0, "Failed"),
    ),
}


@pytest.mark.parametrize("case", JOBSET_CASES)
def test_jobset_readings(case):
    spec, status, (phase, restarts, preemptions, cond) = JOBSET_CASES[case]
    jobset = {**with_status(JOBSET, status), "spec": {**JOBSET["spec"], **spec}}
    pods = [pod("Succeeded", "trainer", {"exitCode": 0, "message": TRAINED})] if phase == "Merging" else []
    d = _decide(MH_PRIOR, plan=MULTI_HOST, training=jobset, training_pods=pods)
    assert (d.status["phase"], d.status["restarts"], d.status["preemptions"]) == (phase, restarts, preemptions)
    if cond:
        assert condition(d.status["conditions"], cond)["status"] == "True"
    if phase == "Failed":
        assert condition(d.status["conditions"], "Failed")["reason"] == "FailedJobs"
        assert d.status["message"] == "workers-0 failed"


# ---------------------------------------------------------------------------- merge disabled


def test_without_a_merge_the_run_succeeds_when_training_does():
    plan = plan_finetune("ft", NS, {**SPEC, "merge": {"enabled": False}}, SETTINGS)
    job = training_objects(plan, SETTINGS)[1]
    d = _decide(
        finetune_statuses()["Training"],
        plan=plan,
        training=with_status(job, COMPLETE),
        training_pods=[pod("Succeeded", "trainer", {"exitCode": 0, "message": TRAINED})],
    )
    assert d.status["phase"] == "Succeeded"
    assert d.status["message"] == "training finished (merge disabled)"
    assert d.status["completionTime"] and d.status["outputs"] == {"checkpoint": "gs://out/c", "step": 100}
    assert "merged" not in d.status["outputs"] and "merge" not in d.status["children"]
    assert condition(d.status["conditions"], "Complete")["status"] == "True"
    assert condition(d.status["conditions"], "TrainingComplete")["status"] == "True"
    assert not [o for o in d.create if o["kind"] == "Job"], "no merge Job"


def test_a_failure_read_from_the_api_says_why():
    """Pods as the API delivers them (strings parsed from JSON) give the failure's own message."""
    bad = json.dumps({"status": "failed", "error": "train.jsonl line 7: missing 'messages'"})
    failed_job = {"failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}]}
    observed = json.loads(
        json.dumps(
            {
                "training": with_status(JOB, failed_job),
                "training_pods": [pod("Failed", "trainer", {"exitCode": 2, "message": bad})],
            }
        )
    )
    d = _decide(finetune_statuses()["Training"], **observed)
    assert (d.status["phase"], d.status["message"]) == ("Failed", "exit code 2: train.jsonl line 7: missing 'messages'")
