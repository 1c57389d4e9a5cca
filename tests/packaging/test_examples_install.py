"""The examples and the install agree: every pod an example makes runs as a ServiceAccount that the
chart creates, in the example's namespace, when installed as the chart's NOTES say
(`--set workloads.namespaces='{NS}'`, plus `workloads.createNamespaces=true` where NS is new).

A pod naming a ServiceAccount that does not exist is refused at admission (kube-apiserver's
ServiceAccount admission plugin), so a disagreement here is a Job that never starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from scripts.manifests import ROOT

from gemma_operator.children import merge_objects, serving_objects, training_objects
from gemma_operator.cli import plan_documents
from gemma_operator.settings import OperatorSettings
from tests.support.chart import objects as chart_objects
from tests.support.chart import one
from tests.support.validation import validate_cr

EXAMPLE_SETS = {
    "examples": sorted((ROOT / "examples").glob("*.yaml")),
    "quickstart": sorted((ROOT / "examples" / "quickstart").glob("*.yaml")),
}


def documents(files: list[Path]) -> list[dict]:
    return [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]


def pod_specs(obj: dict) -> list[dict]:
    """The pod templates' specs of a Job, JobSet, Deployment or LeaderWorkerSet."""
    spec = obj.get("spec") or {}
    if obj["kind"] in ("Job", "Deployment"):
        return [spec["template"]["spec"]]
    if obj["kind"] == "JobSet":
        return [r["template"]["spec"]["template"]["spec"] for r in spec["replicatedJobs"]]
    if obj["kind"] == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        return [t["spec"] for t in (lwt.get("leaderTemplate"), lwt["workerTemplate"]) if t]
    return []


def accounts_used(docs: list[dict], settings: OperatorSettings) -> set[tuple[str, str]]:
    """(namespace, ServiceAccount) of every pod the operator would create for these CRs."""
    plans, problems = plan_documents(docs, settings)
    assert not problems, problems
    made = []
    for kind, plan in plans:
        if kind == "GemmaFineTune":
            made += training_objects(plan, settings) + merge_objects(plan, settings)
        else:
            made += serving_objects(plan, settings)
    return {
        (obj["metadata"]["namespace"], pod.get("serviceAccountName", "default"))
        for obj in made
        for pod in pod_specs(obj)
    }


@pytest.mark.parametrize("example_set", EXAMPLE_SETS)
def test_every_example_runs_as_an_identity_the_chart_creates(example_set):
    docs = documents(EXAMPLE_SETS[example_set])
    for doc in docs:
        validate_cr(doc)
    namespaces = sorted({d["metadata"]["namespace"] for d in docs})
    install = chart_objects({"workloads": {"namespaces": namespaces, "createNamespaces": True}})
    settings = OperatorSettings.model_validate(yaml.safe_load(one(install, "ConfigMap")["data"]["settings.yaml"]))
    created = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in install if o["kind"] == "ServiceAccount"}
    used = accounts_used(docs, settings)
    assert {sa for _, sa in used} <= {"gemma-trainer", "gemma-server"}, "the examples use the chart's identities"
    assert used <= created, f"pods would be refused: no ServiceAccount {sorted(used - created)}"
    made_namespaces = {o["metadata"]["name"] for o in install if o["kind"] == "Namespace"}
    assert set(namespaces) <= made_namespaces | {"gemma-tpu-system"}


def test_the_operators_defaults_are_the_charts_identities():
    """A CR that names no ServiceAccount gets the chart's: the operator's defaults are the same names."""
    values = yaml.safe_load((ROOT / "charts" / "gemma-tpu-operator" / "values.yaml").read_text())["workloads"]
    defaults = OperatorSettings()
    assert defaults.training_service_account == values["training"]["serviceAccount"]["name"] == "gemma-trainer"
    assert defaults.serving_service_account == values["serving"]["serviceAccount"]["name"] == "gemma-server"
    quickstart = [
        {**d, "spec": {k: v for k, v in d["spec"].items() if k != "serviceAccountName"}}
        for d in documents(EXAMPLE_SETS["quickstart"])
    ]
    assert {sa for _, sa in accounts_used(quickstart, defaults)} == {"gemma-trainer", "gemma-server"}
