"""The serving workload: vLLM (TPU v6e, NVIDIA GPUs, or vLLM's CPU build) and the Service in front of it.

One host per replica is a Deployment. A slice of several hosts is a LeaderWorkerSet, as in the
LWS vLLM-TPU example: each group is one replica, the leader starts a Ray head and vLLM with
tensor parallelism over every chip of the slice, the workers join its Ray cluster, and the group
restarts as a whole. Rollouts replace pods in place (maxSurge 0) unless the spec says otherwise:
spare TPU slices are rarely there.
"""

from __future__ import annotations

import shlex
from typing import Any

from gemma_operator import api, tpu
from gemma_operator.children import common
from gemma_operator.children.model_delivery import Delivery, delivery
from gemma_operator.children.vllm import API_KEY_ENV, Device, VllmLaunch, vllm_container
from gemma_operator.mounts import CACHE_DIR, TMP_DIR
from gemma_operator.plan import ServePlan
from gemma_operator.settings import OperatorSettings

CONTAINER = "vllm"
PORT = 8000
REVISION_ANNOTATION = f"{common.PREFIX}/revision"
MODEL_ANNOTATION = f"{common.PREFIX}/model-uri"
ROLE_LABEL = f"{common.PREFIX}/role"
# A multi-host TPU node pool is one slice, and the chips of a group must be one slice: LWS then
# schedules each group into a node pool of its own (kubernetes-sigs/lws: api/leaderworkerset/v1
# ExclusiveKeyAnnotationKey; its docs give cloud.google.com/gke-nodepool as the example key).
EXCLUSIVE_TOPOLOGY = "leaderworkerset.sigs.k8s.io/exclusive-topology"


# A LeaderWorkerSet's groups are StatefulSets `<lws>-<group>` whose pods are `<lws>-<group>-<index>`
# and carry `controller-revision-hash=<statefulset>-<hash of up to 10>` (kubernetes-sigs/lws
# pkg/controllers; kubernetes pkg/controller/history): a label value and a hostname, 63 at most.
# Groups are replicas, at most 1000 (api.GemmaServeSpec), so 3 digits.
LWS_RESERVE = len("-999") + len("-") + 10


def name(plan: ServePlan) -> str:
    """The workload, Service, HPA and PodMonitor name (a Service name is a DNS-1035 label)."""
    return common.child_name(plan.name, "vllm", reserve=LWS_RESERVE if plan.multi_host else 0)


def resource_labels(plan: ServePlan) -> dict[str, str]:
    """The labels of every object a GemmaServe owns."""
    return common.labels(api.SERVE, plan.name, "serving")


def selector(plan: ServePlan) -> dict[str, str]:
    """The pods that answer requests: every Deployment pod, or the leaders of an LWS."""
    keep = ("app.kubernetes.io/instance", common.COMPONENT_LABEL, common.SERVE_LABEL)
    out = {k: v for k, v in resource_labels(plan).items() if k in keep}
    if plan.multi_host:
        out[ROLE_LABEL] = "leader"
    return out


def device(plan: ServePlan) -> Device:
    """vLLM's device: TPU chips, GPUs, or the CPU."""
    if plan.placement.gpus:
        return "gpu"
    return "tpu" if plan.placement.slice else "cpu"


def launch(plan: ServePlan, model: str) -> VllmLaunch:
    v = plan.spec.vllm
    extra = (("--distributed-executor-backend=ray",) if plan.multi_host else ()) + tuple(v.extra_args)
    return VllmLaunch(
        model=model,
        served_name=plan.served_name,
        device=device(plan),
        tensor_parallel_size=plan.tensor_parallel,
        max_model_len=v.max_model_len,
        max_num_seqs=v.max_num_seqs,
        max_num_batched_tokens=v.max_num_batched_tokens,
        gpu_memory_utilization=v.gpu_memory_utilization,
        dtype=v.dtype,
        port=PORT,
        extra_args=extra,
        api_key_secret=v.api_key_secret_ref,
        engine_ready_timeout_s=plan.startup_seconds,
    )


# tpu-inference (tpu_inference/platforms/tpu_platform.py, check_and_update_config) forces a
# single-process executor unless TPU_MULTIHOST_BACKEND=ray, whatever --distributed-executor-backend
# says; upstream multi-host launchers set it on the leader and on every worker.
MULTIHOST_ENV = {"TPU_MULTIHOST_BACKEND": "ray"}


def ray_command(script: str, role_args: str, then: list[str] | None = None) -> list[str]:
    """Run the image's Ray launcher: a worker becomes it, a leader runs it to form the cluster and
    then becomes vLLM. A missing script, or a leader's failed launch, ends the container with a
    message saying which (the termination message falls back to the log).

    The launcher gives up after --ray_init_timeout, 300 s by default (vllm examples
    online_serving/ and ray_serving/multi-node-serving.sh): less than a slice takes to come up
    when its nodes are provisioned or its image pulled, so the roles pass the startup budget."""
    q = shlex.quote(script)
    missing = shlex.quote(
        f"gemma-tpu: the Ray launcher {script} is not in this image; set "
        "images.serving_tpu_ray_script to where the serving image has multi-node-serving.sh"
    )
    line = f"test -f {q} || {{ echo {missing} >&2; exit 1; }}; "
    if not then:
        return ["sh", "-c", f"{line}exec bash {q} {role_args}"]
    failed = shlex.quote(f"gemma-tpu: {script} {role_args.split()[0]} failed: the Ray cluster did not form")
    return ["sh", "-c", f"{line}bash {q} {role_args} || {{ echo {failed} >&2; exit 1; }}; exec {shlex.join(then)}"]


def _probe(path: str, api_key: bool) -> dict[str, Any]:
    """An HTTP probe; with an API key vLLM answers /v1/* with 401, so the probe presents the key."""
    if not api_key or not path.startswith("/v1/"):
        return {"httpGet": {"path": path, "port": PORT}}
    script = (
        f"import os, urllib.request as r; r.urlopen(r.Request('http://127.0.0.1:{PORT}{path}', headers={{'Authorization': "
        f"'Bearer ' + os.environ['{API_KEY_ENV}']}}), timeout=5)"
    )
    return {"exec": {"command": ["python3", "-c", script]}}


def _resources(plan: ServePlan, settings: OperatorSettings) -> dict[str, Any]:
    r = settings.resources
    resource = plan.placement.resource
    if resource is None:
        return {
            "requests": {"cpu": r.cpu_profile_cpu, "memory": r.cpu_profile_memory},
            "limits": {"memory": r.cpu_profile_memory},
        }
    amounts = {
        "memory": r.serving_memory,
        resource: str(plan.placement.chips_per_host),
        **common.staging_storage(plan.staging),
    }
    return {"requests": {"cpu": r.serving_cpu, **amounts}, "limits": amounts}


def _pod(plan: ServePlan, settings: OperatorSettings, role: str) -> dict[str, Any]:
    """The pod template of a server (role "server" or "leader") or of a multi-host "worker"."""
    model = delivery(plan)
    command, args, env = vllm_container(launch(plan, model.model_arg))
    shm, shm_mount = common.shm_volume()
    store_volumes, store_mounts = common.storage_volume(plan.spec.storage)
    staging_volumes, staging_mounts = common.staging_volume(plan.staging, resource_labels(plan))
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": plan.image,
        "env": env + _env(plan, model),
        "resources": _resources(plan, settings),
        "volumeMounts": [
            *model.mounts,
            shm_mount,
            *staging_mounts,
            *store_mounts,
            {"name": "cache", "mountPath": CACHE_DIR},
            {"name": "tmp", "mountPath": TMP_DIR},
        ],
        "securityContext": {**common.RESTRICTED_CONTAINER, "readOnlyRootFilesystem": True},
    }
    if plan.multi_host:
        container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    container.update(_role(plan, settings, role, command, args))
    volumes = [
        *model.volumes,
        shm,
        *staging_volumes,
        *store_volumes,
        {"name": "cache", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
    ]
    spec = common.place(
        {
            "containers": [container],
            "volumes": volumes,
            "automountServiceAccountToken": False,  # vLLM needs no Kubernetes API
        },
        plan.placement,
        plan.service_account,
    )
    common.every_pod(spec, settings)
    return {"metadata": _pod_metadata(plan, model, role), "spec": spec}


def _env(plan: ServePlan, model: Delivery) -> list[dict[str, Any]]:
    """The model's delivery, the multi-host runtime, the caches and staging, and the Hugging Face token."""
    env = list(model.env)
    if plan.multi_host:
        env += common.env_list(MULTIHOST_ENV)
    caches = {"HOME": CACHE_DIR, "XDG_CACHE_HOME": CACHE_DIR, "HF_HOME": f"{CACHE_DIR}/huggingface"}
    env += common.env_list({**caches, **(plan.staging.env if plan.staging else {})})
    if plan.spec.model.hf_token_secret_ref:
        env.append(common.secret_env("HF_TOKEN", plan.spec.model.hf_token_secret_ref))
    return env


def _role(
    plan: ServePlan, settings: OperatorSettings, role: str, command: list[str], args: list[str]
) -> dict[str, Any]:
    """The container's command by role; the server and the leader also serve, so they get the port and probes."""
    script, wait = settings.images.serving_tpu_ray_script, f"--ray_init_timeout={plan.startup_seconds}"
    if role == "worker":
        return {"command": ray_command(script, f"worker --ray_address=$(LWS_LEADER_ADDRESS) {wait}")}
    if role == "leader":
        out = {"command": ray_command(script, f"leader --ray_cluster_size=$(LWS_GROUP_SIZE) {wait}", command + args)}
    else:
        out = {"command": command, "args": args}
    keyed = plan.spec.vllm.api_key_secret_ref is not None
    return {
        **out,
        "ports": [{"containerPort": PORT, "name": "http"}],
        "startupProbe": _timed(_probe("/v1/models", keyed), 10, plan.startup_seconds // 10),
        "readinessProbe": _timed(_probe("/v1/models", keyed), 10, 3),
        "livenessProbe": _timed(_probe("/health", keyed), 30, 5),
    }


def _timed(probe: dict[str, Any], period: int, failures: int) -> dict[str, Any]:
    return {**probe, "periodSeconds": period, "failureThreshold": failures, "timeoutSeconds": 5}


def _pod_metadata(plan: ServePlan, model: Delivery, role: str) -> dict[str, Any]:
    """Labels (the role of a multi-host pod, the queue) and annotations (the revision, the model, scraping)."""
    labels = resource_labels(plan)
    if plan.multi_host:
        labels[ROLE_LABEL] = role
    if plan.queue:
        labels[common.QUEUE_LABEL] = plan.queue
    annotations = {**model.annotations, REVISION_ANNOTATION: plan.revision, MODEL_ANNOTATION: plan.model_uri or ""}
    if role != "worker":
        annotations.update(
            {"prometheus.io/scrape": "true", "prometheus.io/port": str(PORT), "prometheus.io/path": "/metrics"}
        )
    return {"labels": labels, "annotations": annotations}


def workload(plan: ServePlan, settings: OperatorSettings, owner: dict | None) -> dict[str, Any]:
    """A Deployment (one host per replica) or a LeaderWorkerSet (a multi-host slice per replica)."""
    meta = common.metadata(name(plan), plan.namespace, resource_labels(plan), owner)
    if plan.queue:
        meta["labels"][common.QUEUE_LABEL] = plan.queue
    r = plan.spec.rollout
    replicas = {} if plan.spec.autoscaling else {"replicas": plan.spec.replicas}  # the HPA owns replicas
    if not plan.multi_host:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                **replicas,
                "selector": {"matchLabels": selector(plan)},
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": r.max_surge, "maxUnavailable": r.max_unavailable},
                },
                "progressDeadlineSeconds": plan.startup_seconds + 600,
                "template": _pod(plan, settings, "server"),
            },
        }
    meta["annotations"] = {EXCLUSIVE_TOPOLOGY: tpu.NODE_POOL_LABEL}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": meta,
        "spec": {
            **replicas,
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxSurge": r.max_surge, "maxUnavailable": r.max_unavailable},
            },
            "leaderWorkerTemplate": {
                "size": plan.placement.hosts,
                "restartPolicy": "RecreateGroupOnPodRestart",  # a slice serves as a whole or not at all
                "leaderTemplate": _pod(plan, settings, "leader"),
                "workerTemplate": _pod(plan, settings, "worker"),
            },
        },
    }


def pod_template(obj: dict[str, Any]) -> dict[str, Any]:
    """The template whose annotations carry the revision: the Deployment's, or the LWS leader's."""
    if obj["kind"] == "LeaderWorkerSet":
        return obj["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    return obj["spec"]["template"]


def service(plan: ServePlan, owner: dict | None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": common.metadata(name(plan), plan.namespace, resource_labels(plan), owner),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(plan),
            "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def endpoint(plan: ServePlan) -> str:
    return f"http://{name(plan)}.{plan.namespace}.svc:{PORT}/v1"
