"""The children of a spec with `gpu`: pods as GKE schedules GPUs (the accelerator's node label,
`nvidia.com/gpu` limits, the GPU taint tolerated), no TPU field anywhere, valid Kubernetes."""

import json

import pytest

from gemma_operator.children import common, serving_objects, training, training_objects
from gemma_operator.children.model_delivery import compile_cache_key
from gemma_operator.plan import plan_finetune, plan_serve
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune, serve
from tests.support.scheduling import tolerates
from tests.support.validation import validate_object

SETTINGS = OperatorSettings()
# GKE taints the GPU nodes of a cluster with other nodes too nvidia.com/gpu=present:NoSchedule
# (GKE docs, "Run GPUs in GKE Standard node pools"); Spot nodes cloud.google.com/gke-spot=true:NoSchedule.
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
SPOT_TAINT = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}


def no_tpu(obj) -> None:
    text = json.dumps(obj)
    assert "google.com/tpu" not in text and "gke-tpu" not in text, "no TPU resource, label or toleration"


def train(b, settings=SETTINGS):
    p = plan_finetune(b.name, "ns", b.spec, settings, b.obj()["metadata"].get("labels"))
    objs = training_objects(p, settings)
    for obj in objs:
        validate_object(obj)
    return p, objs[1]


@pytest.mark.parametrize("count", [1, 2, 8])
def test_a_training_pod_asks_for_its_gpus_on_the_accelerator_s_nodes(count):
    p, job = train(finetune("ft").gpu("nvidia-h100-80gb", count))
    assert job["kind"] == "Job"
    pod = job["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == str(count) == c["resources"]["requests"]["nvidia.com/gpu"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert tolerates(pod, GPU_TAINT) and not tolerates(pod, SPOT_TAINT)
    assert c["image"] == SETTINGS.images.workloads_cuda
    # JAX takes the share of each GPU's memory the HBM fit planned for, not its own 75 %.
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.9"
    assert p.train.mesh.fsdp * p.train.mesh.tp == count and p.train.num_hosts == 1
    no_tpu(job)


def test_spot_gpus_tolerate_the_spot_taint_and_a_node_pool_pins_them():
    _, job = train(finetune("ft").gpu("nvidia-h200-141gb", 8, spot=True, nodePool="h200-spot"))
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-accelerator": "nvidia-h200-141gb",
        "cloud.google.com/gke-spot": "true",
        "cloud.google.com/gke-nodepool": "h200-spot",
    }
    assert tolerates(pod, GPU_TAINT) and tolerates(pod, SPOT_TAINT)
    assert pod["terminationGracePeriodSeconds"] == SETTINGS.spot_termination_grace_seconds


def test_kueue_admits_gpu_training_as_it_admits_tpu_training():
    _, job = train(finetune("ft").gpu("nvidia-h100-80gb", 2).label(common.QUEUE_LABEL, "gpu-h100"))
    assert job["metadata"]["labels"][common.QUEUE_LABEL] == "gpu-h100"
    _, job = train(finetune("ft").gpu("nvidia-h100-80gb", 2), OperatorSettings(kueue_queue="team"))
    assert job["metadata"]["labels"][common.QUEUE_LABEL] == "team"


def test_the_training_memory_request_is_the_host_plan_s():
    p, job = train(finetune("ft").gpu("nvidia-h100-80gb", 2))
    [c] = job["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["memory"] == p.host.memory_request == c["resources"]["requests"]["memory"]
    assert training.names(p)[0] == job["metadata"]["name"]


def render_serve(b, settings=SETTINGS):
    p = plan_serve(b.name, "ns", b.spec, settings, fine_tune_preset="gemma4-31b")
    objs = serving_objects(p, settings)
    for obj in objs:
        validate_object(obj)
    return p, {o["kind"]: o for o in objs}


def test_a_gpu_server_is_vllm_tensor_parallel_over_its_gpus():
    p, objs = render_serve(serve("s").gpu("nvidia-h100-80gb", 2).set("compilationCache", {"pvc": "cache"}))
    dep = objs["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert c["image"] == SETTINGS.images.serving_gpu
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "--tensor-parallel-size=2" in c["args"] and "--disable-chunked-mm-input" not in c["args"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"} and tolerates(pod, GPU_TAINT)
    # The same readiness as on TPU: /v1/models, within the startup budget.
    assert c["readinessProbe"]["httpGet"]["path"] == "/v1/models"
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] <= p.startup_seconds
    # vLLM on CUDA keeps what it compiles under VLLM_CACHE_ROOT (vllm/envs.py); the XLA cache path is TPU's.
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["VLLM_CACHE_ROOT"] == f"/xla-cache/{compile_cache_key(p)}" and "VLLM_XLA_CACHE_PATH" not in env
    no_tpu(dep)
    assert objs["Service"]["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
