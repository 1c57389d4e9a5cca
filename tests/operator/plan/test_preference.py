"""Preference tuning (spec.method dpo or orpo): what the API refuses, what the pods are told, and
what a pair costs in HBM and time against an sft row, in the plan and in `gemma-tpu plan`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gemma_operator import api, cli, crd_validation, evaluation, rollout_gate
from gemma_operator.model_shapes import PRESETS
from gemma_operator.plan import SpecError, plan_finetune
from gemma_operator.settings import OperatorSettings
from gemma_operator.training_method import METHOD_COST
from gemma_workloads.config import PreferenceConfig, TrainConfig
from tests.support.builders import finetune

SETTINGS = OperatorSettings()
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "gemma4-31b-v5p8-dpo.yaml"
G31 = PRESETS["gemma4-31b"]


def pairs(method: str = "dpo", **preference) -> finetune:
    b = finetune("pt").tpu("v5p", "2x2x1").set("method", method).set("dataset.format", "preference")
    return b.set("preference", preference) if preference else b


def refused(b: finetune) -> list[str]:
    with pytest.raises(SpecError) as e:
        plan_finetune(b.name, "ns", b.spec, SETTINGS)
    return e.value.problems


# ---------------------------------------------------------------------------- what the API refuses

REFUSED = [
    (
        pairs().set("dataset.format", "chat"),
        "spec: method dpo trains on dataset.format preference ({prompt, chosen, rejected} rows), not chat",
    ),
    (
        finetune("pt").set("dataset.format", "preference"),
        "spec: dataset.format preference is for method dpo or orpo (method is sft)",
    ),
    (
        finetune("pt").set("preference", {"labelSmoothing": 0.1}),
        "spec: preference is only used with method dpo or orpo (method is sft)",
    ),
    (
        pairs("orpo", beta=0.2),
        "spec: preference.beta is only used with method dpo (method is orpo: its weight is orpoLambda)",
    ),
    (
        pairs("dpo", orpoLambda=0.2),
        "spec: preference.orpoLambda is only used with method orpo (method is dpo: its setting is beta)",
    ),
    (
        pairs().set("dataset.packing", True),
        "spec.dataset.packing: preference pairs are not packed (each answer is its own sequence); set it false",
    ),
]


@pytest.mark.parametrize("b, problem", REFUSED, ids=[p.split(": ", 1)[1][:40] for _, p in REFUSED])
def test_each_mismatch_of_method_data_and_settings_is_refused_naming_the_field(b, problem):
    assert refused(b) == [problem]
    # The schema admits each one: the CRD's CEL rules (tests/operator/cli/test_plan_gate.py) refuse them.
    assert crd_validation.spec_problems("GemmaFineTune", b.spec) == []


@pytest.mark.parametrize(
    "b, problem",
    [
        (pairs(beta=0), "spec.preference.beta: 0 must be greater than 0"),
        (pairs("orpo", orpoLambda=11), "spec.preference.orpoLambda: 11 must be at most 10"),
        (pairs(labelSmoothing=0.5), "spec.preference.labelSmoothing: 0.5 must be less than 0.5"),
        (pairs().set("method", "ppo"), "spec.method: Unsupported value 'ppo': supported values: sft, dpo, orpo"),
    ],
)
def test_the_crd_schema_holds_the_contracts_bounds(b, problem):
    assert crd_validation.spec_problems("GemmaFineTune", b.spec) == [problem]
    assert refused(b)  # and the models refuse them too


def test_no_preference_setting_is_defaulted_by_the_api_server():
    """A default stored by the API server would read as set: beta under orpo, orpoLambda under dpo."""
    gft = crd_validation._spec_schema("GemmaFineTune")
    assert "default" not in gft["properties"]["preference"]
    settings = gft["properties"]["preference"]["properties"]
    assert "default" not in settings["beta"] and "default" not in settings["orpoLambda"]


# ---------------------------------------------------------------------------- what the pods are told


def test_the_training_config_carries_the_method_and_the_contracts_defaults():
    dpo = plan_finetune("pt", "ns", pairs(beta=0.3, labelSmoothing=0.1).spec, SETTINGS).train
    assert (dpo.method, dpo.preference) == ("dpo", PreferenceConfig(beta=0.3, label_smoothing=0.1))
    assert dpo.preference_tuning and dpo.dataset.format == "preference"
    orpo = plan_finetune("pt", "ns", pairs("orpo").spec, SETTINGS).train
    assert (orpo.method, orpo.preference) == ("orpo", PreferenceConfig())
    sft = plan_finetune("pt", "ns", finetune("pt").spec, SETTINGS).train
    assert (sft.method, sft.preference_tuning) == ("sft", False)
    for train in (dpo, orpo, sft):  # what the pod reads back is what was planned
        assert TrainConfig.model_validate_json(train.model_dump_json()) == train


def test_the_method_and_its_settings_make_a_new_run_and_sft_runs_keep_their_ids():
    def run(b: finetune) -> str:
        return plan_finetune(b.name, "ns", b.spec, SETTINGS).run

    runs = {run(pairs()), run(pairs(beta=0.3)), run(pairs("orpo")), run(finetune("pt").tpu("v5p", "2x2x1"))}
    assert len(runs) == 4
    assert run(finetune("pt").set("method", "sft")) == run(finetune("pt")), "an sft spec's run id is unchanged"


# ---------------------------------------------------------------------------- HBM and time


def test_the_time_estimate_counts_both_sequences_and_dpos_reference_forward():
    sft = plan_finetune("pt", "ns", finetune("pt").tpu("v5p", "2x2x1").spec, SETTINGS).estimate
    orpo = plan_finetune("pt", "ns", pairs("orpo").spec, SETTINGS).estimate
    dpo = plan_finetune("pt", "ns", pairs("dpo").spec, SETTINGS).estimate
    assert orpo.tokens == dpo.tokens == 2 * sft.tokens
    # Training is 6N FLOPs a token; the reference's forward pass alone 2N.
    assert orpo.hours / sft.hours == pytest.approx(2 * 6 / 6)
    assert dpo.hours / sft.hours == pytest.approx(2 * (6 + 2) / 6)
    assert dpo.cost / dpo.chip_hours == sft.cost / sft.chip_hours
    assert METHOD_COST["dpo"].flops_per_token(G31) == pytest.approx(8 * G31.params)


def test_the_evaluation_scores_both_sequences_of_a_pair():
    def scored(b: finetune) -> int:
        b = b.set("evaluation", {"uri": "gs://data/eval.jsonl", "maxRows": 100, "maxNewTokens": 32})
        return plan_finetune(b.name, "ns", b.spec, SETTINGS).evaluation.tokens

    seq = 2048  # the builder's maxSeqLen; the baseline doubles every figure
    assert scored(finetune("pt")) == 100 * (seq + 32) * 2
    assert scored(pairs("dpo")) == scored(pairs("orpo")) == 100 * (2 * seq + 32) * 2


def test_gemma_tpu_plan_shows_more_hbm_and_hours_for_the_dpo_example_than_for_it_as_sft(tmp_path, capsys):
    dpo = yaml.safe_load(EXAMPLE.read_text())
    orpo = json.loads(json.dumps(dpo))
    orpo["metadata"]["name"], orpo["spec"]["method"], orpo["spec"]["preference"] = "as-orpo", "orpo", {}
    sft = json.loads(json.dumps(dpo))
    sft["metadata"]["name"], sft["spec"]["method"] = "as-sft", "sft"
    del sft["spec"]["preference"]
    sft["spec"]["dataset"]["format"] = "prompt-completion"
    (tmp_path / "three.yaml").write_text(yaml.safe_dump_all([dpo, orpo, sft]))
    assert cli.main_exit(["plan", "-o", "json", "-f", str(tmp_path / "three.yaml")]) == 0
    by_name = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    d, o, s = by_name[dpo["metadata"]["name"]], by_name["as-orpo"], by_name["as-sft"]
    assert s["hbmPerChip"]["neededGiB"] < o["hbmPerChip"]["neededGiB"] < d["hbmPerChip"]["neededGiB"]
    assert s["estimate"]["hours"] < o["estimate"]["hours"] < d["estimate"]["hours"]
    assert d["method"]["referenceForward"] and d["method"]["preference"]["beta"] == 0.1
    assert s["method"] == {
        "name": "sft",
        "preference": None,
        "sequencesPerRow": 1,
        "referenceForward": False,
        "flopsPerTokenPerParam": 6.0,
    }

    assert cli.main_exit(["plan", "-f", str(EXAMPLE)]) == 0
    lines = capsys.readouterr().out.splitlines()
    method = next(x for x in lines if x.strip().startswith("method:"))
    assert "dpo (beta 0.1, label smoothing 0): 8 pairs a step, 2 sequences each" in method and "8N FLOPs" in method
    assert any("micro-batch 1 pair (2 sequences), gradient accumulation 8" in x for x in lines)
    assert any("reference" in x for x in lines if x.strip().startswith("HBM per chip:"))


# ---------------------------------------------------------------------------- figures and the gate


def test_a_preference_runs_headline_is_its_preference_accuracy_and_the_gate_reads_both_figures():
    figures = [
        {"name": "evalLoss", "value": 0.9, "baseline": 1.1, "rows": 200},
        {"name": "preferenceAccuracy", "value": 0.74, "baseline": 0.52, "rows": 200},
        {"name": "rewardMargin", "value": 1.6, "baseline": 0.1, "rows": 200},
    ]
    assert evaluation.summary(figures) == "preferenceAccuracy 0.74 (base 0.52)"
    assert evaluation.summary(figures[:1]) == "evalLoss 0.9 (base 1.1)"
    run = {"run": "r1", "merged": "gs://o/r1/merged", "evaluation": figures}
    gate = [
        api.GateCondition(metric="preferenceAccuracy", min=0.7, baseline="better"),
        api.GateCondition(metric="rewardMargin", min=1.0),
    ]
    assert rollout_gate.check(gate, run).passed
    worse = {**run, "evaluation": [{**figures[1], "value": 0.5}, figures[2]]}
    assert rollout_gate.check(gate, worse).message == "run r1: preferenceAccuracy 0.5 is below the minimum 0.7"
