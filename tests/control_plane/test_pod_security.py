"""Every pod the operator creates is admitted where Pod Security's `restricted` level is enforced: in a
namespace labelled `pod-security.kubernetes.io/enforce=restricted`, the real kube-apiserver takes every
child of every example (TPU, GPU and the cpu profile; training Job and JobSet, merge, serving Deployment
and LeaderWorkerSet leader and workers, benchmark) without a Pod Security warning, and admits a Pod made of
every pod template among them (the API server enforces the level on Pods; on the templates of built-in
workloads it only warns, and on JobSet and LeaderWorkerSet templates not at all)."""

from __future__ import annotations

import uuid
from pathlib import Path

import kubernetes
import pytest
import yaml
from kubernetes.client.rest import ApiException

from gemma_operator import api, cli
from gemma_operator.children import benchmark, merge_objects, serving_objects, training_objects
from gemma_operator.settings import OperatorSettings
from tests.support.validation import pod_templates

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENFORCED = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn")}
# Kinds of other projects whose CRDs this control plane does not serve; their pod templates are still checked.
NOT_SERVED = {"JobSet", "LeaderWorkerSet", "PodMonitor", "PodMonitoring"}


def example_children(settings: OperatorSettings) -> list[dict]:
    """Every object the operator makes for the examples, in every phase."""
    paths = [str(p) for p in sorted(EXAMPLES.glob("*.yaml"))] + [str(EXAMPLES / "quickstart")]
    plans, problems = cli.plan_documents(cli._load_crs(paths), settings)
    assert not problems, problems
    out: list[dict] = []
    for kind, plan in plans:
        if kind == api.FINETUNE.kind:
            out += training_objects(plan, settings) + merge_objects(plan, settings)
        else:
            out += serving_objects(plan, settings)
            out += [benchmark.job(plan, settings, None)] if plan.spec.benchmark else []
    return out


@pytest.fixture(scope="module")
def restricted(control_plane):
    """A namespace that enforces `restricted`, with the workload ServiceAccounts the chart makes there."""
    name = f"restricted-{uuid.uuid4().hex[:8]}"
    control_plane.create_namespace(name)
    control_plane.kubectl("label", "namespace", name, *(f"{k}={v}" for k, v in ENFORCED.items()))
    for account in ("gemma-trainer", "gemma-server"):
        control_plane.kubectl("create", "serviceaccount", account, "-n", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_every_pod_of_every_example_is_admitted_under_restricted(control_plane, restricted):
    children = [
        {**o, "metadata": {**o["metadata"], "namespace": restricted}} for o in example_children(OperatorSettings())
    ]
    templates = [(f"{o['metadata']['name']} ({where})", t) for o in children for where, t in pod_templates(o)]
    kinds = {where.split("(")[1].split(" ")[0].rstrip(")") for where, _ in templates}
    assert kinds == {"Job", "Deployment", "JobSet", "LWS"}, kinds
    selectors = [t["spec"].get("nodeSelector", {}) for _, t in templates]
    accelerators = {
        s.get("cloud.google.com/gke-tpu-accelerator") or s.get("cloud.google.com/gke-accelerator") for s in selectors
    }
    assert {"tpu-v5p-slice", "tpu-v6e-slice", "nvidia-h100-80gb", None} <= accelerators, accelerators

    served = [o for o in children if o["kind"] not in NOT_SERVED]
    done = control_plane.kubectl(
        "create", "--dry-run=server", "-n", restricted, "-f", "-", stdin=yaml.safe_dump_all(served), check=False
    )
    assert done.returncode == 0 and "PodSecurity" not in done.stderr, done.stderr

    refused = []
    with control_plane.client() as client:
        core = kubernetes.client.CoreV1Api(client)
        for where, template in templates:
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"generateName": "psa-", "labels": template["metadata"].get("labels", {})},
                "spec": template["spec"],
            }
            try:
                core.create_namespaced_pod(restricted, pod, dry_run="All")
            except ApiException as e:
                refused.append(f"{where}: {e.body}")
    assert not refused, "\n".join(refused)
