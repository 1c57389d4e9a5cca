"""What both kinds share: the group and version, the bounds of every string and list, the base
models, the pieces both specs use (Secret references, the slice, storage) and the status both
kinds write (message, conditions). Nothing here belongs to one kind."""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from gemma_workloads import config

GROUP = "gemma-tpu.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

Accelerator = Literal["v5p", "v6e", "cpu"]
# GKE's cloud.google.com/gke-accelerator values of the GPUs the operator knows (the catalogue gpu.py).
GpuType = Literal["nvidia-h100-80gb", "nvidia-h100-mega-80gb", "nvidia-h200-141gb", "nvidia-a100-80gb", "nvidia-l4"]
GpuCount = Literal[1, 2, 4, 8]
Preset = Literal["gemma4-31b", "gemma4-26b-a4b", "gemma4-e4b", "gemma4-e2b", "tiny"]

# A Kubernetes object name (RFC 1123 subdomain) and a size such as "5GB" or "4Gi".
_DNS_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
_SIZE = r"^[0-9]+(\.[0-9]+)?(B|KB|MB|GB|TB|Ki|Mi|Gi|Ti)?$"
_URI = r"^(gs://[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9](/.*)?|/.+)$"
_HF_REPO = r"^[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+$"
_TOPOLOGY = r"^[0-9]+(x[0-9]+){1,2}$"
_RUN = r"^[0-9a-f]{6,64}$"
PATTERN_HINTS = {
    _DNS_NAME: "is not a valid Kubernetes name (lowercase letters, digits, '-' and '.')",
    _SIZE: "is not a size such as 5GB or 4Gi",
    _URI: "is neither a gs://bucket/path URI (bucket: 3-63 of a-z, 0-9, -, _ and .) nor an absolute path",
    _HF_REPO: "is not a Hugging Face repo id such as google/gemma-4-31B-it",
    _TOPOLOGY: "is not a topology such as 2x2x1 or 2x4",
    _RUN: "is not a run id (6 to 64 hexadecimal digits)",
}

# The longest value of every free string and the most items of every list, in both CRDs. The
# Kubernetes API conventions ask for them, and the API server needs them: before it accepts a CRD it
# estimates each CEL rule's worst-case cost from the declared bounds of what the rule reads, and
# refuses a rule over an unbounded list or string (tests/operator/test_crd_bounds.py says where).
MAX_LENGTH = {
    "name": 253,  # an object name: RFC 1123 subdomain (Secret, PVC, ServiceAccount, GemmaFineTune)
    "label": 63,  # an RFC 1123 label: a node pool, a reservation
    "secretKey": 253,  # a key of a Secret's data (Kubernetes' IsConfigMapKey)
    "uri": 2048,  # a gs:// URI or an absolute path
    "hfRepo": 200,  # owner/name: Hugging Face caps each at 96 characters
    "image": 512,  # registry/repository:tag@sha256:digest
    "path": 1024,  # a mount path in the container
    "quantity": 64,  # a Kubernetes quantity or a size: 5GB, 4Gi, "-1"
    "flag": 1024,  # one vLLM flag or one gcsfuse mount option
    "metric": 253,  # a Prometheus metric name as the metrics adapter exposes it
    "run": 64,  # a run id: a sha256 prefix
    "time": 64,  # an RFC 3339 timestamp
    "text": 1024,  # a short status value: a model label, a topology, a summary, an endpoint
    "conditionType": 316,  # metav1.Condition's own bounds: type, reason, message
    "reason": 1024,
    "message": 32768,
}
MAX_ITEMS = {
    "targetModules": len(config.LORA_MODULES),  # each projection once
    "extraArgs": 64,
    "mountOptions": 64,
    "gate": 16,
    "conditions": 32,  # one per condition type (a list map keyed by type)
    "metrics": 16,  # one figure per evaluation metric (seven today)
    "runs": 10,  # status.runs: enough to roll back, small enough for the status
    "passedRuns": 10,  # a subset of the fine-tune's status.runs
    "rejectedRuns": 10,  # runs whose benchmark missed the SLO (bounded like status.runs)
    "benchmarks": 10,  # benchmark results kept, one per revision and load
}


# Bounded string types, named for what they hold.
Name = Annotated[str, Field(pattern=_DNS_NAME, max_length=MAX_LENGTH["name"])]
NodeLabel = Annotated[str, Field(pattern=_DNS_NAME, max_length=MAX_LENGTH["label"])]
Uri = Annotated[str, Field(pattern=_URI, max_length=MAX_LENGTH["uri"])]
HfRepo = Annotated[str, Field(pattern=_HF_REPO, max_length=MAX_LENGTH["hfRepo"])]
Image = Annotated[str, Field(min_length=1, max_length=MAX_LENGTH["image"])]
Quantity = Annotated[str, Field(min_length=1, max_length=MAX_LENGTH["quantity"])]
RunId = Annotated[str, Field(pattern=_RUN, max_length=MAX_LENGTH["run"])]
Size = Annotated[str, Field(pattern=_SIZE, max_length=MAX_LENGTH["quantity"])]
Timestamp = Annotated[str, Field(max_length=MAX_LENGTH["time"])]
Text = Annotated[str, Field(max_length=MAX_LENGTH["text"])]
# Status values: bounded, not matched (the operator writes them; a pattern could only fail its write).
StatusName = Annotated[str, Field(max_length=MAX_LENGTH["name"])]
StatusUri = Annotated[str, Field(max_length=MAX_LENGTH["uri"])]
StatusRun = Annotated[str, Field(max_length=MAX_LENGTH["run"])]


class Model(BaseModel):
    """Common settings: camelCase on the wire, unknown fields refused (a typo must not pass)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", validate_default=True)


class StatusModel(Model):
    """A part of a status: the operator's own record, read back on every reconcile. A field it does
    not know (written by another version of the operator) is kept as it is, not refused."""

    model_config = ConfigDict(extra="allow")


# ---------------------------------------------------------------------------- shared pieces


class SecretKeyRef(Model):
    """A key of a Secret in the CR's namespace. Only the reference is stored; never the value."""

    name: Annotated[Name, Field(description="Secret name.")]
    key: Annotated[
        str, Field(min_length=1, max_length=MAX_LENGTH["secretKey"], description="Key inside the Secret.")
    ] = "token"


class TPU(Model):
    """Where the pods run: a TPU generation and slice topology, or `cpu` for clusters without TPUs."""

    accelerator: Annotated[Accelerator, Field(description="TPU generation (v5p, v6e) or cpu.")] = "v5p"
    topology: Annotated[
        str | None,
        Field(
            pattern=_TOPOLOGY,
            max_length=MAX_LENGTH["label"],
            description="Slice topology, e.g. 2x2x1 (v5p-8) or 2x4 (v6e-8). Default: the "
            "generation's smallest single-host slice (v5p 2x2x1, v6e 2x4).",
        ),
    ] = None
    spot: Annotated[
        bool, Field(description="Schedule on Spot TPU nodes (cheaper, may be reclaimed with 15 s notice).")
    ] = False
    reservation: Annotated[NodeLabel | None, Field(description="Name of a specific TPU reservation.")] = None
    node_pool: Annotated[NodeLabel | None, Field(description="Pin the pods to this GKE node pool.")] = None


class GPU(Model):
    """Where the pods run on NVIDIA GPUs instead of a TPU slice: the GKE accelerator type and the GPUs
    of each pod, all on one node."""

    type: Annotated[
        GpuType, Field(description="GKE accelerator type (the node label cloud.google.com/gke-accelerator).")
    ]
    count: Annotated[GpuCount, Field(description="GPUs of each pod (1, 2, 4 or 8), on one node.")] = 1
    spot: Annotated[bool, Field(description="Schedule on Spot GPU nodes (cheaper, may be reclaimed).")] = False
    node_pool: Annotated[NodeLabel | None, Field(description="Pin the pods to this GKE node pool.")] = None


# One rule for both kinds, said the same way by the models and by the CRDs' CEL rule.
ONE_ACCELERATOR = "set tpu or gpu, not both (neither: the default TPU slice)"


_SliceSpec = TypeVar("_SliceSpec", bound=TPU)


def one_accelerator(tpu: _SliceSpec | None, gpu: GPU | None, default: type[_SliceSpec]) -> _SliceSpec | None:
    """The spec's TPU slice: a spec names a TPU slice or GPUs, not both; with neither, its kind's
    default slice (so the specs from before `gpu` existed keep their meaning)."""
    if tpu is not None and gpu is not None:
        raise ValueError(ONE_ACCELERATOR)
    return default() if tpu is None and gpu is None else tpu


class Storage(Model):
    """A PersistentVolumeClaim mounted in every pod, for local-path URIs on a real cluster."""

    persistent_volume_claim: Annotated[Name, Field(description="Name of a PVC in the CR's namespace.")]
    mount_path: Annotated[
        str,
        Field(
            pattern=r"^/.+",
            max_length=MAX_LENGTH["path"],
            description="Where the PVC is mounted in every pod; local-path URIs must lie under it.",
        ),
    ] = "/data"


class Condition(StatusModel):
    """A Kubernetes condition (the metav1.Condition shape)."""

    type: Annotated[
        str, Field(max_length=MAX_LENGTH["conditionType"], description="What the condition is about, e.g. Ready.")
    ]
    status: Annotated[Literal["True", "False", "Unknown"], Field(description="True, False or Unknown.")]
    reason: Annotated[
        str, Field(max_length=MAX_LENGTH["reason"], description="A CamelCase word for the last transition.")
    ]
    message: Annotated[
        str, Field(max_length=MAX_LENGTH["message"], description="Details of the last transition, for people.")
    ] = ""
    last_transition_time: Annotated[Timestamp | None, Field(description="When status last changed (RFC 3339).")] = None
    observed_generation: Annotated[
        int | None, Field(description="The metadata.generation the condition was set for.")
    ] = None


class ObservedStatus(StatusModel):
    """What both kinds' status says: the operator's last word, for people and for tools."""

    message: Annotated[
        str | None, Field(max_length=MAX_LENGTH["message"], description="What is happening now, for people.")
    ] = None
    observed_generation: Annotated[int | None, Field(description="The metadata.generation last reconciled.")] = None
    conditions: Annotated[
        list[Condition], Field(max_length=MAX_ITEMS["conditions"], description="Conditions, one per type.")
    ] = Field(default_factory=list)


# ---------------------------------------------------------------------------- the kinds


class Kind:
    """What crd.py and the handlers need to know of one custom resource kind."""

    def __init__(
        self,
        kind: str,
        plural: str,
        short_name: str,
        spec: type[Model],
        status: type[Model],
        columns: list[dict],
    ) -> None:
        self.kind, self.plural, self.short_name = kind, plural, short_name
        self.spec, self.status, self.columns = spec, status, columns
        self.singular = kind.lower()
