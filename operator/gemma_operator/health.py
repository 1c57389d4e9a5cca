"""The conditions GitOps tools read: `Ready`, `Reconciling` and `Stalled`, from the phase.

kstatus (kubernetes-sigs/cli-utils, pkg/kstatus/README.md and status/generic.go), which Flux
uses for health, decides on `Reconciling=True` (in progress) and `Stalled=True` (failed) first,
then on `Ready`; `status.observedGeneration` behind `metadata.generation` means not yet seen.
`kubectl wait --for=condition=Ready` and Argo CD read `Ready`. Both kinds derive all three
from their phase here, in one place, after their lifecycle has decided, so they never disagree.
"""

from __future__ import annotations

from typing import Any

from gemma_operator.conditions import condition

DONE = ("Succeeded", "Ready")  # the phases in which the resource is what its spec asks for
IDLE = ("Suspended",)  # not done, and nothing is being worked on until the spec changes
# Conditions that mean no progress will be made without a change from outside.
STALLING = (
    ("Progressing", "False", "ProgressDeadlineExceeded"),  # a rollout whose pods never get ready
    ("ModelReady", "False", "FineTuneFailed"),  # the referenced fine-tune failed
    ("ModelReady", "False", "RunNotFound"),  # fineTuneRef.run names no run of the fine-tune
    ("ModelReady", "False", "RolloutBlocked"),  # no run passes the rollout gate: waits for a new run
)


def stalled_reason(status: dict[str, Any]) -> str | None:
    """Why the resource cannot get on by itself, or None."""
    conditions = status.get("conditions")
    failed = status.get("phase") == "Failed"
    if failed and (condition(conditions, "InvalidSpec") or {}).get("status") == "True":
        return "InvalidSpec"
    if failed and (condition(conditions, "Failed") or {}).get("status") == "True":
        return condition(conditions, "Failed")["reason"]
    if status.get("phase") == "Pending" and (condition(conditions, "DependencyMissing") or {}).get("status") == "True":
        return "DependencyMissing"  # held until an add-on is installed (addons.py): nothing moves meanwhile
    for type_, value, reason in STALLING:
        found = condition(conditions, type_) or {}
        if found.get("status") == value and found.get("reason") == reason:
            return reason
    return "Failed" if failed else None


def kstatus_conditions(status: dict[str, Any]) -> list[tuple[str, bool, str, str]]:
    """(type, value, reason, message) of Ready, Reconciling and Stalled for this status."""
    phase = status.get("phase") or "Pending"
    message = status.get("message") or phase
    stalled = stalled_reason(status)
    ready = phase in DONE and stalled is None
    reconciling = not ready and stalled is None and phase not in IDLE
    settled = "Stalled" if stalled else phase if phase in IDLE else "Reconciled"
    return [
        ("Ready", ready, stalled or phase, message),
        ("Reconciling", reconciling, phase if reconciling else settled, message if reconciling else ""),
        ("Stalled", stalled is not None, stalled or phase, message if stalled else ""),
    ]
