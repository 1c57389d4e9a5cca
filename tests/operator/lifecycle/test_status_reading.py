"""The previous status is read into its typed model once per decision, whatever wrote it: a field
this version does not know is kept, and a value it cannot read is left out instead of failing
every reconcile."""

import datetime

from gemma_operator.lifecycle import finetune as finetune_lifecycle
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune

SETTINGS = OperatorSettings()
T0 = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)


def _decide(status: dict):
    b = finetune("ft").tpu("v5p", "2x2x1")
    plan = plan_finetune(b.name, "ns", b.spec, SETTINGS)
    view = finetune_lifecycle.FineTuneView(
        name="ft", namespace="ns", generation=1, status=status, plan=plan, problems=[], owner=None, now=T0
    )
    return plan, finetune_lifecycle.decide(view, SETTINGS)


def test_fields_of_another_version_are_kept():
    plan, d = _decide({"run": "0" * 12, "phase": "Pending", "queue": {"position": 3}, "outputs": {"shard": 2}})
    assert d.status["queue"] == {"position": 3}, "an unknown field is the other version's: left as it is"
    assert d.status["run"] == plan.run and "outputs" not in d.status, "a new run still clears the old run's outputs"


def test_a_value_this_version_cannot_read_is_left_out():
    foreign = {"type": "Example", "status": "True", "reason": "Because", "message": "", "lastTransitionTime": "t"}
    unreadable = {"type": "Broken", "status": "Maybe", "reason": "Odd"}  # status is True, False or Unknown
    plan, _ = _decide({})
    status = {"run": plan.run, "phase": "Queued", "chipHours": "a lot", "conditions": [foreign, unreadable]}
    _, d = _decide(status)
    assert (d.status["phase"], d.status["run"]) == ("Pending", plan.run), "an unknown phase reads as none"
    types = [c["type"] for c in d.status["conditions"]]
    assert "Example" in types and "Broken" not in types, "only the condition that cannot be read goes"
    assert "chipHours" not in d.status
