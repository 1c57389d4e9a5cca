"""The checked-in CRDs are generated from the API models and are structural."""

from pathlib import Path

import yaml

from gemma_operator import api, crd

ROOT = Path(__file__).resolve().parents[2]


def _walk(schema: dict, path: str = ""):
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from _walk(prop, f"{path}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")


def test_checked_in_crds_match_the_models():
    for kind in api.KINDS.values():
        path = ROOT / "manifests" / "crds" / crd.crd_filename(kind)
        assert path.exists(), f"{path} missing: run `make crds`"
        assert yaml.safe_load(path.read_text()) == crd.crd(kind), f"{path.name} drifted: run `make crds`"


def test_schemas_are_structural():
    for kind in api.KINDS.values():
        schema = crd.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, node in _walk(schema):
            assert "type" in node, f"{kind.kind}{path} has no type"
            for forbidden in ("$ref", "anyOf", "oneOf", "allOf", "additionalProperties", "title"):
                assert forbidden not in node, f"{kind.kind}{path} has {forbidden}"


def test_crd_surface():
    gft = crd.crd(api.FINETUNE)
    names = gft["spec"]["names"]
    assert names["shortNames"] == ["gft"] and names["categories"] == ["gemma"]
    version = gft["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[:3] == ["Phase", "Step", "Total"] and "Age" in columns
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["model", "dataset", "output"]
    assert spec["properties"]["tpu"]["properties"]["accelerator"]["enum"] == ["v5p", "v6e", "cpu"]
    assert spec["properties"]["lora"]["default"]["rank"] == 16
    assert spec["properties"]["model"]["x-kubernetes-validations"][0]["rule"] == "has(self.uri) != has(self.hfRepo)"
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["properties"]["conditions"]["x-kubernetes-list-map-keys"] == ["type"]

    gsv = crd.crd(api.SERVE)
    assert gsv["spec"]["names"]["shortNames"] == ["gsv"]
    serve_spec = gsv["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    # No default for the whole tpu block: the API server would then add one beside a gpu block. An unset
    # tpu (without gpu) is the kind's default slice, the operator's to fill (api.one_accelerator).
    assert "default" not in serve_spec["properties"]["tpu"] and "default" not in spec["properties"]["tpu"]
    assert serve_spec["properties"]["tpu"]["properties"]["accelerator"]["default"] == "v6e"
    assert spec["properties"]["tpu"]["properties"]["accelerator"]["default"] == "v5p"
    assert serve_spec["properties"]["gpu"]["properties"]["count"]["enum"] == [1, 2, 4, 8]
    for schema in (spec, serve_spec):
        assert {"rule": "!(has(self.tpu) && has(self.gpu))", "message": api.ONE_ACCELERATOR} in schema[
            "x-kubernetes-validations"
        ]


def test_evaluation_surface():
    gft = crd.crd(api.FINETUNE)["spec"]["versions"][0]
    eval_column = next(c for c in gft["additionalPrinterColumns"] if c["name"] == "Eval")
    assert eval_column["jsonPath"] == ".status.evaluation.summary" and "priority" not in eval_column  # shown by default
    spec = gft["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "has(self.evaluation.uri)" in spec["x-kubernetes-validations"][0]["rule"]
    gsv = crd.crd(api.SERVE)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    gate = gsv["properties"]["rollout"]["properties"]["gate"]
    assert gate["items"]["properties"]["metric"]["enum"] == [
        "evalLoss",
        "perplexity",
        "exactMatch",
        "contains",
        "regexMatch",
        "preferenceAccuracy",
        "rewardMargin",
    ]
    assert gate["maxItems"] == 16 and gate["items"]["x-kubernetes-validations"]
    assert gsv["properties"]["model"]["properties"]["fineTuneRef"]["properties"]["run"]["pattern"]
