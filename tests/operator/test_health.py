"""Ready, Reconciling and Stalled in every phase of both kinds, read the way kstatus reads them."""

import pytest

from tests.support.phases import finetune_statuses, serve_statuses

STATUSES = {
    **{f"GemmaFineTune {k}": v for k, v in finetune_statuses().items()},
    **{f"GemmaServe {k}": v for k, v in serve_statuses().items()},
}
# What kstatus should conclude for each case: Current (done), InProgress or Failed.
EXPECTED = {
    "GemmaFineTune Pending": "InProgress",
    "GemmaFineTune Pending (JobSet missing)": "Failed",  # held until someone installs it
    "GemmaFineTune Training": "InProgress",
    "GemmaFineTune Suspended": "InProgress",
    "GemmaFineTune Merging": "InProgress",
    "GemmaFineTune Succeeded": "Current",
    "GemmaFineTune Failed": "Failed",
    "GemmaFineTune Failed (invalid spec)": "Failed",
    "GemmaServe WaitingForModel": "InProgress",
    "GemmaServe WaitingForModel (fine-tune failed)": "Failed",
    "GemmaServe Deploying": "InProgress",
    "GemmaServe Ready": "Current",
    "GemmaServe Deploying (rollout stuck)": "Failed",
    "GemmaServe Failed": "Failed",
    "GemmaServe Failed (invalid spec)": "Failed",
    "GemmaServe WaitingForModel (no run passes the gate)": "Failed",  # until a new run
    "GemmaServe Ready (the newest run fails the gate)": "Current",  # the newest run that passes serves
    "GemmaServe Ready (pinned run not found)": "Failed",  # the spec asks for what does not exist
}


def kstatus(generation: int, status: dict) -> str:
    """kstatus's decision for a custom resource (cli-utils pkg/kstatus/status/generic.go, then the
    `Ready` condition as its README describes for resources without a type-specific rule)."""
    if status.get("observedGeneration") != generation:
        return "InProgress"
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    if conditions.get("Reconciling") == "True":
        return "InProgress"
    if conditions.get("Stalled") == "True":
        return "Failed"
    return {"True": "Current", "False": "InProgress"}.get(conditions.get("Ready"), "Current")


def test_every_phase_of_both_kinds_is_covered():
    assert set(STATUSES) == set(EXPECTED)
    phases = {k.split(" (")[0] for k in STATUSES}
    assert {
        f"GemmaFineTune {p}" for p in ("Pending", "Training", "Merging", "Succeeded", "Failed", "Suspended")
    } <= phases
    assert {f"GemmaServe {p}" for p in ("WaitingForModel", "Deploying", "Ready", "Failed")} <= phases


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_kstatus_reads_each_phase_as_meant(case):
    st = STATUSES[case]
    assert st["phase"] == case.split()[1]
    assert kstatus(1, st) == EXPECTED[case], st["conditions"]
    assert kstatus(2, st) == "InProgress", "a generation the operator has not seen yet is in progress"
    conds = {c["type"]: c for c in st["conditions"]}
    assert all(c["observedGeneration"] == 1 for c in conds.values())
    true = [t for t in ("Ready", "Reconciling", "Stalled") if conds[t]["status"] == "True"]
    assert len(true) == (0 if st["phase"] == "Suspended" else 1), f"exactly one of them holds: {true}"
    if conds["Stalled"]["status"] == "True":
        assert conds["Stalled"]["message"] == st["message"] and conds["Stalled"]["reason"] != "Failed", (
            "the cause is named"
        )


def test_reasons_name_the_phase_or_the_cause():
    ft, gsv = finetune_statuses(), serve_statuses()
    assert (
        _cond(ft["Succeeded"], "Ready")["reason"] == "Succeeded"
        and _cond(ft["Merging"], "Reconciling")["reason"] == "Merging"
    )
    assert _cond(ft["Failed"], "Stalled")["reason"] == "PodFailurePolicy"
    assert _cond(ft["Failed (invalid spec)"], "Stalled")["reason"] == "InvalidSpec"
    assert _cond(gsv["Ready"], "Ready")["message"] == gsv["Ready"]["message"]
    assert _cond(gsv["Deploying (rollout stuck)"], "Ready")["reason"] == "ProgressDeadlineExceeded"
    assert _cond(gsv["WaitingForModel (fine-tune failed)"], "Stalled")["reason"] == "FineTuneFailed"
    assert _cond(gsv["WaitingForModel (no run passes the gate)"], "Stalled")["reason"] == "RolloutBlocked"
    assert _cond(gsv["Ready (pinned run not found)"], "Stalled")["reason"] == "RunNotFound"
    assert _cond(gsv["Ready (the newest run fails the gate)"], "GatePassed")["reason"] == "MetricFailed"


def _cond(status: dict, type_: str) -> dict:
    return next(c for c in status["conditions"] if c["type"] == type_)
