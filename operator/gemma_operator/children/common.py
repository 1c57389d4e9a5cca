"""What every child object shares: names, labels, owner references, volumes."""

from __future__ import annotations

import hashlib
from typing import Any

from gemma_operator import api
from gemma_operator.host import STAGING_DIR, HostPlan
from gemma_operator.mounts import CONFIG_DIR, SHM_DIR
from gemma_operator.settings import OperatorSettings

MANAGED_BY = "gemma-tpu-operator"
PREFIX = api.GROUP  # label/annotation prefix, e.g. gemma-tpu.dev/finetune
FINETUNE_LABEL = f"{PREFIX}/finetune"
SERVE_LABEL = f"{PREFIX}/serve"
RUN_LABEL = f"{PREFIX}/run"
COMPONENT_LABEL = "app.kubernetes.io/component"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MAX_NAME = 63  # a DNS label, and a label value


def child_name(parent: str, *suffix: str, reserve: int = 0) -> str:
    """`<parent>-<suffix>` as a DNS-1035 label (a letter first, no dots) that leaves `reserve`
    characters of the 63 for what a controller appends to it (training.jobset_reserve, serving.LWS_RESERVE).

    A CR name is any DNS-1123 subdomain (up to 253 characters, dots, a leading digit): when it
    does not fit as it is, it is shortened and a hash of the whole name keeps children of
    different CRs apart; the full name stays in the `app.kubernetes.io/instance`-style labels.
    """
    limit = MAX_NAME - reserve
    full = "-".join((parent, *suffix))
    base = parent.replace(".", "-")
    if not base[0].isalpha():
        base = "g" + base
    if base == parent and len(full) <= limit:
        return full
    tail = "".join(f"-{s}" for s in suffix)
    h = hashlib.sha256(full.encode()).hexdigest()[:6]
    keep = limit - len(tail) - len(h) - 1
    return f"{base[:keep].rstrip('-')}-{h}{tail}"


def label_value(value: str) -> str:
    """A CR name as a label value: itself when it fits, else a prefix and a hash of the whole."""
    if len(value) <= MAX_NAME:
        return value
    return f"{value[: MAX_NAME - 7].rstrip('-.')}-{hashlib.sha256(value.encode()).hexdigest()[:6]}"


def labels(kind: api.Kind, parent: str, component: str, run: str | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": "gemma",
        "app.kubernetes.io/instance": label_value(parent),
        COMPONENT_LABEL: component,
        "app.kubernetes.io/part-of": "gemma-tpu",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        (FINETUNE_LABEL if kind is api.FINETUNE else SERVE_LABEL): label_value(parent),
    }
    if run:
        out[RUN_LABEL] = run
    return out


def owner_reference(kind: api.Kind, name: str, uid: str) -> dict[str, Any]:
    """Children are garbage-collected with their CR; artifacts are not Kubernetes objects."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": kind.kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(name: str, namespace: str, labels_: dict[str, str], owner: dict[str, Any] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels_)}
    if owner:
        meta["ownerReferences"] = [owner]
    return meta


def config_map(name: str, namespace: str, labels_: dict[str, str], owner: dict | None, data: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(name, namespace, labels_, owner),
        "data": data,
    }


def config_volume(config_map_name: str) -> tuple[dict, dict]:
    """The workload config, mounted read-only where the pod's command reads it."""
    volume = {"name": "config", "configMap": {"name": config_map_name}}
    mount = {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}
    return volume, mount


def shm_volume(size_limit: str | None = None) -> tuple[dict, dict]:
    """JAX and vLLM use /dev/shm; the container default (64 MiB) is too small. Its files count
    against the container's memory limit, hence the optional bound."""
    empty_dir = {"medium": "Memory", **({"sizeLimit": size_limit} if size_limit else {})}
    return {"name": "dshm", "emptyDir": empty_dir}, {"name": "dshm", "mountPath": SHM_DIR}


def storage_volume(storage: api.Storage | None) -> tuple[list[dict], list[dict]]:
    if storage is None:
        return [], []
    volume = {"name": "storage", "persistentVolumeClaim": {"claimName": storage.persistent_volume_claim}}
    return [volume], [{"name": "storage", "mountPath": storage.mount_path}]


def staging_volume(host: HostPlan | None, labels_: dict[str, str]) -> tuple[list[dict], list[dict]]:
    """A disk for a gs:// or hf:// model, sized from it: a volume claimed with the pod (deleted
    with it, of the plan's StorageClass), or the node's disk; never memory."""
    if host is None or host.staging_size is None:
        return [], []
    if host.staging_volume == "emptyDir":
        source: dict[str, Any] = {"emptyDir": {"sizeLimit": host.staging_size}}
    else:
        claim: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": host.staging_size}},
        }
        if host.storage_class:
            claim["storageClassName"] = host.storage_class
        source = {"ephemeral": {"volumeClaimTemplate": {"metadata": {"labels": dict(labels_)}, "spec": claim}}}
    return [{"name": "staging", **source}], [{"name": "staging", "mountPath": STAGING_DIR}]


def staging_storage(host: HostPlan | None) -> dict[str, str]:
    """The ephemeral-storage a pod staging its model on the node's disk requests (and is limited to)."""
    if host is None or host.staging_volume != "emptyDir" or host.staging_size is None:
        return {}
    return {"ephemeral-storage": host.staging_size}


def secret_env(name: str, ref: api.SecretKeyRef) -> dict[str, Any]:
    """An env var read from a Secret: the value never appears in the CR, args or status."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def env_list(values: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in sorted(values.items())]


def place(pod_spec: dict[str, Any], placement: Any, service_account: str | None) -> dict[str, Any]:
    """Node selector, TPU toleration and ServiceAccount of a pod spec, from its plan."""
    if placement.node_selector:
        pod_spec["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in placement.tolerations]
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    return pod_spec


def every_pod(pod_spec: dict[str, Any], settings: OperatorSettings) -> dict[str, Any]:
    """What every pod spec the operator creates carries: who it runs as (`workload_pod_security`), and
    the tolerations the platform gives all of them (settings.pod_tolerations) after the placement's."""
    pod_spec["securityContext"] = workload_pod_security(settings)
    if settings.pod_tolerations:
        pod_spec["tolerations"] = [*pod_spec.get("tolerations", []), *(t.manifest() for t in settings.pod_tolerations)]
    return pod_spec


def workload_pod_security(settings: OperatorSettings) -> dict[str, Any]:
    """Who every pod the operator creates runs as (training, merge, serving, benchmark): the images'
    USER, stated so that FUSE mount options can name it and so that an image whose USER is root or a
    name still runs as Pod Security's `restricted` level asks (runAsNonRoot, which the kubelet can only
    check against a numeric user), and fsGroup so that the disks they write (a staging volume, a PVC)
    are theirs: Kubernetes mounts a new volume root-owned unless the pod sets fsGroup (Kubernetes docs,
    "Configure a Security Context for a Pod or Container": fsGroup)."""
    uid = settings.workload_user
    return {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "fsGroupChangePolicy": "OnRootMismatch",
    }


RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
