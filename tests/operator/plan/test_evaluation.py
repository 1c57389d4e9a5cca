"""spec.evaluation: its checks, what the training pod is told, its cost in the plan, and how its
figures reach the GemmaFineTune's status (status.evaluation, status.runs, Events)."""

import datetime
import json
import math

import pytest

from gemma_operator import evaluation, plan_text
from gemma_operator.children import merge_objects, training_objects
from gemma_operator.lifecycle import finetune as finetune_lifecycle
from gemma_operator.plan import SpecError, digest, plan_finetune
from gemma_operator.settings import OperatorSettings
from gemma_workloads.config import MetricResult, TrainConfig
from tests.support.builders import finetune

SETTINGS = OperatorSettings()
T0 = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
COMPLETE = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True", "reason": "CompletionsReached"}]}


def plan(b):
    return plan_finetune(b.name, "ns", b.spec, SETTINGS)


def held_out(**evaluation_spec) -> finetune:
    return finetune("ev").tpu("v5p").set("dataset.evalFraction", 0.05).set("evaluation", evaluation_spec)


@pytest.mark.parametrize(
    ("b", "problem"),
    [
        (
            finetune("ev").tpu("v5p").set("evaluation", {}),
            "spec: evaluation has no rows: set spec.evaluation.uri (an eval JSONL) or spec.dataset.evalFraction above 0 "
            "(a held-out split)",
        ),
        (
            held_out(maxNewTokens=2048),
            "spec.evaluation.maxNewTokens: 2048 leaves no room for a prompt within dataset.maxSeqLen 2048",
        ),
        (
            finetune("ev").tpu("v5p").set("evaluation", {"uri": "/data/eval.jsonl"}),
            "spec.evaluation.uri: /data/eval.jsonl is a local path; set spec.storage.persistentVolumeClaim",
        ),
        (held_out(maxRows=0), "spec.evaluation.maxRows: Input should be greater than or equal to 1"),
        (held_out(rows=5), "spec.evaluation.rows: unknown field"),
    ],
)
def test_bad_evaluations_are_refused_naming_the_fields(b, problem):
    with pytest.raises(SpecError) as e:
        plan(b)
    assert any(p.startswith(problem) for p in e.value.problems), e.value.problems


def test_the_training_config_carries_the_evaluation():
    p = plan(
        finetune("ev").tpu("v5p").set("evaluation", {"uri": "gs://data/eval.jsonl", "maxRows": 50, "baseline": False})
    )
    config_map = training_objects(p, SETTINGS)[0]
    train = TrainConfig.model_validate_json(next(iter(config_map["data"].values())))
    assert train.evaluation.model_dump() == {
        "path": "gs://data/eval.jsonl",
        "max_rows": 50,
        "max_new_tokens": 64,
        "baseline": False,
    }
    held = plan(held_out()).train
    assert held.evaluation.path is None and held.dataset.eval_fraction == 0.05
    assert plan(finetune("ev").tpu("v5p")).train.evaluation is None


def test_the_evaluation_is_part_of_the_run():
    without = plan(finetune("ev").tpu("v5p").set("dataset.evalFraction", 0.05))
    with_ = plan(held_out())
    assert with_.run != without.run and plan(held_out(maxRows=10)).run != with_.run
    # Runs without an evaluation keep the id they had before evaluations (and the compile settings) existed.
    b = finetune("ev").tpu("v5p")
    inputs = plan(b).spec.model_dump(mode="json", include={"model", "dataset", "lora", "training"})
    del inputs["training"]["compilation_cache"], inputs["training"]["scan_layers"]
    assert plan(b).run == digest(inputs)


def test_plan_shows_the_evaluation_cost_in_the_training_cost_model():
    b = held_out(maxRows=256, maxNewTokens=64)
    p, alone = plan(b), plan(held_out(maxRows=256, maxNewTokens=64, baseline=False))
    seq = 2048
    assert p.evaluation.tokens == 256 * (seq + 64) * 2 and alone.evaluation.tokens == 256 * (seq + 64)
    assert p.evaluation.chip_hours == pytest.approx(2 * alone.evaluation.chip_hours)
    # Same slice, MFU and price as training: forward only is 2 of training's 6 FLOPs per parameter per token.
    ratio = (p.evaluation.tokens * 2) / (p.estimate.tokens * 6)
    assert p.evaluation.chip_hours / p.estimate.chip_hours == pytest.approx(ratio)
    assert p.evaluation.cost == pytest.approx(p.evaluation.chip_hours * p.price_per_chip_hour)
    line = next(x for x in plan_text.as_text(p).splitlines() if x.strip().startswith("evaluation:"))
    assert f"256 x ({seq}-token forward + 64 greedy steps) x 2 = 1.08 M tokens" in line
    assert f"${p.evaluation.cost:.2f}" in line and "fine-tune and base model" in line
    assert plan_text.as_dict(p)["evaluation"]["estimate"]["models"] == 2
    on_cpu = plan(finetune("ev").cpu_tiny().set("dataset.evalFraction", 0.1).set("evaluation", {"maxNewTokens": 16}))
    assert on_cpu.evaluation is None and "cost unknown" in plan_text.as_text(on_cpu)


# ---------------------------------------------------------------------------- into the status


def _pod(container: str, message: str) -> dict:
    return {
        "metadata": {"name": "p", "creationTimestamp": "2026-01-01T12:00:00Z"},
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [{"name": container, "state": {"terminated": {"exitCode": 0, "message": message}}}],
        },
    }


def _decide(p, status, **children):
    view = finetune_lifecycle.FineTuneView(
        name="ev", namespace="ns", generation=1, status=status, problems=[], owner=None, now=T0, plan=p, **children
    )
    return finetune_lifecycle.decide(view, SETTINGS)


def _trained_and_merged(p, figures: list[dict]):
    job, merge_job = training_objects(p, SETTINGS)[1], merge_objects(p, SETTINGS)[1]
    trained = json.dumps({"status": "succeeded", "step": 100, "checkpoint": "gs://c", "evaluation": figures})
    trained = trained.replace('"NaN"', "NaN").replace('"null"', "null")  # a figure as a pod would write it
    pending = _decide(p, {}).status
    merging = _decide(p, pending, training={**job, "status": COMPLETE}, training_pods=[_pod("trainer", trained)])
    merged = json.dumps({"status": "succeeded", "output": p.merged_dir})
    done = _decide(p, merging.status, merge={**merge_job, "status": COMPLETE}, merge_pods=[_pod("merge", merged)])
    return merging, done


def test_figures_reach_status_an_event_and_the_runs_list():
    p = plan(held_out())
    figures = [
        {"name": "evalLoss", "value": 1.234567, "baseline": 1.8, "rows": 40},
        {"name": "perplexity", "value": math.exp(1.234567), "baseline": math.exp(1.8), "rows": 40},
    ]
    merging, done = _trained_and_merged(p, figures)
    assert merging.status["evaluation"] == {"run": p.run, "metrics": figures, "summary": "evalLoss 1.235 (base 1.8)"}
    assert (
        "Normal",
        "Evaluated",
        f"run {p.run}: evalLoss 1.235 (base 1.8), perplexity 3.437 (base 6.05) on 40 rows",
    ) in merging.events
    assert "runs" not in merging.status  # not before its merged output exists
    assert done.status["phase"] == "Succeeded"
    assert done.status["runs"] == [
        {"run": p.run, "merged": p.merged_dir, "completionTime": "2026-01-01T12:00:00Z", "evaluation": figures}
    ]
    again = _decide(p, done.status)
    assert again.status["runs"] == done.status["runs"]


@pytest.mark.parametrize("written", ["NaN", "null"])  # json.dumps writes NaN; pydantic's model_dump_json writes null
def test_a_figure_that_is_not_finite_is_left_out_loudly(written):
    p = plan(held_out())
    nan = [{"name": "evalLoss", "value": written, "baseline": 1.8, "rows": 40}]
    merging, done = _trained_and_merged(p, nan)
    assert merging.status["outputs"] == {"checkpoint": "gs://c", "step": 100}, "the rest of the result is kept"
    assert merging.status["evaluation"] == {"run": p.run, "metrics": []}
    assert (
        "Warning",
        "EvaluationNotFinite",
        f"run {p.run}: figures that are not finite, left out: evalLoss nan (base 1.8)",
    ) in merging.events
    assert done.status["runs"][0]["evaluation"] == []  # evaluated, nothing usable: a gate on evalLoss blocks


def test_an_evaluation_asked_for_but_missing_is_reported():
    p = plan(held_out())
    job = training_objects(p, SETTINGS)[1]
    trained = json.dumps({"status": "succeeded", "step": 100, "checkpoint": "gs://c"})
    merging = _decide(
        p, _decide(p, {}).status, training={**job, "status": COMPLETE}, training_pods=[_pod("trainer", trained)]
    )
    assert (
        "Warning",
        "NoEvaluation",
        f"run {p.run}: spec.evaluation is set but the training result has no figures",
    ) in merging.events


def test_runs_are_newest_first_and_bounded():
    runs: list[dict] = []
    for i in range(evaluation.MAX_RUNS + 3):
        runs = evaluation.record_run(runs, f"r{i}", f"gs://o/r{i}", "t", None)
    assert len(runs) == evaluation.MAX_RUNS and runs[0]["run"] == f"r{evaluation.MAX_RUNS + 2}"
    runs = evaluation.record_run(runs, "r5", "gs://o/r5/merged-2", "t2", None)  # merged again: moves to the front
    assert (
        runs[0] == {"run": "r5", "merged": "gs://o/r5/merged-2", "completionTime": "t2"}
        and len(runs) == evaluation.MAX_RUNS
    )
    # A status written before status.runs existed still offers its one merged output.
    old = {"phase": "Succeeded", "run": "abc", "outputs": {"merged": "gs://o/m"}}
    assert evaluation.runs_of(old) == [{"run": "abc", "merged": "gs://o/m"}]


def test_figures_from_the_workload_contract():
    kept, dropped = evaluation.figures([MetricResult(name="exactMatch", value=0.5, rows=10)])
    assert kept == [{"name": "exactMatch", "value": 0.5, "rows": 10}] and dropped == []
    assert evaluation.summary(kept) == "exactMatch 0.5"  # no evalLoss: the first figure is the headline
