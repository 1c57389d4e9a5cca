"""The training workload: a Job on a single-host slice (v5p-8) or on GPUs, a JobSet on multi-host slices.

The pod runs `python -m gemma_workloads train --config /etc/gemma-tpu/train.json`, requesting
every chip of its TPU VM, or its GPUs (`nvidia.com/gpu`) of one GPU node. Multi-host slices need the GKE TPU webhook to inject TPU_WORKER_ID and
TPU_WORKER_HOSTNAMES, which it does for Indexed Jobs with a headless-Service subdomain: JobSet
provides both, plus one child Job per node pool (exclusive topology) and gang restarts.
"""

from __future__ import annotations

from typing import Any

from gemma_operator import api, failure_policy, gpu, host, tpu
from gemma_operator.children import common
from gemma_operator.mounts import CONFIG_DIR, TRAIN_CONFIG_FILE
from gemma_operator.plan import FineTunePlan
from gemma_operator.settings import OperatorSettings

CONTAINER = "trainer"
JAX_COORDINATOR_PORT = 8471
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
# What the CR last asked of spec.suspend. Kueue suspends and resumes workloads itself; the
# operator only changes spec.suspend when the CR's own wish changes.
SUSPEND_ANNOTATION = f"{common.PREFIX}/suspend"


REPLICATED_JOB = "slice"


def jobset_reserve(hosts: int) -> int:
    """What JobSet appends to its name: its webhook (kubernetes-sigs/jobset
    pkg/webhooks/jobset_webhook.go) requires the longest pod name,
    `<jobset>-<replicatedJob>-<jobIndex>-<podIndex>-<5 random>`, to be a DNS-1035 label."""
    return len(f"-{REPLICATED_JOB}-0-{hosts - 1}-abcde")


def names(plan: FineTunePlan, attempt: int = 1) -> tuple[str, str]:
    """(workload name, ConfigMap name). A retry after the Job vanished is a new attempt."""
    suffix = ("train", plan.run) if attempt <= 1 else ("train", plan.run, str(attempt))
    name = common.child_name(plan.name, *suffix, reserve=jobset_reserve(plan.placement.hosts) if plan.multi_host else 0)
    return name, name


def config_map(plan: FineTunePlan, owner: dict | None, attempt: int = 1) -> dict[str, Any]:
    _, cm_name = names(plan, attempt)
    return common.config_map(cm_name, plan.namespace, _labels(plan), owner, {TRAIN_CONFIG_FILE: plan.train.dumps()})


def _labels(plan: FineTunePlan) -> dict[str, str]:
    return common.labels(api.FINETUNE, plan.name, "training", plan.run)


def _resources(plan: FineTunePlan, settings: OperatorSettings) -> dict[str, Any]:
    r = settings.resources
    resource = plan.placement.resource
    if resource is None or plan.host is None:  # the cpu profile: no host plan
        amounts = {"cpu": r.cpu_profile_cpu, "memory": r.cpu_profile_memory}
        return {"requests": amounts, "limits": {"memory": r.cpu_profile_memory}}
    chips = str(plan.placement.chips_per_host)
    # Limits equal to requests: the memory the loader was planned for is the memory it gets.
    amounts = {"memory": plan.host.memory_request, resource: chips}
    amounts.update(common.staging_storage(plan.host))
    return {"requests": {"cpu": r.training_cpu, **amounts}, "limits": amounts}


def _device_env(plan: FineTunePlan, settings: OperatorSettings) -> dict[str, str]:
    """On GPUs, the share of each GPU's memory JAX takes: the one the HBM fit planned for."""
    return {gpu.JAX_MEMORY_FRACTION_ENV: f"{settings.hbm_usable_fraction:g}"} if plan.placement.gpus else {}


def pod_template(plan: FineTunePlan, settings: OperatorSettings, config_map_name: str) -> dict[str, Any]:
    cfg_volume, cfg_mount = common.config_volume(config_map_name)
    shm, shm_mount = common.shm_volume(host.SHM_SIZE if plan.host else None)
    store_volumes, store_mounts = common.storage_volume(plan.spec.storage)
    staging_volumes, staging_mounts = common.staging_volume(plan.host, _labels(plan))
    env = common.env_list(
        {**(plan.host.env if plan.host else {}), **_device_env(plan, settings), **settings.training_env}
    )
    if plan.spec.model.hf_token_secret_ref:
        env.append(common.secret_env("HF_TOKEN", plan.spec.model.hf_token_secret_ref))
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": plan.image,
        "command": ["python", "-m", "gemma_workloads", "train", "--config", f"{CONFIG_DIR}/{TRAIN_CONFIG_FILE}"],
        "env": env,
        "resources": _resources(plan, settings),
        "volumeMounts": [cfg_mount, shm_mount, *staging_mounts, *store_mounts],
        # A crash without a result still tells the operator why, from the log's tail.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # Pod Security Standards, "restricted": all capabilities dropped (the trainer's user has none).
        "securityContext": dict(common.RESTRICTED_CONTAINER),
    }
    if plan.multi_host:
        container["ports"] = [{"containerPort": JAX_COORDINATOR_PORT, "name": "jax"}]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": int(plan.train.termination_grace_seconds),
        "containers": [container],
        "volumes": [cfg_volume, shm, *staging_volumes, *store_volumes],
    }
    common.every_pod(common.place(spec, plan.placement, plan.service_account), settings)
    return {"metadata": {"labels": _labels(plan)}, "spec": spec}


def workload(
    plan: FineTunePlan, settings: OperatorSettings, owner: dict | None, attempt: int = 1, budget: int | None = None
) -> dict[str, Any]:
    """The Job (single host) or JobSet (multi-host) that trains, allowed `budget` restarts
    (default: the spec's backoffLimit; later attempts get what earlier ones left)."""
    budget = plan.spec.backoff_limit if budget is None else budget
    name, cm_name = names(plan, attempt)
    meta = common.metadata(name, plan.namespace, _labels(plan), owner)
    meta["annotations"] = {SUSPEND_ANNOTATION: str(plan.spec.suspend).lower()}
    if plan.queue:
        meta["labels"][common.QUEUE_LABEL] = plan.queue
    template = pod_template(plan, settings, cm_name)
    if not plan.multi_host:
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": meta,
            "spec": {
                "backoffLimit": budget,
                "podFailurePolicy": failure_policy.job_pod_failure_policy(CONTAINER),
                "suspend": plan.spec.suspend,
                "template": template,
            },
        }
    hosts = plan.placement.hosts
    meta["annotations"][EXCLUSIVE_TOPOLOGY] = tpu.NODE_POOL_LABEL
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": meta,
        "spec": {
            "suspend": plan.spec.suspend,
            "failurePolicy": failure_policy.jobset_failure_policy(budget),
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "replicatedJobs": [
                {
                    "name": REPLICATED_JOB,
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": hosts,
                            "completions": hosts,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "podFailurePolicy": failure_policy.jobset_job_pod_failure_policy(CONTAINER),
                            "template": template,
                        }
                    },
                }
            ],
        },
    }


def restart_budget(workload: dict) -> int:
    """The restarts a training Job or JobSet was allowed (what `workload` set)."""
    spec = workload.get("spec") or {}
    if workload.get("kind") == "JobSet":
        return int((spec.get("failurePolicy") or {}).get("maxRestarts") or 0)
    return int(spec.get("backoffLimit") or 0)
