"""What a GemmaServe with a fineTuneRef serves, resolved one way for the live operator and for
`gemma-tpu plan`/`render`: the model's location and run, and the preset of the fine-tune's plan
(never a display label of its status), which sizes the HBM fit and the start-up budget."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gemma_operator import rollout_gate
from gemma_operator.model_uri import ModelUri
from gemma_operator.plan.common import SpecError
from gemma_operator.plan.finetune import FineTunePlan, plan_finetune
from gemma_operator.settings import OperatorSettings


@dataclass(frozen=True)
class ServedModel:
    uri: str | None  # None: no output of the fine-tune may be served yet
    preset: str | None  # the fine-tune's, as its plan has it
    run: str | None  # the fine-tune's run the output comes from, when known

    @property
    def source(self) -> ModelUri | None:
        return ModelUri.parse(self.uri) if self.uri else None


def fine_tune_plan(fine_tune: Mapping[str, Any], settings: OperatorSettings) -> FineTunePlan | None:
    """The plan of a GemmaFineTune as read from the API server; None when its spec is invalid."""
    meta = fine_tune.get("metadata") or {}
    try:
        return plan_finetune(
            meta.get("name", ""), meta.get("namespace", ""), fine_tune.get("spec") or {}, settings, meta.get("labels")
        )
    except SpecError:
        return None


def served_model(
    spec: Mapping[str, Any],
    plan: FineTunePlan | None,
    observed: Mapping[str, Any] | None = None,
    served: str | None = None,
    rejected: Collection[str] = (),
) -> ServedModel:
    """From the referenced fine-tune's plan and, live, the fine-tune as observed (`{}` when it is
    not found): the newest output that passes the spec's rollout gate (or the pinned run's, else
    the one `served` now), never a run `rejected` by the benchmark's SLO; planned offline (`observed` None), the output its run will write."""
    preset = plan.preset if plan else None
    if observed is None:
        return ServedModel(plan.merged_dir if plan else None, preset, plan.run if plan else None)
    selection = rollout_gate.select_for(dict(spec), dict(observed), served, rejected)
    return ServedModel(selection.model_uri, preset, selection.run)
