"""The merge workload: a CPU Job that streams the base checkpoint and the LoRA checkpoint into
merged Hugging Face safetensors. It needs no TPU, so it runs on the merge node pool; its memory
is sized from the model (see plan._merge_memory_gib), not from the model's full size."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from gemma_operator import api, reasons
from gemma_operator.children import common
from gemma_operator.children.model_delivery import fuse_volume, split_gcs, writable_options
from gemma_operator.model_uri import HF_SCHEME, ModelUri
from gemma_operator.mounts import CONFIG_DIR, MERGE_CONFIG_FILE, fuse_path
from gemma_operator.plan import FineTunePlan
from gemma_operator.settings import OperatorSettings
from gemma_workloads.config import EXIT_INVALID_INPUT, MERGE_SHARD_WRITERS

CONTAINER = "merge"


def name(plan: FineTunePlan) -> str:
    """One merge per run and merge settings: a new run never finds an earlier run's merge."""
    return common.child_name(plan.name, "merge", plan.run, plan.merge_id)


def _labels(plan: FineTunePlan) -> dict[str, str]:
    return common.labels(api.FINETUNE, plan.name, "merge", plan.run)


def config_map(plan: FineTunePlan, owner: dict | None, checkpoint_step: int | None = None) -> dict[str, Any]:
    """The MergeConfig, pinned to the step training reported when it is known."""
    config = plan.merge.model_copy(update={"step": checkpoint_step}) if checkpoint_step is not None else plan.merge
    return common.config_map(name(plan), plan.namespace, _labels(plan), owner, {MERGE_CONFIG_FILE: config.dumps()})


def fuse_sidecar_storage(shard_size_bytes: int) -> str:
    """The FUSE sidecar stages each file being written on its ephemeral storage until it is closed,
    and the merge writes MERGE_SHARD_WRITERS shards at once; the driver's default limit is 5Gi
    (gcs-fuse-csi-driver cmd/webhook/main.go), less than two 5 GB shards."""
    return f"{math.ceil(MERGE_SHARD_WRITERS * shard_size_bytes / 2**30) + 1}Gi"


def _output_mount(plan: FineTunePlan, settings: OperatorSettings) -> tuple[list[dict], list[dict], dict[str, str]]:
    """A gs:// output bucket, mounted read-write with Cloud Storage FUSE where MergeConfig expects it,
    owned by the pod's user, with a sidecar sized for the shards in flight."""
    if not plan.merged_dir.startswith("gs://"):
        return [], [], {}
    bucket = f"gs://{split_gcs(plan.merged_dir)[0]}"
    volume = fuse_volume(
        "output", bucket, read_only=False, extra_options=writable_options(settings.workload_user), attributes={}
    )
    mount = {"name": "output", "mountPath": fuse_path(bucket)}
    annotations = {
        "gke-gcsfuse/volumes": "true",
        "gke-gcsfuse/ephemeral-storage-limit": fuse_sidecar_storage(plan.merge.shard_size_bytes),
        "gke-gcsfuse/memory-limit": settings.merge_fuse_sidecar_memory,
    }
    return [volume], [mount], annotations


def _failure_policy() -> dict[str, Any]:
    """A node's disruption (eviction, preemption) is not the merge's failure; its exit code for bad input ends the Job."""
    return {
        "rules": [
            {"action": "Ignore", "onPodConditions": [{"type": reasons.POD_DISRUPTION_TARGET, "status": "True"}]},
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": [EXIT_INVALID_INPUT]},
            },
        ]
    }


def job(plan: FineTunePlan, settings: OperatorSettings, owner: dict | None) -> dict[str, Any]:
    job_name = name(plan)
    cfg_volume, cfg_mount = common.config_volume(job_name)
    store_volumes, store_mounts = common.storage_volume(plan.spec.storage)
    memory = f"{plan.merge_memory_gib}Gi"
    fuse_volumes, fuse_mounts, annotations = _output_mount(plan, settings)
    # An hf:// base is downloaded before it is read, onto a disk sized for it; gs:// is read in place.
    # The merge runs on CPU nodes, not on the slice: the general staging StorageClass applies.
    staged = None
    if plan.host and ModelUri.parse(plan.merge.base_model_path).scheme == HF_SCHEME:
        staged = replace(plan.host, storage_class=settings.training_host.staging_storage_class)
    staging_volumes, staging_mounts = common.staging_volume(staged, _labels(plan))
    env = common.env_list(staged.env if staged else {})
    if plan.spec.model.hf_token_secret_ref:
        env.append(common.secret_env("HF_TOKEN", plan.spec.model.hf_token_secret_ref))
    container = {
        "name": CONTAINER,
        "image": plan.merge_image,
        "command": ["python", "-m", "gemma_workloads", "merge", "--config", f"{CONFIG_DIR}/{MERGE_CONFIG_FILE}"],
        "env": env,
        "resources": {
            "requests": {"cpu": str(plan.merge.workers), "memory": memory, **common.staging_storage(staged)},
            "limits": {"memory": memory, **common.staging_storage(staged)},
        },
        "volumeMounts": [cfg_mount, *staging_mounts, *store_mounts, *fuse_mounts],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": dict(common.RESTRICTED_CONTAINER),
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [cfg_volume, *staging_volumes, *store_volumes, *fuse_volumes],
    }
    common.every_pod(pod_spec, settings)
    if settings.merge_node_selector:
        pod_spec["nodeSelector"] = dict(settings.merge_node_selector)
    if plan.service_account:
        pod_spec["serviceAccountName"] = plan.service_account
    meta = common.metadata(job_name, plan.namespace, _labels(plan), owner)
    if plan.merge_queue:  # never the training queue: its flavor may ask for TPU nodes
        meta["labels"][common.QUEUE_LABEL] = plan.merge_queue
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            # The merge resumes where it stopped, so a retry is cheap; bad input is not retried.
            "backoffLimit": 2,
            "podFailurePolicy": _failure_policy(),
            "template": {
                "metadata": {"labels": _labels(plan), **({"annotations": annotations} if annotations else {})},
                "spec": pod_spec,
            },
        },
    }
