"""A warmup the training pod would refuse is refused when planned: it must end before the last step."""

import pytest

from gemma_operator.plan import plan_finetune
from gemma_operator.plan.common import SpecError
from tests.support.builders import finetune
from tests.support.phases import NS, SETTINGS


def _plan(warmup: int, steps: int = 100):
    spec = finetune("ft").tpu("v5p", "2x2x1").set("training.steps", steps).set("training.warmupSteps", warmup).spec
    return plan_finetune("ft", NS, spec, SETTINGS)


def test_warmup_must_end_before_the_last_step():
    assert _plan(99).spec.training.warmup_steps == 99
    for warmup in (100, 101):
        with pytest.raises(SpecError, match=f"spec.training.warmupSteps: {warmup} must be below steps 100"):
            _plan(warmup)
