"""spec.dataset and spec.lora are declared once, by the training contract: the API's fields carry
the contract's own bounds, defaults and descriptions, so whatever the API admits the pod accepts,
and the plan hands the blocks over whole."""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import ValidationError

from gemma_operator import api
from gemma_operator.model_shapes import PRESETS
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from gemma_workloads import config
from tests.support.builders import finetune

PAIRS = [(api.Lora, config.LoraConfig, {}), (api.Dataset, config.DatasetConfig, {"uri": "path"})]


@pytest.mark.parametrize("api_model, contract, renamed", PAIRS)
def test_every_api_field_is_a_contract_field_with_its_declaration(api_model, contract, renamed):
    for name, field in api_model.model_fields.items():
        theirs = contract.model_fields[renamed.get(name, name)]
        if name in renamed or name == "target_modules":  # the location; the typed target list (below)
            continue
        assert (field.annotation, field.metadata, field.default, field.description) == (
            theirs.annotation,
            theirs.metadata,
            theirs.default,
            theirs.description,
        ), name
    assert set(contract.model_fields) == {renamed.get(n, n) for n in api_model.model_fields}


def test_the_preference_settings_carry_the_contracts_bounds_and_leave_its_defaults_to_the_plan():
    """beta and orpoLambda belong to one method each: the API leaves them unset (so a value set for the
    other method shows), with the contract's bounds and description; the plan hands over its defaults."""
    for name in ("beta", "orpo_lambda"):
        ours, theirs = api.Preference.model_fields[name], config.PreferenceConfig.model_fields[name]
        assert ours.default is None and ours.annotation == (Annotated[float, *theirs.metadata] | None), name
        assert ours.description == f"{theirs.description} Unset: {theirs.default:g}.", name
    ours, theirs = (
        api.Preference.model_fields["label_smoothing"],
        config.PreferenceConfig.model_fields["label_smoothing"],
    )
    assert (ours.annotation, ours.metadata, ours.default, ours.description) == (
        theirs.annotation,
        theirs.metadata,
        theirs.default,
        theirs.description,
    )
    assert set(config.PreferenceConfig.model_fields) == set(api.Preference.model_fields)
    method = api.GemmaFineTuneSpec.model_fields["method"]
    assert (method.annotation, method.default, method.description) == (
        config.TrainConfig.model_fields["method"].annotation,
        config.TrainConfig.model_fields["method"].default,
        config.TrainConfig.model_fields["method"].description,
    )


def test_the_lora_targets_are_the_contracts_modules():
    assert list(api.Lora().target_modules) == list(config.LORA_MODULES) == config.LoraConfig().target_modules
    for shape in PRESETS.values():  # the HBM and merge estimates know every target's shapes
        assert set(shape.projection_shapes()) == set(config.LORA_MODULES)
    with pytest.raises(ValidationError, match="q_proj"):
        api.Lora(target_modules=["qkv_proj"])


def test_the_plan_hands_over_each_block_whole():
    dataset = {
        "uri": "gs://data/t.jsonl",
        "format": "text",
        "maxSeqLen": 512,
        "packing": True,
        "evalFraction": 0.25,
        "skipInvalid": True,
    }
    b = finetune("ft").tpu("v5p", "2x2x1").lora(rank=8, alpha=4.0, dropout=0.1, targetModules=["q_proj", "o_proj"])
    train = plan_finetune("ft", "ns", b.set("dataset", dataset).spec, OperatorSettings()).train
    assert train.lora == config.LoraConfig(rank=8, alpha=4.0, dropout=0.1, target_modules=["q_proj", "o_proj"])
    assert train.dataset == config.DatasetConfig(
        path="gs://data/t.jsonl", format="text", max_seq_len=512, packing=True, eval_fraction=0.25, skip_invalid=True
    )
