"""The rollout gate's decisions, as a table: metric x threshold x what is served before."""

from typing import get_args

import pytest

from gemma_operator import api, plan_text, rollout_gate
from gemma_operator.plan import SpecError, parse, plan_serve
from gemma_operator.rollout_gate import Action
from gemma_operator.settings import OperatorSettings
from gemma_workloads.config import EVAL_METRICS, LOWER_IS_BETTER
from tests.support.builders import serve


def run(rid: str, **figures: tuple[float, float | None]) -> dict:
    """A status.runs entry: metric=(value, baseline)."""
    return {
        "run": rid,
        "merged": f"gs://out/runs/{rid}/merged",
        "evaluation": [
            {"name": k, "value": v, "rows": 40, **({"baseline": b} if b is not None else {})}
            for k, (v, b) in figures.items()
        ],
    }


def gate(*conditions: dict) -> list[api.GateCondition]:
    return [api.GateCondition.model_validate(c) for c in conditions]


OLDER = run("r1", evalLoss=(1.5, 1.8), perplexity=(4.48, 6.05), exactMatch=(0.7, 0.2))  # passes every gate below

# Previous state -> (runs newest first but for the newest, the output served now, the pin).
STATES = {
    "nothing served yet": ([], None, None),
    "older passing output served": ([OLDER], OLDER["merged"], None),
    "pinned to the newest run": ([OLDER], OLDER["merged"], "r2"),
    "pinned to the older run": ([OLDER], "gs://out/runs/r2/merged", "r1"),
}
LOSS_BETTER = {"metric": "evalLoss", "baseline": "better"}
LOSS_NO_WORSE = {"metric": "evalLoss", "baseline": "noWorse"}
LOSS_MAX = {"metric": "evalLoss", "max": 1.6}
PPL_MAX = {"metric": "perplexity", "max": 5.0}
EXACT_MIN = {"metric": "exactMatch", "min": 0.6}
EXACT_BETTER = {"metric": "exactMatch", "baseline": "better"}

# gate, the newest run's figures, whether that run passes, and the verdict's reason and words.
CANDIDATES = [
    (LOSS_BETTER, {"evalLoss": (1.2, 1.8)}, True, "Passed", "evalLoss 1.2 (base 1.8)"),
    (
        LOSS_BETTER,
        {"evalLoss": (2.1, 1.8)},
        False,
        "MetricFailed",
        "evalLoss 2.1 is not better than the base model's 1.8",
    ),
    (LOSS_BETTER, {"evalLoss": (1.8, 1.8)}, False, "MetricFailed", "is not better than"),  # strict
    (LOSS_NO_WORSE, {"evalLoss": (1.8, 1.8)}, True, "Passed", "evalLoss 1.8"),  # inclusive
    (
        LOSS_NO_WORSE,
        {"evalLoss": (1.81, 1.8)},
        False,
        "MetricFailed",
        "evalLoss 1.81 is worse than the base model's 1.8",
    ),
    (LOSS_BETTER, {"evalLoss": (1.2, None)}, False, "MetricMissing", "evalLoss has no base model figure"),
    (LOSS_MAX, {"evalLoss": (1.6, 1.8)}, True, "Passed", "evalLoss 1.6"),  # inclusive
    (LOSS_MAX, {"evalLoss": (1.61, 1.8)}, False, "MetricFailed", "evalLoss 1.61 is above the maximum 1.6"),
    (PPL_MAX, {"perplexity": (6.0, 6.05)}, False, "MetricFailed", "perplexity 6 is above the maximum 5"),
    (EXACT_MIN, {"exactMatch": (0.6, 0.1)}, True, "Passed", "exactMatch 0.6"),  # inclusive
    (EXACT_MIN, {"exactMatch": (0.55, 0.1)}, False, "MetricFailed", "exactMatch 0.55 is below the minimum 0.6"),
    (EXACT_MIN, {"evalLoss": (1.2, 1.8)}, False, "MetricMissing", "did not produce exactMatch (it reported evalLoss)"),
    (EXACT_BETTER, {"exactMatch": (0.3, 0.2)}, True, "Passed", "exactMatch 0.3 (base 0.2)"),  # higher is better
    (
        EXACT_BETTER,
        {"exactMatch": (0.2, 0.2)},
        False,
        "MetricFailed",
        "exactMatch 0.2 is not better than the base model's 0.2",
    ),
]

# (state, the newest run passes) -> (action, the run served afterwards: None for nothing).
EXPECTED = {
    ("nothing served yet", True): (Action.ROLL_OUT, "r2"),
    ("nothing served yet", False): (Action.WAIT, None),
    ("older passing output served", True): (Action.ROLL_OUT, "r2"),
    ("older passing output served", False): (Action.ROLL_OUT, "r1"),  # the older output stays
    ("pinned to the newest run", True): (Action.ROLL_OUT, "r2"),
    ("pinned to the newest run", False): (Action.KEEP, "r1"),  # a pinned run is held to the gate too
    ("pinned to the older run", True): (Action.ROLL_OUT, "r1"),  # the rollback
    ("pinned to the older run", False): (Action.ROLL_OUT, "r1"),
}


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize(("condition", "figures", "passes", "reason", "words"), CANDIDATES)
def test_gate_decisions(condition, figures, passes, reason, words, state):
    older, served, pin = STATES[state]
    newest = run("r2", **figures)
    sel = rollout_gate.select(gate(condition), [newest, *older], served, pin)
    action, served_run = EXPECTED[(state, passes)]
    assert sel.action is action
    assert sel.run == served_run
    assert sel.model_uri == (f"gs://out/runs/{served_run}/merged" if served_run else None)
    assert sel.passed == [r for r, ok in (("r2", passes), *(("r1", True) for _ in older)) if ok]
    judged = sel.verdict  # the newest run's, or the pinned run's
    if pin == "r1":
        assert judged.passed and judged.reason == "Passed"
    else:
        assert (judged.passed, judged.reason) == (passes, reason)
        assert words in judged.message and "run r2" in judged.message


def test_without_a_gate_every_new_output_rolls_out_evaluated_or_not():
    bare = {"run": "r2", "merged": "gs://out/runs/r2/merged"}  # no evaluation at all
    sel = rollout_gate.select([], [bare, OLDER], OLDER["merged"], None)
    assert (sel.action, sel.run, sel.verdict.passed, sel.passed) == (Action.ROLL_OUT, "r2", True, ["r2", "r1"])


def test_a_run_without_evaluation_is_blocked_by_a_gate():
    bare = {"run": "r2", "merged": "gs://out/runs/r2/merged"}
    sel = rollout_gate.select(gate(LOSS_BETTER), [bare], None, None)
    assert sel.action is Action.WAIT and sel.verdict.reason == "NotEvaluated"
    assert sel.verdict.message == "run r2 has no evaluation (set spec.evaluation on the GemmaFineTune)"


def test_every_condition_must_hold_and_the_first_failure_is_named():
    r2 = run("r2", evalLoss=(1.2, 1.8), exactMatch=(0.5, 0.1))
    sel = rollout_gate.select(gate(LOSS_BETTER, EXACT_MIN), [r2], None, None)
    assert not sel.verdict.passed and sel.verdict.message == "run r2: exactMatch 0.5 is below the minimum 0.6"
    one_bound_of_two = gate({"metric": "exactMatch", "min": 0.4, "baseline": "better"})
    assert rollout_gate.check(one_bound_of_two, run("r3", exactMatch=(0.5, 0.6))).message == (
        "run r3: exactMatch 0.5 is not better than the base model's 0.6"
    )


@pytest.mark.parametrize(("served", "action"), [(None, Action.WAIT), (OLDER["merged"], Action.KEEP)])
def test_a_pin_to_an_unknown_run_keeps_what_is_served(served, action):
    sel = rollout_gate.select([], [OLDER], served, "deadbeef")
    assert sel.action is action and sel.model_uri == served
    assert sel.pin_missing == "run deadbeef is not one of the fine-tune's runs with a merged output (r1)"


def test_an_output_served_from_elsewhere_is_kept_while_no_run_qualifies():
    # e.g. the fine-tune was deleted (no runs), or no run passes a gate added later.
    assert rollout_gate.select(gate(LOSS_BETTER), [], "gs://old/merged", None).action is Action.KEEP
    failing = run("r2", evalLoss=(2.0, 1.8))
    sel = rollout_gate.select(gate(LOSS_BETTER), [failing], "gs://old/merged", None)
    assert (sel.action, sel.model_uri, sel.run) == (Action.KEEP, "gs://old/merged", None)


def test_the_api_knows_the_workload_metrics_and_their_direction():
    assert set(get_args(api.EvalMetric)) == set(EVAL_METRICS)
    for metric in EVAL_METRICS:  # the table covers both directions for every metric
        assert (LOWER_IS_BETTER.__contains__(metric), "better") in rollout_gate.BASELINE


@pytest.mark.parametrize(
    ("rollout", "problem"),
    [
        (
            {"gate": [{"metric": "bleu", "min": 1}]},
            "spec.rollout.gate.0.metric: Input should be 'evalLoss', 'perplexity', 'exactMatch', 'contains', "
            "'regexMatch', 'preferenceAccuracy' or 'rewardMargin'",
        ),
        ({"gate": [{"metric": "evalLoss"}]}, "spec.rollout.gate.0: gate on evalLoss: set min, max or baseline"),
        ({"gate": [{"metric": "exactMatch", "min": 0.8, "max": 0.5}]}, "min 0.8 is above max 0.5: nothing could pass"),
        (
            {"gate": [{"metric": "evalLoss", "min": 1.0}]},
            "spec.rollout.gate.0.min: evalLoss is better lower, so bound it with max (or baseline), not min",
        ),
        (
            {"gate": [{"metric": "contains", "max": 0.9}]},
            "spec.rollout.gate.0.max: contains is better higher, so bound it with min (or baseline), not max",
        ),
    ],
)
def test_bad_gates_are_refused_naming_the_field(rollout, problem):
    spec = serve("chat").fine_tune("ft").set("rollout", rollout).spec
    with pytest.raises(SpecError) as e:
        plan_serve("chat", "default", spec, OperatorSettings(), model_uri="gs://out/m")
    assert any(problem in p for p in e.value.problems), e.value.problems


def test_a_gate_or_a_pin_needs_a_fine_tune():
    with pytest.raises(SpecError) as e:
        parse(api.GemmaServeSpec, serve("chat").set("rollout", {"gate": [LOSS_BETTER]}).spec)
    assert e.value.problems == [
        "spec: rollout.gate is only used with model.fineTuneRef: evaluations come from a fine-tune's runs"
    ]
    with pytest.raises(SpecError) as e:
        parse(api.GemmaServeSpec, serve("chat").set("model", {"fineTuneRef": {"name": "ft", "run": "HEAD~1"}}).spec)
    assert e.value.problems[0].startswith("spec.model.fineTuneRef.run: 'HEAD~1'")


def test_plan_shows_the_gate_in_words():
    spec = (
        serve("chat")
        .fine_tune("ft")
        .set("rollout", {"gate": [LOSS_BETTER, EXACT_MIN, {"metric": "contains", "min": 0.5, "baseline": "noWorse"}]})
        .spec
    )
    p = plan_serve("chat", "default", spec, OperatorSettings(), model_uri="gs://out/m")
    assert (
        "  rollout gate:  evalLoss better than the base model, exactMatch >= 0.6, "
        "contains >= 0.5 and no worse than the base model"
    ) in plan_text.as_text(p).splitlines()
    assert plan_text.as_dict(p)["rolloutGate"][1] == {"metric": "exactMatch", "min": 0.6}
    bare = plan_serve("chat", "default", serve("chat").fine_tune("ft").spec, OperatorSettings(), model_uri="gs://out/m")
    assert "  rollout gate:  none (every new output rolls out)" in plan_text.as_text(bare).splitlines()
