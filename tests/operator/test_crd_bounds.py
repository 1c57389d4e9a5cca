"""Every list, map and free string of both CRDs is bounded, and every field is documented.

Why bounds matter beyond the API conventions: before it accepts a CRD, the API server compiles
each `x-kubernetes-validations` rule and estimates its worst-case cost from the declared bounds of
what the rule reads (k8s.io/apiextensions-apiserver, pkg/apiserver/schema/cel/compilation.go). A
list without maxItems, a map without maxProperties or a string without maxLength is sized as if it
filled a whole 3 MiB request (k8s.io/apiserver, pkg/cel/common/schemas.go,
estimateMaxArrayItemsFromMinSize), and a rule whose estimate passes StaticEstimatedCostLimit
(10,000,000 per rule; StaticEstimatedCRDCostLimit, 100,000,000, for all the rules of a CRD:
pkg/apis/apiextensions/validation/validation.go) is refused: "estimated rule cost exceeds budget by
factor of ...". The local API server does not estimate costs, so only these checks can see it.
"""

from __future__ import annotations

import copy

import pytest

from gemma_operator import api, crd


def _walk(schema: dict, path: str):
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from _walk(prop, f"{path}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")


def unbounded(schema: dict, path: str) -> list[str]:
    """Every list without maxItems, map without maxProperties and free string without maxLength
    (a string enum is bounded by its longest value, as the cost estimate reads it)."""
    out = []
    for where, node in _walk(schema, path):
        kind = node.get("type")
        if kind == "array" and "maxItems" not in node:
            out.append(f"{where}: list without maxItems")
        elif kind == "object" and "properties" not in node and "maxProperties" not in node:
            out.append(f"{where}: map without maxProperties")
        elif kind == "string" and "enum" not in node and "maxLength" not in node:
            out.append(f"{where}: string without maxLength")
    return out


def read_by_rules(schema: dict, path: str) -> list[tuple[str, dict]]:
    """The schema nodes that carry CEL rules: each rule may read anything under its node."""
    return [(where, node) for where, node in _walk(schema, path) if node.get("x-kubernetes-validations")]


def _schema(kind: api.Kind) -> dict:
    return crd.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _field(schema: dict, dotted: str) -> dict:
    node = schema
    for name in dotted.split("."):
        node = node["properties"][name]
    return node


KINDS = list(api.KINDS.values())


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_what_a_cel_rule_reads_is_bounded(kind):
    schema = _schema(kind)
    ruled = read_by_rules(schema, kind.kind)
    assert ruled, f"{kind.kind} has no CEL rules: this check would check nothing"
    problems = [p for where, node in ruled for p in unbounded(node, where)]
    assert problems == []


def test_the_check_sees_the_list_the_api_server_refused():
    """lora.targetModules without maxItems: a real kube-apiserver refused the CRD (factor 1.258291x)."""
    schema = copy.deepcopy(_schema(api.FINETUNE))
    lora = _field(schema, "spec.lora")
    assert lora["properties"]["targetModules"]["maxItems"] == len(api.config.LORA_MODULES)
    del lora["properties"]["targetModules"]["maxItems"]
    problems = [p for where, node in read_by_rules(schema, "GemmaFineTune") for p in unbounded(node, where)]
    assert "GemmaFineTune.spec.lora.targetModules: list without maxItems" in problems


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_every_list_map_and_free_string_is_bounded(kind):
    schema = _schema(kind)
    assert unbounded(schema["properties"]["spec"], f"{kind.kind}.spec") == []
    assert unbounded(schema["properties"]["status"], f"{kind.kind}.status") == []


def test_names_are_bounded_as_kubernetes_names_are():
    # RFC 1123 subdomain (253) for object names, label (63) for node pools (k8s.io/apimachinery validation).
    gft, gsv = _schema(api.FINETUNE), _schema(api.SERVE)
    assert _field(gft, "spec.serviceAccountName")["maxLength"] == 253
    assert _field(gft, "spec.tpu.nodePool")["maxLength"] == 63
    assert _field(gsv, "spec.model.fineTuneRef.name")["maxLength"] == 253
    assert _field(gsv, "spec.vllm.extraArgs")["maxItems"] == 64
    assert _field(gsv, "spec.vllm.extraArgs")["items"]["maxLength"] == 1024
    # metav1.Condition's own bounds.
    condition = _field(gft, "status.conditions")["items"]["properties"]
    assert (condition["type"]["maxLength"], condition["message"]["maxLength"]) == (316, 32768)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_every_field_has_a_description(kind):
    """`kubectl explain` prints a field's description: none leaves a user guessing at units and defaults."""
    schema = _schema(kind)
    missing = [
        where
        for top in ("spec", "status")
        for where, node in _walk(schema["properties"][top], f"{kind.kind}.{top}")
        if not where.endswith("[]") and not node.get("description")
    ]
    assert missing == []


def test_explain_says_what_a_lora_rank_is():
    rank = _field(_schema(api.FINETUNE), "spec.lora.rank")
    assert rank["description"] == "LoRA rank: the adapter's inner dimension (1-1024)."
    assert (rank["minimum"], rank["maximum"], rank["default"]) == (1, 1024, 16)
