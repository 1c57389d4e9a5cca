"""Spec + operator settings -> a plan holding every derived value, or a SpecError.

A plan is computed before anything is scheduled: a spec that cannot work (unknown topology, a
mesh that does not match the slice, a model that does not fit in HBM, a local path no pod can
reach) is refused with one message per problem, naming the field. `common` holds what both
kinds share, `finetune` and `serve` one plan each, `evaluation` the fine-tune's evaluation.
"""

from gemma_operator.plan.common import SpecError, digest, parse
from gemma_operator.plan.finetune import FineTunePlan, default_mesh, plan_finetune
from gemma_operator.plan.serve import ServePlan, plan_serve

__all__ = ["FineTunePlan", "ServePlan", "SpecError", "default_mesh", "digest", "parse", "plan_finetune", "plan_serve"]
