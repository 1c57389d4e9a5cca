"""Chip-hour accounting of GemmaFineTune.decide: exact over many reconciles, and quiet while running."""

import datetime

import pytest

from gemma_operator.children import training
from gemma_operator.clock import timestamp
from gemma_operator.lifecycle import finetune as finetune_lifecycle
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune

SETTINGS = OperatorSettings()
T0 = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)


def _job(name: str, done_at: datetime.datetime | None = None, failed: bool = False) -> dict:
    status: dict = {"active": 1, "ready": 1, "startTime": timestamp(T0)}
    if done_at and failed:
        status = {
            "failed": 1,
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "lastTransitionTime": timestamp(done_at),
                }
            ],
        }
    elif done_at:
        status = {
            "succeeded": 1,
            "completionTime": timestamp(done_at),
            "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": timestamp(done_at)}],
        }
    return {"kind": "Job", "metadata": {"name": name, "annotations": {}}, "spec": {"backoffLimit": 3}, "status": status}


def _reconcile(plan, status: dict, at: datetime.datetime, job: dict) -> dict:
    view = finetune_lifecycle.FineTuneView(
        name="ft", namespace="ns", generation=1, status=status, plan=plan, problems=[], owner=None, now=at, training=job
    )
    return finetune_lifecycle.decide(view, SETTINGS).status


def _plan():
    b = finetune("ft").tpu("v5p", "2x2x1")
    return plan_finetune(b.name, "ns", b.spec, SETTINGS, b.obj()["metadata"].get("labels"))


def test_many_reconciles_account_exactly_the_running_time():
    plan = _plan()
    name, _ = training.names(plan)
    status: dict = {"run": plan.run, "attempt": 1, "phase": "Pending"}
    at = T0 + datetime.timedelta(microseconds=900_000)
    writes = 0
    for _ in range(500):  # a reconcile every 0.7 s, with fractional seconds, for 350 s
        new = _reconcile(plan, status, at, _job(name))
        writes += new.get("chipHours") != status.get("chipHours") or new.get("accountedAt") != status.get("accountedAt")
        status, at = new, at + datetime.timedelta(milliseconds=700)
    end = T0 + datetime.timedelta(seconds=400)
    status = _reconcile(plan, status, at, _job(name, done_at=end))
    assert "accountedAt" not in status, "a finished workload is not accounted any more"
    assert status["chipHours"] == pytest.approx(4 * 400 / 3600, abs=1e-5), (
        "4 chips from first seen (T0) to completionTime"
    )
    assert status["estimatedCost"] == round(status["chipHours"] * plan.price_per_chip_hour, 2)
    assert writes <= 350 / finetune_lifecycle.ACCOUNT_EVERY + 2, f"{writes} status changes from accounting alone"
    again = _reconcile(plan, status, end + datetime.timedelta(seconds=30), _job(name, done_at=end))
    assert again["chipHours"] == status["chipHours"], "reconciling a finished run adds nothing"


def test_failed_workload_is_accounted_until_its_failure_not_until_seen():
    plan = _plan()
    status = _reconcile(plan, {"run": plan.run, "attempt": 1, "phase": "Pending"}, T0, _job(training.names(plan)[0]))
    failed_at = T0 + datetime.timedelta(seconds=90)
    status = _reconcile(
        plan, status, failed_at + datetime.timedelta(hours=1), _job(training.names(plan)[0], failed_at, failed=True)
    )
    assert status["phase"] == "Failed"
    assert status["chipHours"] == pytest.approx(4 * 90 / 3600, abs=1e-6)


def test_a_workload_suspended_by_its_queue_is_accounted_until_then():
    plan = _plan()
    name, _ = training.names(plan)
    status = _reconcile(plan, {"run": plan.run, "attempt": 1, "phase": "Pending"}, T0, _job(name))
    status = _reconcile(plan, status, T0 + datetime.timedelta(seconds=30), _job(name))
    assert status["chipHours"] == 0, "not yet brought up to date (less than a minute)"
    suspended = {
        **_job(name),
        "spec": {"backoffLimit": 3, "suspend": True},
        "status": {"conditions": [{"type": "Suspended", "status": "True"}]},
    }
    status = _reconcile(plan, status, T0 + datetime.timedelta(seconds=45), suspended)
    assert status["chipHours"] == pytest.approx(4 * 45 / 3600, abs=1e-6) and "accountedAt" not in status
    status = _reconcile(plan, status, T0 + datetime.timedelta(hours=2), suspended)
    assert status["chipHours"] == pytest.approx(4 * 45 / 3600, abs=1e-6), "nothing while suspended"
