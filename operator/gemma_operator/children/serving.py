"""The serving workload: a vLLM Deployment (TPU v6e, or vLLM's CPU build) and its Service."""

from __future__ import annotations

from typing import Any

from gemma_operator import api, tpu
from gemma_operator.children import common
from gemma_operator.children.vllm import API_KEY_ENV, VllmLaunch, vllm_container
from gemma_operator.models import PRESETS
from gemma_operator.plan import ServePlan
from gemma_operator.settings import OperatorSettings

CONTAINER = "vllm"
PORT = 8000
MODEL_MOUNT = "/models/model"
XLA_CACHE_MOUNT = "/xla-cache"
REVISION_ANNOTATION = f"{common.PREFIX}/revision"
MODEL_ANNOTATION = f"{common.PREFIX}/model-uri"
GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"


def name(plan: ServePlan) -> str:
    return common.child_name(plan.name, "vllm")


def _labels(plan: ServePlan) -> dict[str, str]:
    return common.labels(api.SERVE, plan.name, "serving")


def selector(plan: ServePlan) -> dict[str, str]:
    keep = ("app.kubernetes.io/instance", common.COMPONENT_LABEL, common.SERVE_LABEL)
    return {k: v for k, v in _labels(plan).items() if k in keep}


def startup_budget_seconds(plan: ServePlan) -> int:
    """Loading plus XLA compilation grows with the model: 5 minutes plus 20 s per billion
    parameters (15 minutes for 31B; the seed paper saw ~10 on first start), 30 when unknown."""
    if plan.placement.slice is None:
        return 600
    shape = PRESETS.get(plan.preset or "")
    if shape is None:
        return 1800
    return max(600, int(300 + 20 * shape.params / 1e9))


def _split_gcs(uri: str) -> tuple[str, str]:
    bucket, _, path = uri.removeprefix("gs://").partition("/")
    return bucket, path.strip("/")


def _model_delivery(plan: ServePlan) -> tuple[str, list[dict], list[dict], dict[str, str]]:
    """(--model value, volumes, mounts, pod annotations) for where the model lives."""
    uri = plan.model_uri or ""
    if uri.startswith("hf://"):
        return uri.removeprefix("hf://"), [], [], {}
    if uri.startswith("gs://"):
        bucket, path = _split_gcs(uri)
        options = ["implicit-dirs"] + ([f"only-dir={path}"] if path else [])
        volume = {
            "name": "model",
            "csi": {
                "driver": GCSFUSE_DRIVER,
                "readOnly": True,
                "volumeAttributes": {"bucketName": bucket, "mountOptions": ",".join(options)},
            },
        }
        annotations = {"gke-gcsfuse/volumes": "true"}
        return MODEL_MOUNT, [volume], [{"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}], annotations
    return uri, [], [], {}


def launch(plan: ServePlan, model: str) -> VllmLaunch:
    v = plan.spec.vllm
    return VllmLaunch(
        model=model, served_name=plan.served_name, device="cpu" if plan.placement.slice is None else "tpu",
        tensor_parallel_size=plan.tensor_parallel, max_model_len=v.max_model_len, max_num_seqs=v.max_num_seqs,
        max_num_batched_tokens=v.max_num_batched_tokens, gpu_memory_utilization=v.gpu_memory_utilization,
        dtype=v.dtype, port=PORT, extra_args=tuple(v.extra_args), api_key_secret=v.api_key_secret_ref,
    )  # fmt: skip


def _probe(path: str, api_key: bool) -> dict[str, Any]:
    """An HTTP probe; with an API key vLLM answers /v1/* with 401, so the probe presents the key."""
    if not api_key or not path.startswith("/v1/"):
        return {"httpGet": {"path": path, "port": PORT}}
    script = ("import os, urllib.request as r; r.urlopen(r.Request('http://127.0.0.1:%d%s', headers={'Authorization': "
              "'Bearer ' + os.environ['%s']}), timeout=5)" % (PORT, path, API_KEY_ENV))  # fmt: skip
    return {"exec": {"command": ["python3", "-c", script]}}


def deployment(plan: ServePlan, settings: OperatorSettings, owner: dict | None) -> dict[str, Any]:
    model_arg, volumes, mounts, annotations = _model_delivery(plan)
    shm, shm_mount = common.shm_volume()
    store_volumes, store_mounts = common.storage_volume(plan.spec.storage)
    command, args, env = vllm_container(launch(plan, model_arg))
    keyed = plan.spec.vllm.api_key_secret_ref is not None
    if plan.spec.model.hf_token_secret_ref:
        env.append(common.secret_env("HF_TOKEN", plan.spec.model.hf_token_secret_ref))
    r = settings.resources
    if plan.placement.slice is None:
        resources = {"requests": {"cpu": r.cpu_profile_cpu, "memory": r.cpu_profile_memory},
                     "limits": {"memory": r.cpu_profile_memory}}  # fmt: skip
    else:
        chips = str(plan.placement.chips_per_host)
        resources = {"requests": {"cpu": r.serving_cpu, "memory": r.serving_memory, tpu.TPU_RESOURCE: chips},
                     "limits": {"memory": r.serving_memory, tpu.TPU_RESOURCE: chips}}  # fmt: skip
    budget = startup_budget_seconds(plan)
    container = {
        "name": CONTAINER,
        "image": plan.image,
        "command": command,
        "args": args,
        "env": env,
        "ports": [{"containerPort": PORT, "name": "http"}],
        "resources": resources,
        "volumeMounts": [*mounts, shm_mount, *store_mounts],
        # /health answers before the model is loaded; /v1/models only once it is served.
        "startupProbe": {**_probe("/v1/models", keyed), "periodSeconds": 10, "failureThreshold": budget // 10},
        "readinessProbe": {**_probe("/v1/models", keyed), "periodSeconds": 10, "failureThreshold": 3, "timeoutSeconds": 5},
        "livenessProbe": {**_probe("/health", keyed), "periodSeconds": 30, "failureThreshold": 5, "timeoutSeconds": 5},
        "securityContext": dict(common.RESTRICTED_CONTAINER),
    }  # fmt: skip
    pod_spec = common.place(
        {"containers": [container], "volumes": [*volumes, shm, *store_volumes]}, plan.placement, plan.service_account
    )
    pod_labels = _labels(plan)
    if plan.queue:
        pod_labels[common.QUEUE_LABEL] = plan.queue
    pod_annotations = {**annotations, REVISION_ANNOTATION: plan.revision, MODEL_ANNOTATION: plan.model_uri or ""}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": common.metadata(name(plan), plan.namespace, _labels(plan), owner),
        "spec": {
            "replicas": plan.spec.replicas,
            "selector": {"matchLabels": selector(plan)},
            # TPUs are scarce: replace pods in place rather than surge onto capacity that is not there.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "progressDeadlineSeconds": budget + 600,
            "template": {"metadata": {"labels": pod_labels, "annotations": pod_annotations}, "spec": pod_spec},
        },
    }


def service(plan: ServePlan, owner: dict | None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": common.metadata(name(plan), plan.namespace, _labels(plan), owner),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(plan),
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def endpoint(plan: ServePlan) -> str:
    return f"http://{name(plan)}.{plan.namespace}.svc:{PORT}/v1"
