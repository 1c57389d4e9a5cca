"""Where the operator mounts volumes in its pods, and the rule a spec's own volume must keep.

The API server refuses a pod with two mounts at one path (Kubernetes pkg/apis/core/validation,
volumeMounts: mountPath "must be unique"), so spec.storage.mountPath is checked against these
before anything is scheduled, not found out when the Deployment or Job is created.
"""

from __future__ import annotations

import posixpath

from gemma_operator import api

CONFIG_DIR = "/etc/gemma-tpu"  # where the pods find their workload config
TRAIN_CONFIG_FILE = "train.json"
MERGE_CONFIG_FILE = "merge.json"
GCS_MOUNT_ROOT = "/gcs"  # where a Cloud Storage FUSE mount puts a bucket a workload writes files to
SHM_DIR = "/dev/shm"
# What the vLLM pods mount besides spec.storage: the served model, the XLA cache, HOME's caches, /tmp.
MODEL_MOUNT = "/models/model"
XLA_CACHE_MOUNT = "/xla-cache"
CACHE_DIR = "/cache"
TMP_DIR = "/tmp"
SERVING = (MODEL_MOUNT, XLA_CACHE_MOUNT, SHM_DIR, CACHE_DIR, TMP_DIR)


def fuse_path(uri: str) -> str:
    """A gs:// URI as seen through a Cloud Storage FUSE mount of its bucket (other paths unchanged)."""
    return f"{GCS_MOUNT_ROOT}/{uri.removeprefix('gs://')}" if uri.startswith("gs://") else uri


def storage_problems(storage: api.Storage | None, taken: tuple[str, ...], tree: str | None = None) -> list[str]:
    """spec.storage.mountPath may be none of `taken`, nor inside `tree` (where buckets are mounted)."""
    if storage is None:
        return []
    path = posixpath.normpath(storage.mount_path)
    if path in taken or (tree and (path == tree or path.startswith(tree + "/"))):
        return [
            f"spec.storage.mountPath: {storage.mount_path} is where the operator mounts its own volumes "
            f"({', '.join((*taken, tree) if tree else taken)}); choose another path"
        ]
    return []
