"""What a failed workload pod means, and how Jobs and JobSets are told to react.

One table decides: exit code -> action. Kubernetes then enforces it, through the Job's
podFailurePolicy (single host) or the JobSet's failurePolicy rules (multi-host), so a failure is
handled the same way whether or not the operator is running at that moment.

- Preemption or maintenance (the pod's DisruptionTarget condition, or exit 42: the trainer caught
  SIGTERM and saved a checkpoint): restart, never counted against the retry budget.
- Killed by a signal (exit 128+N, e.g. OOM or a node crash): restart, counted (spec.backoffLimit).
- Any other exit code is the application's verdict (bad input, a bug): fail at once, retrying
  would only burn TPU hours.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from gemma_operator import reasons
from gemma_workloads.config import EXIT_FAILED, EXIT_INVALID_INPUT, EXIT_PREEMPTED


class Action(enum.Enum):
    RESTART = "restart"  # not counted: preemption, maintenance
    RETRY = "retry"  # counted against the retry budget
    FAIL = "fail"


SIGNAL_EXIT_CODES = list(range(128, 256))
EXIT_CODE_ACTIONS: dict[int, Action] = {
    EXIT_PREEMPTED: Action.RESTART,
    EXIT_FAILED: Action.FAIL,
    EXIT_INVALID_INPUT: Action.FAIL,
    **{code: Action.RETRY for code in SIGNAL_EXIT_CODES},
}


def action_for(exit_code: int) -> Action:
    return EXIT_CODE_ACTIONS.get(exit_code, Action.FAIL)


def _codes(action: Action) -> list[int]:
    return sorted(c for c, a in EXIT_CODE_ACTIONS.items() if a is action)


def _not_failing_codes() -> list[int]:
    return sorted(c for c, a in EXIT_CODE_ACTIONS.items() if a is not Action.FAIL)


def job_pod_failure_policy(container: str) -> dict[str, Any]:
    """Single-host Job: preemptions are ignored (the pod is recreated, nothing counted), signals
    count towards backoffLimit, every other exit code fails the Job at once."""
    return {
        "rules": [
            {"action": "Ignore", "onPodConditions": [{"type": reasons.POD_DISRUPTION_TARGET, "status": "True"}]},
            {
                "action": "Ignore",
                "onExitCodes": {"containerName": container, "operator": "In", "values": _codes(Action.RESTART)},
            },
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": container, "operator": "NotIn", "values": _not_failing_codes()},
            },
        ]
    }


def _jobset_job_rules(container: str) -> list[tuple[dict[str, Any], bool]]:
    """The child Jobs' podFailurePolicy rules, each with whether it means a preemption."""

    def exit_codes(operator: str, codes: list[int]) -> dict[str, Any]:
        return {"action": "FailJob", "onExitCodes": {"containerName": container, "operator": operator, "values": codes}}

    return [
        ({"action": "FailJob", "onPodConditions": [{"type": reasons.POD_DISRUPTION_TARGET, "status": "True"}]}, True),
        (exit_codes("In", _codes(Action.RESTART)), True),
        (exit_codes("NotIn", _not_failing_codes()), False),
    ]


def jobset_job_pod_failure_policy(container: str) -> dict[str, Any]:
    return {"rules": [rule for rule, _ in _jobset_job_rules(container)]}


# JobSet restarts the whole slice gang. Its rules match the child Job's failure; a Job failed by a
# rule of its podFailurePolicy carries "... matching FailJob rule at index N" (the Job controller's
# message), so the preemption rules are told apart by their indexes, derived from the rules above.
PREEMPTION_RULES = [i for i, (_, preemption) in enumerate(_jobset_job_rules("")) if preemption]
PREEMPTION_MESSAGE = rf"matching FailJob rule at index ({'|'.join(map(str, PREEMPTION_RULES))})\b"


def jobset_failure_policy(max_restarts: int) -> dict[str, Any]:
    """Preemption restarts the gang uncounted; application errors fail the JobSet; anything else
    (signals, lost nodes) restarts it, counted against maxRestarts."""
    return {
        "maxRestarts": max_restarts,
        "rules": [
            {
                "name": "preemption",
                "action": "RestartJobSetAndIgnoreMaxRestarts",
                "onJobFailureReasons": [reasons.JOB_POD_FAILURE_POLICY],
                "onJobFailureMessagePatterns": [PREEMPTION_MESSAGE],
            },
            {
                "name": "applicationError",
                "action": "FailJobSet",
                "onJobFailureReasons": [reasons.JOB_POD_FAILURE_POLICY],
            },
        ],
    }


# ---------------------------------------------------------------------------- observing children


@dataclass(frozen=True)
class Outcome:
    """Where a Job or JobSet stands, in the terms the lifecycle needs."""

    state: str  # Pending | Running | Succeeded | Failed | Suspended
    reason: str = ""
    message: str = ""
    restarts: int = 0  # counted failures so far
    preemptions: int = 0  # uncounted restarts (JobSet); Jobs report them through their pods


def _condition(obj: dict, type_: str) -> dict | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return c
    return None


def job_outcome(job: dict) -> Outcome:
    status = job.get("status") or {}
    failed = int(status.get("failed") or 0)
    if c := _condition(job, reasons.JOB_COMPLETE):
        return Outcome(reasons.SUCCEEDED, c.get("reason", ""), c.get("message", ""), failed)
    if c := (_condition(job, reasons.JOB_FAILED) or _condition(job, reasons.JOB_FAILURE_TARGET)):
        return Outcome(reasons.FAILED, c.get("reason", ""), c.get("message", ""), failed)
    if (job.get("spec") or {}).get("suspend"):
        return Outcome(reasons.SUSPENDED, restarts=failed)
    # `active` also counts pods still waiting for a node; `ready` only those running.
    running = int(status.get("ready") or 0) > 0
    return Outcome(reasons.RUNNING if running else reasons.PENDING, restarts=failed)


def jobset_outcome(jobset: dict) -> Outcome:
    status = jobset.get("status") or {}
    restarts = int(status.get("restarts") or 0)
    # Omitted when 0 (`omitempty` in JobSet's API types), and every JobSet the operator supports sets
    # it: so a missing count means all restarts were preemptions, not that none were.
    counted = int(status.get("restartsCountTowardsMax") or 0)
    preempted = restarts - counted
    if c := _condition(jobset, reasons.JOBSET_COMPLETED):
        return Outcome(reasons.SUCCEEDED, c.get("reason", ""), c.get("message", ""), counted, preempted)
    if c := _condition(jobset, reasons.JOB_FAILED):
        return Outcome(reasons.FAILED, c.get("reason", ""), c.get("message", ""), counted, preempted)
    if (jobset.get("spec") or {}).get("suspend"):
        return Outcome(reasons.SUSPENDED, restarts=counted, preemptions=preempted)
    ready = sum(int(r.get("ready") or 0) for r in status.get("replicatedJobsStatus") or [])
    return Outcome(reasons.RUNNING if ready else reasons.PENDING, restarts=counted, preemptions=preempted)


def outcome(obj: dict) -> Outcome:
    return jobset_outcome(obj) if obj.get("kind") == "JobSet" else job_outcome(obj)


def is_preemption(pod: dict) -> bool:
    """A failed pod that was preempted or evicted for maintenance (not counted as a failure)."""
    if _condition(pod, reasons.POD_DISRUPTION_TARGET):
        return True
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated") or {}
        if terminated and action_for(int(terminated.get("exitCode", 0))) is Action.RESTART:
            return True
    return False
