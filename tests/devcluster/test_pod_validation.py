"""The local API server refuses the pods and pod templates a real one refuses, with its messages,
and accepts every workload the operator renders."""

import asyncio
import json

import kubernetes
import pytest
from kubernetes.client.rest import ApiException

from gemma_devcluster.pod_validation import QUANTITY_PATTERN, refusal
from gemma_operator.children import merge_objects, serving_objects, training_objects
from gemma_operator.plan import plan_finetune, plan_serve
from tests.support.builders import finetune, serve
from tests.support.phases import NS, SETTINGS


def _client(apiserver) -> kubernetes.client.ApiClient:
    cfg = kubernetes.client.Configuration()
    cfg.host = str(apiserver.url).rstrip("/")
    return kubernetes.client.ApiClient(cfg)


def _job(name: str, container: dict) -> dict:
    template = {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", **container}]}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {"template": template}}


async def _refused(fn, *args) -> tuple[int, str]:
    with pytest.raises(ApiException) as e:
        await asyncio.to_thread(fn, *args)
    return e.value.status, json.loads(e.value.body)["message"]


async def test_a_job_without_an_image_or_with_a_bad_quantity_is_refused(apiserver):
    batch = kubernetes.client.BatchV1Api(_client(apiserver))
    # The API server's message for a missing image (pkg/apis/core/validation: field.Required).
    assert await _refused(batch.create_namespaced_job, NS, _job("x", {})) == (
        422,
        'Job.batch "x" is invalid: spec.template.spec.containers[0].image: Required value',
    )
    # A quantity Quantity.UnmarshalJSON cannot read fails the body's decoding: 400, not 422.
    bad = _job("y", {"image": "i", "resources": {"limits": {"memory": "64GiB"}}})
    assert await _refused(batch.create_namespaced_job, NS, bad) == (
        400,
        f'Job in version "v1" cannot be handled as a Job: quantities must match the regular expression '
        f"'{QUANTITY_PATTERN}'",
    )
    ok = _job(
        "z", {"image": "i", "resources": {"requests": {"cpu": "500m", "memory": "1.5Gi"}, "limits": {"cpu": "2"}}}
    )
    created = await asyncio.to_thread(batch.create_namespaced_job, NS, ok)
    assert created.metadata.name == "z"


async def test_a_pod_with_several_problems_lists_them(apiserver):
    core = kubernetes.client.CoreV1Api(_client(apiserver))
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "initContainers": [{"name": "init", "image": "i", "resources": {"requests": {"cpu": "-1"}}}],
            "containers": [{"name": "c"}],
        },
    }
    assert await _refused(core.create_namespaced_pod, NS, pod) == (
        422,
        'Pod "p" is invalid: [spec.containers[0].image: Required value, '
        'spec.initContainers[0].resources.requests.cpu: Invalid value: "-1": must be greater than or equal to 0]',
    )


# Quantity grammar (k8s.io/apimachinery/pkg/api/resource/quantity.go): a signed decimal number, then
# a binary SI suffix, a decimal SI suffix or a decimal exponent.
@pytest.mark.parametrize(
    "value, valid",
    [
        ("64Gi", True),
        ("1.5Gi", True),
        ("500m", True),
        ("10G", True),
        ("1e3", True),
        ("1E-2", True),
        (".5", True),
        ("2.", True),
        (4, True),
        ("+1k", True),
        ("64GiB", False),
        ("10GB", False),
        ("1K", False),  # kilo is k
        ("Gi", False),
        ("1 Gi", False),
        ("", False),
        ("1.2.3", False),
    ],
)
def test_quantity_grammar(value, valid):
    job = _job("q", {"image": "i", "resources": {"limits": {"memory": value}}})
    assert (refusal("batch", "Job", job) is None) is valid


def test_every_workload_the_operator_renders_is_accepted():
    """The rendered children pass the API server's pod checks: a Job, JobSet, Deployment or
    LeaderWorkerSet whose container lost its image fails here as on a cluster."""
    single = plan_finetune("ft", NS, finetune("ft").tpu("v5p", "2x2x1").spec, SETTINGS)
    multi = plan_finetune("ft", NS, finetune("ft").tpu("v5p", "2x2x2").spec, SETTINGS)
    served = plan_serve(
        "chat", NS, serve("chat").fine_tune("ft").spec, SETTINGS, model_uri="gs://m", fine_tune_preset="gemma4-31b"
    )
    objs = [
        *training_objects(single, SETTINGS),
        *training_objects(multi, SETTINGS),
        *merge_objects(single, SETTINGS),
        *serving_objects(served, SETTINGS),
    ]
    checked = 0
    for obj in objs:
        for group, kind, template in _pod_templates(obj):
            assert refusal(group, kind, template) is None, f"{obj['kind']} {obj['metadata']['name']}"
            checked += 1
    assert checked >= 4, "the training Job, the JobSet's workers, the merge Job and the vLLM Deployment"


def _pod_templates(obj: dict):
    """(group, kind, object) triples the pod checks apply to: the object itself, or for JobSet and
    LeaderWorkerSet (custom kinds whose controllers create Jobs and pods) the Jobs and pods they make."""
    if obj["kind"] == "JobSet":
        for rj in obj["spec"]["replicatedJobs"]:
            yield "batch", "Job", {"metadata": {"name": rj["name"]}, "spec": rj["template"]["spec"]}
    elif obj["kind"] == "LeaderWorkerSet":
        tpl = obj["spec"]["leaderWorkerTemplate"]
        for t in (tpl.get("leaderTemplate"), tpl["workerTemplate"]):
            if t:
                yield "", "Pod", {"metadata": {"name": obj["metadata"]["name"]}, "spec": t["spec"]}
    else:
        yield obj["apiVersion"].rpartition("/")[0], obj["kind"], obj
