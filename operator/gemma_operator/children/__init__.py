"""Pure functions: a Plan in, Kubernetes manifests (dicts) out. No I/O."""

from __future__ import annotations

from typing import Any

from gemma_operator.children import merge, scaling, serving, training
from gemma_operator.plan import FineTunePlan, ServePlan
from gemma_operator.settings import OperatorSettings


def training_objects(
    plan: FineTunePlan,
    settings: OperatorSettings,
    owner: dict | None = None,
    attempt: int = 1,
    budget: int | None = None,
) -> list[dict[str, Any]]:
    """The first phase of a fine-tune: the TrainConfig ConfigMap and the training Job/JobSet."""
    return [training.config_map(plan, owner, attempt), training.workload(plan, settings, owner, attempt, budget)]


def merge_objects(
    plan: FineTunePlan, settings: OperatorSettings, owner: dict | None = None, step: int | None = None
) -> list[dict[str, Any]]:
    """The merge phase: the MergeConfig ConfigMap and the merge Job."""
    return [merge.config_map(plan, owner, step), merge.job(plan, settings, owner)]


def serving_objects(plan: ServePlan, settings: OperatorSettings, owner: dict | None = None) -> list[dict[str, Any]]:
    """The vLLM Deployment (or LeaderWorkerSet), its Service, and the optional HPA and monitors."""
    optional = [scaling.autoscaler(plan, owner), scaling.pod_monitor(plan, owner), scaling.pod_monitoring(plan, owner)]
    return [serving.workload(plan, settings, owner), serving.service(plan, owner), *(o for o in optional if o)]
