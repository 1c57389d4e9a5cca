"""manifests/ (`kubectl apply -k manifests/`): generated from the chart and the API models, and
valid. `make manifests` regenerates; these tests fail when anything drifted."""

from __future__ import annotations

import yaml
from scripts import manifests

from tests.support.chart import objects
from tests.support.validation import validate_builtin


def test_nothing_generated_is_out_of_date():
    stale = manifests.stale(manifests.chart_inputs()) + manifests.stale(manifests.plain_manifests())
    assert not stale, f"out of date, run `make manifests`: {stale}"


def test_the_plain_install_is_the_chart_with_fixed_values_plus_crds_and_namespace():
    kustomization = yaml.safe_load((manifests.MANIFESTS / "kustomization.yaml").read_text())
    docs = [
        doc
        for name in kustomization["resources"]
        for doc in yaml.safe_load_all((manifests.MANIFESTS / name).read_text())
        if doc
    ]
    for doc in docs:
        validate_builtin(doc)
    rest = [d for d in docs if d["kind"] not in ("CustomResourceDefinition", "Namespace")]
    assert sorted(map(str, rest)) == sorted(map(str, objects(manifests.PLAIN_VALUES)))
    namespaces = {d["metadata"].get("namespace") for d in rest} - {None}
    assert namespaces == {manifests.NAMESPACE} == {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    assert sorted(d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition") == [
        "gemmafinetunes.gemma-tpu.dev",
        "gemmaserves.gemma-tpu.dev",
    ]
