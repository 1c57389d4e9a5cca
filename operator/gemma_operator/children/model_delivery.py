"""How the served model and the XLA compilation cache reach the vLLM pods.

- gs:// models: Cloud Storage FUSE CSI ephemeral volume, read-only, scoped to the model's folder
  (`only-dir`), with the driver's file and metadata caches (the weights are read once per pod,
  the metadata never changes under a merged output) and a cache volume in memory by default.
  The sidecar is injected by the `gke-gcsfuse/volumes` pod annotation; its limits are annotations.
  Facts: docs/reference gke-tpu.md section 3.1; the cache attributes are configurable because only
  some of them were verified.
- PVC paths: the spec's storage claim, mounted where the path says.
- hf:// repositories: vLLM downloads them, with HF_TOKEN from a Secret.
- The compilation cache lives on gs:// (FUSE, read-write) or a PVC, in a folder keyed by everything
  that changes the compiled programs (image, slice, vLLM limits), so an upgrade never loads programs
  compiled for something else. On TPU it holds XLA's programs (VLLM_XLA_CACHE_PATH); on GPUs and
  the CPU vLLM's cache root (VLLM_CACHE_ROOT), where its torch.compile artefacts go (vllm/envs.py,
  vllm/compilation/backends.py: VLLM_CACHE_ROOT/torch_compile_cache) and what its model registry
  learnt by importing the model's class in a subprocess (vllm/model_executor/models/registry.py,
  `_LazyRegisteredModel.inspect_model_cls`: VLLM_CACHE_ROOT/modelinfos, keyed on the hash of the
  model's module). On the CPU that subprocess is most of a cold start: 8 to 12 s of the tiny
  model's 30 to 45 s to ready on 2 cores, none once the cache holds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gemma_operator.model_uri import GCS_SCHEME, HF_SCHEME, ModelUri
from gemma_operator.mounts import MODEL_MOUNT, XLA_CACHE_MOUNT
from gemma_operator.plan import ServePlan, digest

GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
# The driver uses a volume of this name, when the pod has one, for its file cache.
FUSE_CACHE_VOLUME = "gke-gcsfuse-cache"
# Where vLLM keeps what it compiles, by device (vllm/envs.py).
CACHE_ENV = {"tpu": "VLLM_XLA_CACHE_PATH", "gpu": "VLLM_CACHE_ROOT", "cpu": "VLLM_CACHE_ROOT"}


def cache_env(plan: ServePlan) -> str:
    """The variable that points vLLM at the compilation cache on this plan's device."""
    return CACHE_ENV["gpu" if plan.placement.gpus else "tpu" if plan.placement.slice else "cpu"]


@dataclass
class Delivery:
    model_arg: str
    volumes: list[dict] = field(default_factory=list)
    mounts: list[dict] = field(default_factory=list)
    env: list[dict] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)


# gcsfuse refuses to rename a directory with more descendants than this (its flag
# rename-dir-limit, default 0) on buckets without hierarchical namespace; the merge publishes its
# output folder by a rename.
RENAME_DIR_LIMIT = 10_000


def writable_options(user: int) -> list[str]:
    """Mount options of a FUSE volume a non-root container writes to: the driver mounts as root
    unless told the owner and modes (gcs-fuse-csi-driver README, "Mount options" for non-root
    containers: uid, gid, file-mode, dir-mode), and writes then fail with "Permission denied"."""
    return [f"uid={user}", f"gid={user}", "file-mode=664", "dir-mode=775", f"rename-dir-limit={RENAME_DIR_LIMIT}"]


def split_gcs(uri: str) -> tuple[str, str]:
    bucket, _, path = uri.removeprefix("gs://").partition("/")
    return bucket, path.strip("/")


def fuse_volume(name: str, uri: str, read_only: bool, extra_options: list[str], attributes: dict[str, str]) -> dict:
    bucket, path = split_gcs(uri)
    options = ["implicit-dirs", *([f"only-dir={path}"] if path else []), *extra_options]
    return {
        "name": name,
        "csi": {
            "driver": GCSFUSE_DRIVER,
            "readOnly": read_only,
            "volumeAttributes": {"bucketName": bucket, "mountOptions": ",".join(options), **attributes},
        },
    }


def fuse_annotations(plan: ServePlan) -> dict[str, str]:
    g = plan.spec.gcs_fuse
    return {
        "gke-gcsfuse/volumes": "true",
        "gke-gcsfuse/cpu-limit": g.sidecar_cpu_limit,
        "gke-gcsfuse/memory-limit": g.sidecar_memory_limit,
        "gke-gcsfuse/ephemeral-storage-limit": g.sidecar_ephemeral_storage_limit,
    }


def compile_cache_key(plan: ServePlan) -> str:
    v = plan.spec.vllm
    return digest(
        {
            "image": plan.image,
            "slice": plan.placement.label,
            "tp": plan.tensor_parallel,
            "maxModelLen": v.max_model_len,
            "maxNumSeqs": v.max_num_seqs,
            "maxNumBatchedTokens": v.max_num_batched_tokens,
            "dtype": v.dtype,
        },
        12,
    )


def delivery(plan: ServePlan) -> Delivery:
    uri = plan.model_uri or ""
    g = plan.spec.gcs_fuse
    source = ModelUri.parse(uri)
    if source.scheme == HF_SCHEME:
        out = Delivery(source.location)
    elif source.scheme == GCS_SCHEME:
        attributes = {
            "fileCacheCapacity": g.file_cache_capacity,
            "fileCacheForRangeRead": "true",
            "metadataStatCacheCapacity": "-1",
            "metadataTypeCacheCapacity": "-1",
            "metadataCacheTTLSeconds": "-1",  # a merged output never changes in place
        }
        volume = fuse_volume("model", uri, True, list(g.mount_options), attributes)
        cache = {"name": FUSE_CACHE_VOLUME, "emptyDir": {"medium": "Memory"} if g.cache_medium == "Memory" else {}}
        out = Delivery(
            MODEL_MOUNT,
            [volume, cache],
            [{"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}],
            annotations=fuse_annotations(plan),
        )
    else:
        out = Delivery(uri)

    cc = plan.spec.compilation_cache
    if cc is not None:
        if cc.uri:
            out.volumes.append(fuse_volume("xla-cache", cc.uri, False, [], {}))
            out.annotations.update(fuse_annotations(plan))
        else:
            out.volumes.append({"name": "xla-cache", "persistentVolumeClaim": {"claimName": cc.pvc}})
        out.mounts.append({"name": "xla-cache", "mountPath": XLA_CACHE_MOUNT})
        out.env.append({"name": cache_env(plan), "value": f"{XLA_CACHE_MOUNT}/{compile_cache_key(plan)}"})
    return out


def describe(plan: ServePlan) -> dict[str, Any]:
    """For `gemma-tpu plan`: where the model and the compile cache come from."""
    d = delivery(plan)
    cache = next((e["value"] for e in d.env if e["name"] == cache_env(plan)), None)
    return {"modelArg": d.model_arg, "compileCache": cache}
