"""What a user installs and applies, accepted by a real kube-apiserver 1.36: both CRDs by server-side
apply, the chart and the plain install, every example, and every object the operator would create
for them. The same objects are checked offline elsewhere (tests/packaging, tests/operator/cli); only
the real server applies its own admission (CEL cost budgets, defaults checked against the schema,
pod validation beyond the OpenAPI schema), so only this can see what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gemma_operator import api, cli
from gemma_operator.children import merge_objects, serving_objects, training_objects
from gemma_operator.settings import OperatorSettings
from tests.support.chart import NAMESPACE, objects

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*.yaml") if "gitops" not in p.parts)
# Kinds whose CRDs belong to other projects (JobSet, LeaderWorkerSet, the Prometheus Operator): this
# server does not have them, and the project keeps no copies of them; tests/operator/children checks them.
FOREIGN = {"JobSet", "LeaderWorkerSet", "PodMonitor", "ServiceMonitor"}


def dry_run(plane, docs: list[dict], namespace: str | None = None) -> str:
    """`kubectl apply --server-side --dry-run=server` of these objects: what the server would store."""
    args = ["apply", "--server-side", "--dry-run=server", "--validate=strict", "-o", "yaml", "-f", "-"]
    done = plane.kubectl(*args, *(["-n", namespace] if namespace else []), stdin=yaml.safe_dump_all(docs), check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_both_crds_are_established_by_server_side_apply(control_plane):
    done = control_plane.kubectl("apply", "--server-side", "-f", str(ROOT / "manifests" / "crds"))
    assert done.stdout.count("serverside-applied") == len(api.KINDS), done.stdout
    for kind in api.KINDS.values():
        crd = yaml.safe_load(control_plane.kubectl("get", "crd", f"{kind.plural}.{api.GROUP}", "-o", "yaml").stdout)
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions["Established"] == conditions["NamesAccepted"] == "True", crd["status"]


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"replicas": 2, "watchNamespaces": ["ml", "lab"], "workloads": {"createNamespaces": True}},
        {"crds": {"enabled": False}, "metrics": {"service": {"enabled": False}}},
    ],
    ids=["defaults", "two-replicas-namespaced", "no-crds-no-service"],
)
def test_the_chart_renders_what_the_server_accepts(control_plane, values):
    rendered = [o for o in objects(values) if o["kind"] not in FOREIGN]
    namespaces = {NAMESPACE} | {o["metadata"].get("namespace") for o in rendered} - {None}
    for name in sorted(namespaces):  # a dry run creates nothing, so the namespaces must exist
        control_plane.kubectl("create", "namespace", name, check=False)
    out = list(yaml.safe_load_all(dry_run(control_plane, rendered)))
    assert len(out[0]["items"] if out[0].get("kind") == "List" else out) == len(rendered)


def test_the_plain_install_is_accepted(control_plane):
    built = control_plane.kubectl("kustomize", str(ROOT / "manifests")).stdout
    docs = [d for d in yaml.safe_load_all(built) if d and d["kind"] not in FOREIGN]
    assert {d["kind"] for d in docs} >= {"CustomResourceDefinition", "Deployment", "ClusterRole"}
    dry_run(control_plane, docs)


def test_every_example_is_accepted_and_defaulted_as_the_project_reads_it(control_plane):
    docs = [d for f in EXAMPLES for d in yaml.safe_load_all(f.read_text()) if d]
    assert len(docs) >= 7
    for ns in {d["metadata"].get("namespace", "default") for d in docs}:
        control_plane.kubectl("create", "namespace", ns, check=False)
    stored = yaml.safe_load(dry_run(control_plane, docs))
    stored = stored["items"] if stored.get("kind") == "List" else [stored]
    assert [s["metadata"]["name"] for s in stored] == [d["metadata"]["name"] for d in docs]
    for doc, obj in zip(docs, stored, strict=True):
        # The server's defaults (from the CRD) change nothing the models would not default the same way.
        kind = api.KINDS[doc["kind"]]
        assert kind.spec.model_validate(obj["spec"]) == kind.spec.model_validate(doc["spec"]), doc["metadata"]["name"]


def test_every_child_of_every_example_is_accepted(control_plane, namespace):
    """Each Job, Deployment, Service, ConfigMap and HorizontalPodAutoscaler the operator would create for
    the examples, in a namespace of its own, through the server's validation of pods and selectors."""
    docs = cli._load_crs([str(ROOT / "examples"), str(ROOT / "examples" / "quickstart")])
    plans, problems = cli.plan_documents(docs, OperatorSettings())
    assert not problems
    settings, children = OperatorSettings(), []
    for kind, plan in plans:
        made = training_objects(plan, settings) + merge_objects(plan, settings) if kind == "GemmaFineTune" else []
        made += serving_objects(plan, settings) if kind == "GemmaServe" else []
        children += [o for o in made if o["kind"] not in FOREIGN]
    for obj in children:
        obj["metadata"]["namespace"] = namespace
    assert {o["kind"] for o in children} >= {"ConfigMap", "Job", "Deployment", "Service", "HorizontalPodAutoscaler"}
    dry_run(control_plane, children, namespace)
