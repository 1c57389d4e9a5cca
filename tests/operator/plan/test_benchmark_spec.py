"""Bad benchmark input is refused before anything runs, naming the field and the allowed range:
by the CRD schema (the API server's admission), by its CEL rules (the models' validators), and by
the plan for the cluster's own limit (an operator setting)."""

from __future__ import annotations

import pytest

from gemma_operator import crd_validation
from gemma_operator.plan import SpecError, plan_serve
from gemma_operator.settings import OperatorSettings
from tests.support.builders import serve

SETTINGS = OperatorSettings()


def _bench(**fields) -> dict:
    return serve("s").fine_tune("ft").set("benchmark", fields).spec


def _refusal(spec: dict, settings: OperatorSettings = SETTINGS) -> str:
    with pytest.raises(SpecError) as e:
        plan_serve("s", "ns", spec, settings, model_uri="gs://o/m")
    return "; ".join(e.value.problems)


@pytest.mark.parametrize(
    "slo, field",
    [
        ({"ttftP99Ms": 0}, "ttftP99Ms"),
        ({"tpotP99Ms": -5}, "tpotP99Ms"),
        ({"itlP99Ms": 0}, "itlP99Ms"),
        ({"minOutputTokensPerSecond": 0}, "minOutputTokensPerSecond"),
    ],
)
def test_an_slo_that_is_not_positive_is_refused_at_admission(slo, field):
    spec = _bench(slo=slo)
    # The schema's exclusiveMinimum, as the API server reports it (crd_validation mirrors its wording).
    [problem] = crd_validation.spec_problems("GemmaServe", spec)
    assert problem.startswith(f"spec.benchmark.slo.{field}: ") and "must be greater than 0" in problem
    assert field in _refusal(spec)


def test_prompts_longer_than_max_model_len_are_refused_with_both_numbers():
    message = _refusal(_bench(inputLen=2000, outputLen=200) | {"vllm": {"maxModelLen": 2048}})
    assert "benchmark.inputLen + benchmark.outputLen is 2200" in message and "maxModelLen (2048)" in message
    assert plan_serve("s", "ns", _bench(inputLen=1848, outputLen=200) | {"vllm": {"maxModelLen": 2048}}, SETTINGS)


def test_a_benchmark_longer_than_the_schema_allows_is_refused_at_admission():
    [problem] = crd_validation.spec_problems("GemmaServe", _bench(timeoutSeconds=7200))
    assert problem == "spec.benchmark.timeoutSeconds: 7200 must be at most 3600"


def test_a_benchmark_longer_than_the_clusters_limit_is_refused_with_the_range():
    settings = OperatorSettings(benchmark_max_seconds=300)
    message = _refusal(_bench(timeoutSeconds=600), settings)
    assert message == (
        "spec.benchmark.timeoutSeconds: 600 is above this cluster's limit: 30 to 300 seconds "
        "(operator setting benchmark_max_seconds)"
    )
    assert plan_serve("s", "ns", _bench(timeoutSeconds=300), settings, model_uri="gs://o/m")


def test_the_benchmark_and_its_slo_replace_no_pod():
    plain = plan_serve("s", "ns", serve("s").fine_tune("ft").spec, SETTINGS, model_uri="gs://o/m")
    measured = plan_serve("s", "ns", _bench(slo={"ttftP99Ms": 200}), SETTINGS, model_uri="gs://o/m")
    assert plain.revision == measured.revision


def test_a_prompts_file_the_pods_cannot_reach_is_refused():
    spec = _bench(promptsUri="/elsewhere/eval.jsonl") | {"storage": {"persistentVolumeClaim": "data"}}
    assert (
        _refusal(spec) == "spec.benchmark.promptsUri: /elsewhere/eval.jsonl is not under spec.storage.mountPath /data"
    )


def test_a_duration_at_a_request_rate_sets_the_requests():
    plan = plan_serve("s", "ns", _bench(requestRate=2.5, durationSeconds=61), SETTINGS, model_uri="gs://o/m")
    assert plan.spec.benchmark.requests == 153  # ceil(2.5 x 61)
    assert "requestRate" in _refusal(_bench(durationSeconds=60)), "a duration without a rate is refused"
