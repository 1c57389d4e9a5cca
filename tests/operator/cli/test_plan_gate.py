"""`gemma-tpu plan` and `render` as a GitOps CI gate: they read a whole application folder or a
`kustomize build` stream, refuse exactly what the API server and the pods' pre-flight would refuse,
and say what a service costs."""

from __future__ import annotations

import io
import json

import jsonschema
import pytest
import yaml

from gemma_operator import api, cli, crd, crd_validation
from gemma_operator.plan import SpecError, plan_finetune, plan_serve
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune, serve
from tests.support.validation import validate_cr

SERVICE_ACCOUNT = {
    "apiVersion": "v1",
    "kind": "ServiceAccount",
    "metadata": {"name": "gemma-trainer", "namespace": "ml"},
}
SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf", "namespace": "ml"}, "stringData": {"t": "x"}}
KUSTOMIZATION = {
    "apiVersion": "kustomize.config.k8s.io/v1beta1",
    "kind": "Kustomization",
    "resources": ["service-account.yaml", "gemma.yaml"],
}
SKIPPED = [
    "skipped kustomize.config.k8s.io/v1beta1 Kustomization (no name): not a gemma-tpu.dev object",
    "skipped v1 ServiceAccount ml/gemma-trainer: not a gemma-tpu.dev object",
    "skipped v1 Secret ml/hf: not a gemma-tpu.dev object",
]


def _app(tmp_path, *gemma_objects) -> str:
    """A kustomize-style application folder: a Kustomization, other kinds, and the Gemma objects."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(KUSTOMIZATION))
    (tmp_path / "service-account.yaml").write_text(yaml.safe_dump_all([SERVICE_ACCOUNT, SECRET]))
    (tmp_path / "gemma.yaml").write_text(yaml.safe_dump_all(list(gemma_objects)))
    return str(tmp_path)


def _ft(name: str = "ft"):
    return finetune(name, "ml").set("model", {"hfRepo": "google/gemma-4-31B-it", "hfTokenSecretRef": {"name": "hf"}})


def test_a_folder_with_other_kinds_plans_the_gemma_objects(tmp_path, capsys):
    folder = _app(tmp_path, _ft().obj(), serve("sv", "ml").fine_tune("ft").obj())
    assert cli.main_exit(["plan", "-f", folder]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == SKIPPED
    assert "GemmaFineTune ft (namespace ml)" in out and "GemmaServe sv (namespace ml)" in out


@pytest.mark.parametrize("command", ["plan", "render"])
def test_a_kustomize_build_stream_on_stdin(capsys, monkeypatch, command):
    stream = yaml.safe_dump_all([KUSTOMIZATION, SERVICE_ACCOUNT, SECRET, _ft().obj()])
    monkeypatch.setattr("sys.stdin", io.StringIO(stream))
    assert cli.main_exit([command, "-f", "-"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == SKIPPED
    if command == "render":
        assert [o["kind"] for o in yaml.safe_load_all(out)] == ["ConfigMap", "Job"]


def test_a_kubectl_list_is_read_item_by_item(tmp_path, capsys):
    path = tmp_path / "list.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [SERVICE_ACCOUNT, _ft().obj()]}))
    assert cli.main_exit(["plan", "-f", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [SKIPPED[1]] and "GemmaFineTune ft" in out


def test_a_fine_tune_in_another_file_is_planned_unknown(tmp_path, capsys):
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(serve("sv", "ml").fine_tune("elsewhere").obj()))
    assert cli.main_exit(["plan", "-f", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "  model:         the merged output of GemmaFineTune elsewhere (unknown until it succeeds) served as 'sv'"
        in out
    )
    assert (
        "  warning:       spec.model.fineTuneRef: GemmaFineTune 'elsewhere' is not in the input, so its output is "
        "unknown: planned without it (the model served is known once that fine-tune succeeds; the HBM fit is "
        "checked only with spec.model.preset)"
    ) in out.splitlines()
    # What is wrong still fails the gate.
    path.write_text(yaml.safe_dump(serve("sv", "ml").fine_tune("elsewhere").tpu("v6e", "3x3").obj()))
    assert cli.main_exit(["plan", "-f", str(path)]) == 2
    assert capsys.readouterr().err.startswith("GemmaServe/sv: spec.tpu.topology: v6e has no topology '3x3'")


# ---------------------------------------------------------------------------- the CRD schema, as the API server


def _plan_cli(tmp_path, capsys, text: str) -> tuple[int, list[str]]:
    path = tmp_path / "cr.yaml"
    path.write_text(text)
    code = cli.main_exit(["plan", "-o", "json", "-f", str(path)])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else err.splitlines())


FT_YAML = """apiVersion: gemma-tpu.dev/v1alpha1
kind: GemmaFineTune
metadata: {{name: ft}}
spec:
  model: {{uri: gs://models/gemma-4-31B-it, preset: gemma4-31b}}
  dataset: {{uri: gs://data/train.jsonl}}
  output: {{uri: gs://out/ft}}
  training: {{steps: 100, learningRate: {lr}}}
"""


def test_a_number_written_as_a_string_is_refused_as_the_api_server_refuses_it(tmp_path, capsys):
    # The CRD says type: number; the API server refuses a JSON string there (apiextensions' schema
    # validation), so a GitOps sync fails on it. The models alone would read it as 0.0002.
    code, lines = _plan_cli(tmp_path, capsys, FT_YAML.format(lr="'2e-4'"))
    assert (code, lines) == (
        2,
        ["GemmaFineTune/ft: spec.training.learningRate: '2e-4' is of type string, the CRD's schema says number"],
    )
    # Unquoted, YAML 1.2 (what kubectl reads) makes it a number, where PyYAML's YAML 1.1 makes it a string.
    code, [p] = _plan_cli(tmp_path, capsys, FT_YAML.format(lr="2e-4"))
    assert code == 0 and p["name"] == "ft"


BAD_FOR_THE_API_SERVER = [
    (finetune("b").training(steps=1.5), "spec.training.steps: 1.5 is of type number, the CRD's schema says integer"),
    (finetune("b").training(steps=True), "spec.training.steps: True is of type boolean, the CRD's schema says integer"),
    (
        finetune("b").training(lrSchedule="step"),
        "spec.training.lrSchedule: Unsupported value 'step': supported values: cosine, linear, constant",
    ),
    (finetune("b").set("output", {}), "spec.output.uri: Required value"),
    (finetune("b").set("dataset.evalFraction", 0.9), "spec.dataset.evalFraction: 0.9 must be at most 0.5"),
    (finetune("b").set("lora", {"alpha": 0}), "spec.lora.alpha: 0 must be greater than 0"),
    (
        finetune("b").lora(targetModules=[*api.config.LORA_MODULES, "q_proj"]),
        "spec.lora.targetModules: 8 items, at most 7 allowed",
    ),
    (
        finetune("b").set("serviceAccountName", "a" * 254),
        "spec.serviceAccountName: 254 characters, at most 253 allowed",
    ),
    (finetune("b").set("trainng", {}), "spec.trainng: unknown field"),
    (
        serve("s").set("vllm", {"extraArgs": "--enforce-eager"}),
        "spec.vllm.extraArgs: '--enforce-eager' is of type string, the CRD's schema says array",
    ),
    (serve("s").set("replicas", "2"), "spec.replicas: '2' is of type string, the CRD's schema says integer"),
]


@pytest.mark.parametrize(
    "builder,message", BAD_FOR_THE_API_SERVER, ids=[m.split(":")[0] for _, m in BAD_FOR_THE_API_SERVER]
)
def test_the_gate_refuses_what_the_crd_schema_refuses(builder, message):
    obj = builder.obj()
    assert message in crd_validation.spec_problems(obj["kind"], obj["spec"])
    with pytest.raises(jsonschema.ValidationError):  # the same schema, as JSON Schema reads it (tests/support)
        validate_cr(obj)


def test_the_schema_check_knows_every_keyword_the_crds_use():
    used = set()

    def walk(node: dict) -> None:
        used.update(node)
        for child in [*node.get("properties", {}).values(), *([node["items"]] if "items" in node else [])]:
            walk(child)

    for kind in api.KINDS.values():
        walk(crd.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"])
    assert used - crd_validation.CHECKED - crd_validation.NOT_CHECKED == set()


def test_a_null_is_pruned_not_refused():
    # apiextensions prunes a null of a non-nullable field before validation: it reads as absent.
    obj = finetune("b").set("training.epochs", None).obj()
    assert crd_validation.spec_problems("GemmaFineTune", obj["spec"]) == []


# Each CEL rule of the CRDs, broken once: the models hold the same rules, so the gate refuses them too.
BREAKS_A_CEL_RULE = {
    "set tpu or gpu, not both": finetune("b").tpu("v5p").gpu("nvidia-h100-80gb", 2),
    "set exactly one of uri or hfRepo": finetune("b").set("model", {"preset": "gemma4-31b"}),
    "hfTokenSecretRef is only used with hfRepo": finetune("b").set("model.hfTokenSecretRef", {"name": "hf"}),
    "set exactly one of fineTuneRef, uri or hfRepo": serve("s").set("model.hfRepo", "google/gemma-4-31B-it"),
    "set steps or epochs, not both": finetune("b").training(epochs=2),
    "k_proj and v_proj share one fused projection on sliding layers": finetune("b").lora(targetModules=["k_proj"]),
    "set exactly one of uri or pvc": serve("s").set("compilationCache", {}),
    "evaluation has no rows": finetune("b").set("evaluation", {}),
    "packing: preference pairs are not packed": finetune("b")
    .set("method", "dpo")
    .set("dataset", {"uri": "gs://data/p.jsonl", "format": "preference", "packing": True}),
    "methods dpo and orpo train on dataset.format preference": finetune("b").set("method", "orpo"),
    "preference is only used with method dpo or orpo": finetune("b").set("preference", {}),
    "preference.beta is only used with method dpo": finetune("b")
    .set("method", "orpo")
    .set("dataset.format", "preference")
    .set("preference", {"beta": 0.1}),
    "preference.orpoLambda is only used with method orpo": finetune("b")
    .set("method", "dpo")
    .set("dataset.format", "preference")
    .set("preference", {"orpoLambda": 0.1}),
    "set min, max or baseline": serve("s").fine_tune("f").set("rollout", {"gate": [{"metric": "evalLoss"}]}),
    "min is above max": serve("s")
    .fine_tune("f")
    .set("rollout", {"gate": [{"metric": "evalLoss", "min": 2, "max": 1}]}),
    "rollout.gate is only used with model.fineTuneRef": serve("s").set(
        "rollout", {"gate": [{"metric": "evalLoss", "max": 1}]}
    ),
    "benchmark.onMiss rollback is only used with model.fineTuneRef": serve("s").set(
        "benchmark", {"onMiss": "rollback", "slo": {"ttftP99Ms": 500}}
    ),
    "benchmark.inputLen + benchmark.outputLen must be at most vllm.maxModelLen": serve("s").set(
        "benchmark", {"inputLen": 4000, "outputLen": 200}
    ),
    "set at least one of ttftP99Ms": serve("s").set("benchmark", {"slo": {}}),
    "warmupSteps must be below steps": finetune("b").training(steps=10, warmupSteps=10),
    "microBatchSize must divide batchSize": finetune("b").training(batchSize=8, microBatchSize=3),
    "evaluation.maxNewTokens must be below dataset.maxSeqLen": finetune("b")
    .set("dataset.maxSeqLen", 64)
    .set("evaluation", {"uri": "gs://data/eval.jsonl", "maxNewTokens": 64}),
    "evalLoss and perplexity are better lower": serve("s")
    .fine_tune("f")
    .set("rollout", {"gate": [{"metric": "evalLoss", "min": 1}]}),
    "this metric is better higher": serve("s")
    .fine_tune("f")
    .set("rollout", {"gate": [{"metric": "exactMatch", "max": 1}]}),
    "maxSurge and maxUnavailable cannot both be 0": serve("s").set("rollout", {"maxSurge": 0, "maxUnavailable": 0}),
    "maxReplicas must be at least minReplicas": serve("s").set("autoscaling", {"minReplicas": 3, "maxReplicas": 2}),
    "benchmark.durationSeconds needs benchmark.requestRate": serve("s").set("benchmark", {"durationSeconds": 60}),
    "benchmark.durationSeconds must be below timeoutSeconds": serve("s").set(
        "benchmark", {"durationSeconds": 600, "requestRate": 1}
    ),
    "benchmark.requestRate x durationSeconds is at most": serve("s").set(
        "benchmark", {"durationSeconds": 500, "requestRate": 100}
    ),
}


def test_every_cel_rule_is_refused_by_the_gate(tmp_path, capsys):
    messages = {r["message"] for rules in crd.CEL_RULES.values() for r in rules}
    assert {m for m in messages if any(m.startswith(k) for k in BREAKS_A_CEL_RULE)} == messages, "a rule without a case"
    for start, builder in BREAKS_A_CEL_RULE.items():
        code, lines = _plan_cli(tmp_path, capsys, yaml.safe_dump(builder.obj()))
        assert code == 2 and lines, start
        assert crd_validation.spec_problems(builder.kind, builder.spec) == [], "a CEL rule, not the schema"


# ---------------------------------------------------------------------------- the pods' pre-flight

SETTINGS = OperatorSettings()


def test_warmup_as_long_as_the_run_is_refused():
    with pytest.raises(SpecError) as e:
        plan_finetune("w", "ns", finetune("w").training(steps=100, warmupSteps=100).spec, SETTINGS)
    assert e.value.problems == [
        "spec.training.warmupSteps: 100 must be below steps 100: the training pod refuses a run that would end "
        "inside its warmup"
    ]
    assert plan_finetune("w", "ns", finetune("w").training(steps=100, warmupSteps=99).spec, SETTINGS)


NOT_GEMMA_4 = (
    "spec.model.hfRepo: google/gemma-3-27b-it is not a Gemma 4 model this operator knows (gemma-4-31B, "
    "gemma-4-26B-A4B, gemma-4-E4B, gemma-4-E2B); if it is a Gemma 4 checkpoint, state its size in spec.model.preset"
)


def test_a_model_that_is_not_gemma_4_is_refused_unless_its_preset_is_stated():
    gemma3 = {"hfRepo": "google/gemma-3-27b-it", "hfTokenSecretRef": {"name": "hf"}}
    with pytest.raises(SpecError) as e:
        plan_finetune("g", "ns", finetune("g").set("model", gemma3).spec, SETTINGS)
    assert e.value.problems == [NOT_GEMMA_4]
    with pytest.raises(SpecError) as e:
        plan_serve("g", "ns", serve("g").set("model", gemma3).spec, SETTINGS)
    assert NOT_GEMMA_4 in e.value.problems
    stated = plan_finetune("g", "ns", finetune("g").set("model", {**gemma3, "preset": "gemma4-31b"}).spec, SETTINGS)
    assert stated.memory is not None, "planned with the stated size: the fit is checked"


def test_a_gated_repository_without_a_token_gets_a_warning():
    p = plan_finetune("g", "ns", finetune("g").set("model", {"hfRepo": "google/gemma-4-31B-it"}).spec, SETTINGS)
    assert p.warnings == (
        "spec.model.hfTokenSecretRef: not set, but google/gemma-4-31B-it is a gated repository: the download is "
        "refused without the token of an account that accepted its licence",
    )
    assert plan_finetune("g", "ns", _ft("g").spec, SETTINGS).warnings == ()


# ---------------------------------------------------------------------------- cost


def test_a_service_plan_says_what_it_costs(capsys, tmp_path):
    s = serve("sv").set("autoscaling", {"minReplicas": 1, "maxReplicas": 4})
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(s.obj()))
    assert (
        cli.main_exit(
            ["plan", "-f", str(path), "--settings", _settings(tmp_path, {"prices_per_chip_hour": {"v6e": 2.5}})]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    # v6e-8: 8 chips a replica at $2.50, 720 hours in 30 days.
    assert (
        "  cost:          $20.00/h and $14,400.00 per 30 days per replica (8 chips); at minReplicas 1: $20.00/h, "
        "$14,400.00 per 30 days; at maxReplicas 4: $80.00/h, $57,600.00 per 30 days" in lines
    )
    assert "  price:         $2.50/chip-hour on demand (settings.prices_per_chip_hour)" in lines
    assert cli.main_exit(["plan", "-o", "json", "-f", str(path), "--settings", str(tmp_path / "settings.yaml")]) == 0
    [cost] = [p["cost"] for p in json.loads(capsys.readouterr().out)]
    assert (cost["perReplicaHour"], cost["perReplica30Days"]) == (20.0, 14400.0)
    assert cost["at"]["maxReplicas"] == {"replicas": 4, "hour": 80.0, "30Days": 57600.0}


def test_built_in_prices_are_marked_unverified():
    p = plan_serve("sv", "ns", serve("sv").spec, SETTINGS)
    assert p.cost.price.describe() == (
        "$2.69/chip-hour on demand (built-in list price, unverified: set settings.prices_per_chip_hour)"
    )


def test_a_spot_fine_tune_is_priced_at_the_spot_rate_or_says_it_is_not():
    spot = finetune("s").tpu("v5p", spot=True).spec
    unpriced = plan_finetune("s", "ns", spot, SETTINGS)
    assert unpriced.price.describe() == (
        "$4.20/chip-hour, a Spot slice priced on demand (no v5p rate in settings.spot_prices_per_chip_hour; "
        "built-in list price, unverified: set settings.prices_per_chip_hour)"
    )
    priced = plan_finetune("s", "ns", spot, OperatorSettings(spot_prices_per_chip_hour={"v5p": 1.5}))
    assert priced.price.describe() == "$1.50/chip-hour spot (settings.spot_prices_per_chip_hour)"
    assert priced.estimate.cost == pytest.approx(priced.estimate.chip_hours * 1.5)
    on_demand = plan_finetune(
        "s", "ns", finetune("s").tpu("v5p").spec, OperatorSettings(spot_prices_per_chip_hour={"v5p": 1.5})
    )
    assert on_demand.price_per_chip_hour == 4.20, "the Spot rate only for Spot slices"


def _settings(tmp_path, values: dict) -> str:
    path = tmp_path / "settings.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)
