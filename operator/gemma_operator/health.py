"""The conditions GitOps tools read: `Ready`, `Reconciling` and `Stalled`, from the phase.

kstatus (kubernetes-sigs/cli-utils, pkg/kstatus/README.md and status/generic.go), which Flux
uses for health, decides on `Reconciling=True` (in progress) and `Stalled=True` (failed) first,
then on `Ready`; `status.observedGeneration` behind `metadata.generation` means not yet seen.
`kubectl wait --for=condition=Ready` and Argo CD read `Ready`. Both kinds derive all three
from their phase here, in one place, after their lifecycle has decided, so they never disagree.
"""

from __future__ import annotations

from gemma_operator import api, reasons
from gemma_operator.conditions import find

DONE = (reasons.SUCCEEDED, reasons.READY)  # the phases in which the resource is what its spec asks for
IDLE = (reasons.SUSPENDED,)  # not done, and nothing is being worked on until the spec changes
# Conditions that mean no progress will be made without a change from outside.
STALLING = (
    (
        reasons.DEPLOYMENT_PROGRESSING,
        "False",
        reasons.PROGRESS_DEADLINE_EXCEEDED,
    ),  # a rollout whose pods never get ready
    (reasons.MODEL_READY, "False", reasons.FINE_TUNE_FAILED),  # the referenced fine-tune failed
    (reasons.MODEL_READY, "False", reasons.RUN_NOT_FOUND),  # fineTuneRef.run names no run of the fine-tune
    (reasons.MODEL_READY, "False", reasons.ROLLOUT_BLOCKED),  # no run passes the rollout gate: waits for a new run
)


Status = api.GemmaFineTuneStatus | api.GemmaServeStatus


def stalled_reason(status: Status) -> str | None:
    """Why the resource cannot get on by itself, or None."""
    failed = status.phase == reasons.FAILED
    if failed and _is(status, reasons.INVALID_SPEC, "True"):
        return reasons.INVALID_SPEC
    if failed and (gave_up := find(status.conditions, reasons.FAILED)) and gave_up.status == "True":
        return gave_up.reason
    if status.phase == reasons.PENDING and _is(status, reasons.DEPENDENCY_MISSING, "True"):
        return reasons.DEPENDENCY_MISSING  # held until an add-on is installed (addons.py): nothing moves meanwhile
    for type_, value, reason in STALLING:
        if _is(status, type_, value, reason):
            return reason
    return reasons.FAILED if failed else None


def _is(status: Status, type_: str, value: str, reason: str | None = None) -> bool:
    found = find(status.conditions, type_)
    return found is not None and found.status == value and reason in (None, found.reason)


def kstatus_conditions(status: Status) -> list[tuple[str, bool, str, str]]:
    """(type, value, reason, message) of Ready, Reconciling and Stalled for this status."""
    phase = status.phase or reasons.PENDING
    message = status.message or phase
    stalled = stalled_reason(status)
    ready = phase in DONE and stalled is None
    reconciling = not ready and stalled is None and phase not in IDLE
    settled = reasons.STALLED if stalled else phase if phase in IDLE else reasons.RECONCILED
    return [
        (reasons.READY, ready, stalled or phase, message),
        (reasons.RECONCILING, reconciling, phase if reconciling else settled, message if reconciling else ""),
        (reasons.STALLED, stalled is not None, stalled or phase, message if stalled else ""),
    ]
