"""The failure policy as tables: every kind (Job, JobSet, pod) times every outcome (succeeded,
failed, suspended, preempted by disruption, by exit code 42, by a signal).

The policies the operator renders are evaluated here the way their controllers evaluate them, so a
rule in the wrong order, with the wrong operator or the wrong index fails a row:
- Job podFailurePolicy: rules in order, the first match wins; `onExitCodes` looks at the named
  container and never matches exit code 0; no match means the failure counts towards backoffLimit
  (Kubernetes pkg/controller/job/pod_failure_policy.go, matchPodFailurePolicy).
- A Job failed by a FailJob rule has reason PodFailurePolicy and a message ending "matching FailJob
  rule at index N" (same file, the message of the FailJob action).
- JobSet failurePolicy: rules in order, a rule matches a failed child Job by its reason and, when
  given, a message pattern (regular expression); no match restarts the gang, counted against
  maxRestarts (kubernetes-sigs/jobset pkg/controllers/failure_policy.go).
"""

from __future__ import annotations

import json
import re

import pytest

from gemma_operator import failure_policy as fp
from gemma_operator.failure_policy import Action

CONTAINER = "trainer"

# ---------------------------------------------------------------------------- exit code -> action

# exit code: what it means and what the operator must do about it
EXIT_CODES = {
    1: Action.FAIL,  # the application's error: retrying would burn TPU hours
    2: Action.FAIL,  # invalid input
    3: Action.FAIL,  # any other code is the application's verdict
    42: Action.RESTART,  # the trainer caught SIGTERM and saved a checkpoint
    127: Action.FAIL,  # below the signal range
    128: Action.RETRY,  # 128+N: killed by signal N
    137: Action.RETRY,  # SIGKILL (OOM)
    143: Action.RETRY,  # SIGTERM without a checkpoint
    255: Action.RETRY,
    256: Action.FAIL,  # not an exit status a container reports
}


@pytest.mark.parametrize("code, action", EXIT_CODES.items())
def test_exit_code_actions(code, action):
    assert fp.action_for(code) is action


# ---------------------------------------------------------------------------- Job podFailurePolicy


def _pod(exit_code: int | None = None, *, disruption: bool = False, container: str = CONTAINER) -> dict:
    status: dict = {"phase": "Failed"}
    if disruption:
        status["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
    if exit_code is not None:
        status["containerStatuses"] = [{"name": container, "state": {"terminated": {"exitCode": exit_code}}}]
    return {"metadata": {"name": "p"}, "status": status}


def _matches(rule: dict, pod: dict) -> bool:
    """One podFailurePolicy rule against a failed pod, as the Job controller reads it."""
    if conds := rule.get("onPodConditions"):
        return any(
            c.get("type") == want["type"] and c.get("status") == want["status"]
            for want in conds
            for c in pod["status"].get("conditions") or []
        )
    on = rule["onExitCodes"]
    for cs in pod["status"].get("containerStatuses") or []:
        if on.get("containerName") and cs["name"] != on["containerName"]:
            continue
        code = cs["state"]["terminated"]["exitCode"]
        if code == 0:  # upstream: exit code 0 never matches onExitCodes
            continue
        if (code in on["values"]) == (on["operator"] == "In"):
            return True
    return False


def _job_reaction(policy: dict, pod: dict) -> tuple[str, int | None]:
    """(action, index of the matching rule); "Count" when no rule matches."""
    for i, rule in enumerate(policy["rules"]):
        if _matches(rule, pod):
            return rule["action"], i
    return "Count", None


# pod: (single-host Job's reaction, JobSet child Job's reaction, is_preemption)
POD_OUTCOMES = {
    "preempted (DisruptionTarget)": (_pod(143, disruption=True), "Ignore", "FailJob", True),
    "preempted (exit 42)": (_pod(42), "Ignore", "FailJob", True),
    "killed by a signal (137)": (_pod(137), "Count", "Count", False),
    "killed by SIGTERM (143)": (_pod(143), "Count", "Count", False),
    "failed (exit 1)": (_pod(1), "FailJob", "FailJob", False),
    "invalid input (exit 2)": (_pod(2), "FailJob", "FailJob", False),
    "sidecar's exit 1": (_pod(1, container="sidecar"), "Count", "Count", False),
}


@pytest.mark.parametrize("case", POD_OUTCOMES)
def test_single_host_job_reacts_to_each_pod_outcome(case):
    pod, job_action, _, _ = POD_OUTCOMES[case]
    assert _job_reaction(fp.job_pod_failure_policy(CONTAINER), pod)[0] == job_action


@pytest.mark.parametrize("case", POD_OUTCOMES)
def test_pod_preemption_reading(case):
    pod, _, _, preempted = POD_OUTCOMES[case]
    assert fp.is_preemption(pod) is preempted


def test_succeeded_pods_are_no_preemption():
    pod = {"status": {"phase": "Succeeded", "containerStatuses": [{"state": {"terminated": {"exitCode": 0}}}]}}
    assert fp.is_preemption(pod) is False
    assert fp.is_preemption({"status": {"phase": "Running"}}) is False


def _jobset_reaction(pod: dict) -> str:
    """What the JobSet does when one child Job's pod ends like `pod`."""
    action, index = _job_reaction(fp.jobset_job_pod_failure_policy(CONTAINER), pod)
    if action != "FailJob":
        return "RestartCounted" if action == "Count" else action
    # The Job controller's message for a Job failed by a rule of its podFailurePolicy.
    job_failure = (
        "PodFailurePolicy",
        f"Container trainer for pod default/p failed ... matching FailJob rule at index {index}",
    )
    reason, message = job_failure
    for rule in fp.jobset_failure_policy(3)["rules"]:
        if reason not in rule["onJobFailureReasons"]:
            continue
        if any(re.search(p, message) for p in rule.get("onJobFailureMessagePatterns", [".*"])):
            return rule["action"]
    return "RestartCounted"


@pytest.mark.parametrize("case", POD_OUTCOMES)
def test_jobset_reacts_to_each_pod_outcome(case):
    pod, _, child_action, preempted = POD_OUTCOMES[case]
    assert _job_reaction(fp.jobset_job_pod_failure_policy(CONTAINER), pod)[0] == child_action
    expected = (
        "RestartJobSetAndIgnoreMaxRestarts"
        if preempted
        else "RestartCounted"
        if child_action == "Count"
        else "FailJobSet"
    )
    assert _jobset_reaction(pod) == expected


@pytest.mark.parametrize(
    "message, preemption",
    [
        ("matching FailJob rule at index 0", True),
        ("matching FailJob rule at index 1", True),
        ("matching FailJob rule at index 2", False),
        ("matching FailJob rule at index 10", False),  # not rule 1: the index is matched whole
    ],
)
def test_preemption_message_pattern(message, preemption):
    assert bool(re.search(fp.PREEMPTION_MESSAGE, message)) is preemption


# ---------------------------------------------------------------------------- observing a Job

RUNNING = {"active": 1, "ready": 1}


def _true(type_: str, reason: str = "", message: str = "") -> dict:
    return {"type": type_, "status": "True", "reason": reason, "message": message}


# case: (Job spec, Job status) -> (state, reason, message, restarts)
JOB_OUTCOMES = {
    "succeeded after a retry": (
        {},
        {"succeeded": 1, "failed": 1, "conditions": [_true("Complete", "CompletionsReached", "done")]},
        ("Succeeded", "CompletionsReached", "done", 1),
    ),
    "failed by its policy": (
        {},
        {"failed": 2, "conditions": [_true("Failed", "PodFailurePolicy", "exit 1")]},
        ("Failed", "PodFailurePolicy", "exit 1", 2),
    ),
    "failing (FailureTarget)": (
        {},
        {"failed": 1, "conditions": [_true("FailureTarget", "BackoffLimitExceeded", "too many")]},
        ("Failed", "BackoffLimitExceeded", "too many", 1),
    ),
    "a False Failed condition": (
        {},
        {**RUNNING, "conditions": [{"type": "Failed", "status": "False"}]},
        ("Running", "", "", 0),
    ),
    "suspended": ({"suspend": True}, {"failed": 1}, ("Suspended", "", "", 1)),
    "running": ({"suspend": False}, {**RUNNING, "failed": 3}, ("Running", "", "", 3)),
    "pods waiting for nodes": ({}, {"active": 1, "ready": 0}, ("Pending", "", "", 0)),
    "just created": ({}, None, ("Pending", "", "", 0)),
}


@pytest.mark.parametrize("case", JOB_OUTCOMES)
def test_job_outcome(case):
    spec, status, (state, reason, message, restarts) = JOB_OUTCOMES[case]
    # read as the API delivers it: strings parsed from JSON, not the literals the code compares with
    job = json.loads(json.dumps({"kind": "Job", "spec": spec, **({"status": status} if status is not None else {})}))
    for read in (fp.job_outcome, fp.outcome):
        assert read(job) == fp.Outcome(state, reason, message, restarts, 0)


# ---------------------------------------------------------------------------- observing a JobSet


def _replicated(ready: int) -> list[dict]:
    return [{"name": "workers", "ready": ready, "succeeded": 0, "failed": 0, "active": 2}]


# case: (JobSet spec, JobSet status) -> (state, reason, message, counted restarts, preemptions)
JOBSET_OUTCOMES = {
    "completed after a preemption": (
        {},
        {"restarts": 1, "restartsCountTowardsMax": 0, "conditions": [_true("Completed", "AllJobsCompleted", "ok")]},
        ("Succeeded", "AllJobsCompleted", "ok", 0, 1),
    ),
    "restartsCountTowardsMax omitted (0)": (
        {},
        {"restarts": 2, "replicatedJobsStatus": _replicated(2)},
        ("Running", "", "", 0, 2),
    ),
    "completed after preemptions and a crash": (
        {},
        {"restarts": 3, "restartsCountTowardsMax": 1, "conditions": [_true("Completed", "AllJobsCompleted", "ok")]},
        ("Succeeded", "AllJobsCompleted", "ok", 1, 2),
    ),
    "failed by its policy": (
        {},
        {
            "restarts": 2,
            "restartsCountTowardsMax": 2,
            "conditions": [_true("Failed", "FailedJobs", "job workers-0 failed")],
        },
        ("Failed", "FailedJobs", "job workers-0 failed", 2, 0),
    ),
    "failed after a preemption": (
        {},
        {"restarts": 4, "restartsCountTowardsMax": 3, "conditions": [_true("Failed", "ReachedMaxRestarts", "max")]},
        ("Failed", "ReachedMaxRestarts", "max", 3, 1),
    ),
    "suspended": (
        {"suspend": True},
        {"restarts": 2, "restartsCountTowardsMax": 1, "replicatedJobsStatus": _replicated(2)},
        ("Suspended", "", "", 1, 1),
    ),
    "running": (
        {"suspend": False},
        {"restarts": 1, "restartsCountTowardsMax": 1, "replicatedJobsStatus": _replicated(2)},
        ("Running", "", "", 1, 0),
    ),
    "no worker ready": ({}, {"replicatedJobsStatus": _replicated(0)}, ("Pending", "", "", 0, 0)),
    "a False Completed condition": (
        {},
        {"conditions": [{"type": "Completed", "status": "False"}], "replicatedJobsStatus": _replicated(1)},
        ("Running", "", "", 0, 0),
    ),
    "just created": ({}, None, ("Pending", "", "", 0, 0)),
}


@pytest.mark.parametrize("case", JOBSET_OUTCOMES)
def test_jobset_outcome(case):
    spec, status, expected = JOBSET_OUTCOMES[case]
    jobset = json.loads(
        json.dumps({"kind": "JobSet", "spec": spec, **({"status": status} if status is not None else {})})
    )
    for read in (fp.jobset_outcome, fp.outcome):
        assert read(jobset) == fp.Outcome(*expected)
