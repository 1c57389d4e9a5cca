"""The documentation holds together: the README is a short landing page that links every document,
every link inside the repository resolves, and the GKE runbook's names and Helm values are the
ones the chart and the examples use."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from scripts.manifests import NAMESPACE, RELEASE, ROOT

from tests.support.chart import objects
from tests.support.validation import validate_cr

README = ROOT / "README.md"
DOCS = ROOT / "docs"
RUNBOOK = DOCS / "install-gke.md"
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _markdown() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def _links(path: Path) -> list[str]:
    """Relative link targets of a Markdown file, outside code blocks and code spans."""
    text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", path.read_text()))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {_anchor(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def test_the_readme_is_a_short_landing_page():
    size = len(README.read_bytes())
    assert size <= 12 * 1024, f"README.md is {size} bytes: move detail into docs/"
    text = README.read_text()
    assert "## Status" in text and "not yet" in text.split("## Status", 1)[1].split("\n## ", 1)[0]
    assert "Fine-Tuning and Serving Gemma 4 31B on Google Cloud TPU" in text and "2605.25645" in text


def test_the_readme_links_every_document():
    linked = {(README.parent / t.split("#")[0]).resolve() for t in _links(README)}
    missing = [str(p.relative_to(ROOT)) for p in DOCS.rglob("*.md") if p.resolve() not in linked]
    assert not missing, f"documents the README does not link: {missing}"
    assert (ROOT / "LICENSE").resolve() in linked


@pytest.mark.parametrize("doc", _markdown(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path):
    broken = []
    for target in _links(doc):
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists() or anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: links that do not resolve: {broken}"


# ------------------------------------------------------------------------------ the GKE runbook

FAKE_ENV = {"PROJECT_ID": "my-project", "REGISTRY": "us-central1-docker.pkg.dev/my-project/gemma-tpu"}


def _runbook() -> str:
    return RUNBOOK.read_text()


def _runbook_values() -> dict:
    """The values file the runbook writes with `cat > values-gke.yaml <<EOF`, its variables set."""
    body = re.search(r"cat > values-gke\.yaml <<EOF\n(.*?)\nEOF\n", _runbook(), re.S).group(1)
    return yaml.safe_load(re.sub(r"\$(\w+)", lambda m: FAKE_ENV[m.group(1)], body))


def _example(name: str) -> dict:
    return yaml.safe_load((ROOT / "examples" / name).read_text())


def test_the_runbook_values_render_with_the_chart():
    values = _runbook_values()
    objs = objects(values)  # the chart's values.schema.json refuses unknown keys and wrong types
    accounts = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objs if o["kind"] == "ServiceAccount"}
    assert {("ml", "gemma-trainer"), ("ml", "gemma-server")} <= accounts
    config = next(o for o in objs if o["kind"] == "ConfigMap" and "settings.yaml" in str(o.get("data")))
    assert "cpu-merge" in str(config["data"]) and "tpu-v6e-8" in str(config["data"])


def test_the_runbook_names_match_the_examples_and_the_chart():
    text = _runbook()
    finetune, serve = _example("gemma4-31b-v5p8.yaml"), _example("serve-v6e8.yaml")
    values = _runbook_values()
    # the workloads' namespace, ServiceAccounts and Secrets
    assert finetune["metadata"]["namespace"] == serve["metadata"]["namespace"] == "ml"
    assert values["workloads"]["namespaces"] == ["ml"]
    assert finetune["spec"]["serviceAccountName"] == values["workloads"]["training"]["serviceAccount"]["name"]
    assert serve["spec"]["serviceAccountName"] == values["workloads"]["serving"]["serviceAccount"]["name"]
    # Workload Identity Federation for GKE's principal of a Kubernetes ServiceAccount (GKE's Workload Identity docs)
    principal = "principal://iam.googleapis.com/projects/$PROJECT_NUMBER/locations/global/workloadIdentityPools/"
    assert f"KSA={principal}$PROJECT_ID.svc.id.goog/subject/ns/ml/sa\n" in text
    for account in ("gemma-trainer", "gemma-server"):
        assert f"--member=$KSA/{account}" in text
    token, key = finetune["spec"]["model"]["hfTokenSecretRef"], serve["spec"]["vllm"]["apiKeySecretRef"]
    assert f"create secret generic {token['name']} -n ml --from-literal={token['key']}=" in text
    assert f"create secret generic {key['name']} -n ml --from-literal={key['key']}=" in text
    # the release, the CRs and the node pools
    assert f"helm install {RELEASE} charts/gemma-tpu-operator -n {NAMESPACE} " in text
    assert f"gft/{finetune['metadata']['name']} gsv/{serve['metadata']['name']}" in text
    assert f"svc/{serve['metadata']['name']}-vllm 8000:8000" in text
    pools = set(re.findall(r"node-pools create (\S+)", text))
    assert pools == {"tpu-v5p-8", "tpu-v6e-8", "cpu-merge"}
    assert values["settings"]["merge_node_selector"]["cloud.google.com/gke-nodepool"] in pools
    assert set(values["settings"]["serving_node_pools"].values()) <= pools
    # the TPU shapes of the examples (GKE: v5p-8 is ct5p-hightpu-4t 2x2x1, v6e-8 single host ct6e-standard-8t 2x4)
    assert f"--tpu-topology={finetune['spec']['tpu']['topology']}" in text
    assert f"--tpu-topology={serve['spec']['tpu']['topology']}" in text


def test_the_runbook_edits_of_the_examples_give_valid_resources():
    """The `sed` edits the runbook makes to the examples each find what they replace, and the edited
    files are still valid GemmaFineTune and GemmaServe resources."""
    text = _runbook()
    env = {"BUCKET": "my-project-gemma", "CACHE_BUCKET": "my-project-gemma-xla"}
    substitutions = [
        (old, re.sub(r"\$(\w+)", lambda m: env[m.group(1)], new), flags)
        for old, new, flags in re.findall(r'-e "s\|([^|]+)\|([^|]*)\|(g?)"', text)
    ]
    deletions = [p.replace("\\/", "/") for p in re.findall(r'-e "/(.+?)/d"', text)]
    assert len(substitutions) == 3 and deletions
    used = set()
    for name in re.search(r"for f in (.+); do", text).group(1).split():
        edited = (ROOT / "examples" / name).read_text()
        for old, new, flags in substitutions:
            used |= {old} if old in edited else set()
            edited = edited.replace(old, new, -1 if flags else 1)
        used |= {d for d in deletions if d in edited}
        lines = [line for line in edited.splitlines() if not any(d in line for d in deletions)]
        resource = yaml.safe_load("\n".join(lines))
        validate_cr(resource)  # against the CRD's schema, as the API server would
        assert "my-bucket" not in str(resource) and env["BUCKET"] in str(resource)
    assert used == {old for old, _, _ in substitutions} | set(deletions), "an edit that changes nothing"


# ------------------------------------------------------------------------------ GitOps examples

GITOPS = ROOT / "examples" / "gitops"


def _gitops(kind: str) -> list[dict]:
    return [
        d for p in sorted(GITOPS.rglob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d and d["kind"] == kind
    ]


def test_the_argocd_applications_install_crds_then_operator_then_crs():
    apps = {a["metadata"]["name"]: a for a in _gitops("Application")}
    wave = {n: int(a["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"]) for n, a in apps.items()}
    assert wave["gemma-tpu-crds"] < wave["gemma-tpu-operator"] < wave["gemma-ml"]
    assert apps["gemma-tpu-crds"]["spec"]["source"]["path"] == "manifests/crds"
    assert apps["gemma-tpu-crds"]["spec"]["syncPolicy"]["automated"]["prune"] is False
    operator = apps["gemma-tpu-operator"]["spec"]
    assert (ROOT / operator["source"]["path"] / "Chart.yaml").exists()
    assert operator["destination"]["namespace"] == NAMESPACE
    values = operator["source"]["helm"]["valuesObject"]
    objs = objects(values)
    assert not [o for o in objs if o["kind"] == "CustomResourceDefinition"], "the CRDs Application owns them"
    ml = apps["gemma-ml"]["spec"]["destination"]["namespace"]
    assert ml in values["workloads"]["namespaces"]
    assert {("ServiceAccount", ml, "gemma-trainer"), ("ServiceAccount", ml, "gemma-server")} <= {
        (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs
    }


def test_the_flux_objects_render_and_depend_in_order():
    (release,) = _gitops("HelmRelease")
    chart = release["spec"]["chart"]["spec"]
    assert (ROOT / chart["chart"] / "Chart.yaml").exists()
    sources = {s["metadata"]["name"] for s in _gitops("GitRepository")}
    assert chart["sourceRef"]["name"] in sources
    objs = objects(release["spec"]["values"], release["metadata"]["namespace"])
    assert [o for o in objs if o["kind"] == "CustomResourceDefinition"], "this HelmRelease installs the CRDs"
    kustomizations = {k["metadata"]["name"]: k for k in _gitops("Kustomization")}
    for k in kustomizations.values():
        assert all(d["name"] in kustomizations for d in k["spec"].get("dependsOn", []))
    assert kustomizations["gemma-ml"]["spec"]["dependsOn"] == [{"name": "gemma-tpu-operator"}]
