"""What both plans share: the spec's parsing into field-named problems, the placement on a slice or GPUs,
the reachability of local paths, and the short digest that names runs and revisions."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gemma_operator import api, gpu, host, tpu
from gemma_operator.model_shapes import GATED_HF_OWNERS, KNOWN_REPO_NAMES, infer_preset
from gemma_operator.settings import OperatorSettings


class SpecError(ValueError):
    """A spec that cannot be scheduled; each problem names its field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


# A model's cross-field rule names the field it refuses first (`warmupSteps: 100 must be below ...`): the
# problem is then placed at that field, below the model's own place.
_FIELD_FIRST = re.compile(r"^([a-z][A-Za-z0-9]*(?:\.[a-z][A-Za-z0-9]*)*): (.+)$", re.DOTALL)


def _problems(error: ValidationError, root: str) -> list[str]:
    out = []
    for err in error.errors():
        loc = ".".join(str(p) for p in (root, *err["loc"]))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "value_error" and (named := _FIELD_FIRST.match(msg)):
            loc, msg = f"{loc}.{named[1]}", named[2]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif err["type"] == "string_pattern_mismatch":
            pattern = err["ctx"]["pattern"]
            msg = f"{err['input']!r} " + api.PATTERN_HINTS.get(pattern, f"does not match {pattern}")
        out.append(f"{loc}: {msg}")
    return out


Spec = TypeVar("Spec", bound=BaseModel)


def parse(model: type[Spec], spec: dict[str, Any] | None, root: str = "spec") -> Spec:
    """Validate a CR's spec, turning pydantic's errors into field-named problems."""
    try:
        return model.model_validate(spec or {})
    except ValidationError as e:
        raise SpecError(_problems(e, root)) from None


def digest(data: Any, length: int = 8) -> str:
    """A short stable hash of JSON-able data: names runs and revisions."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


@dataclass(frozen=True)
class Placement:
    """Where pods go: a TPU slice, GPUs on one node, or neither (the cpu profile), and how to select
    their nodes. `chips` counts TPU chips or GPUs alike: the devices the workload shards over."""

    accelerator: str  # a TPU generation, a GKE GPU type, or cpu
    slice: tpu.Slice | None
    node_selector: dict[str, str]
    tolerations: list[dict[str, str]]
    gpus: gpu.GpuShape | None = None
    spot: bool = False

    @property
    def accelerated(self) -> bool:
        """On TPU chips or GPUs: false for the cpu profile."""
        return self.slice is not None or self.gpus is not None

    @property
    def device(self) -> tpu.Generation | gpu.GpuType | None:
        """The facts of one chip or GPU: its HBM and peak FLOPs."""
        if self.slice is not None:
            return tpu.GENERATIONS[self.slice.generation]
        return self.gpus.type if self.gpus else None

    @property
    def device_word(self) -> str:
        """What a device is called in the plan's words: a TPU chip or a GPU."""
        return "GPU" if self.gpus else "chip"

    @property
    def resource(self) -> str | None:
        """The extended resource a pod asks its devices by."""
        if self.slice is not None:
            return tpu.TPU_RESOURCE
        return gpu.GPU_RESOURCE if self.gpus else None

    @property
    def node(self) -> host.Node | None:
        """The VM of each pod, for its memory and disks; None for the cpu profile."""
        if self.slice is not None:
            return host.tpu_node(self.slice)
        return host.gpu_node(self.gpus) if self.gpus else None

    @property
    def host_label(self) -> str:
        """A host of this placement, for people: a TPU VM of the slice, or the GPUs' node."""
        if self.slice is not None:
            return f"a {self.slice.machine_type} host of {self.label}"
        return f"the node of {self.label}"

    @property
    def field(self) -> str:
        """The spec's block this placement comes from, for the problems it names."""
        return "spec.gpu" if self.gpus else "spec.tpu"

    @property
    def hosts(self) -> int:
        return self.slice.hosts if self.slice else 1

    @property
    def chips(self) -> int:
        if self.slice is not None:
            return self.slice.chips
        return self.gpus.count if self.gpus else 0

    @property
    def chips_per_host(self) -> int:
        return self.slice.chips_per_host if self.slice else self.chips

    @property
    def label(self) -> str:
        if self.slice is not None:
            return f"{self.slice.name} ({self.slice.topology})"
        return f"{self.gpus.name} ({self.gpus.machine.name})" if self.gpus else "cpu"


def placement(spec_tpu: api.TPU | None, spec_gpu: api.GPU | None = None, node_pool: str | None = None) -> Placement:
    """The placement of a spec's tpu block, or of its gpu block (the spec has one of them)."""
    if spec_gpu is not None:
        return gpu_placement(spec_gpu)
    assert spec_tpu is not None, "a spec without gpu has a tpu block (api.one_accelerator)"
    if spec_tpu.accelerator == "cpu":
        problems = [
            f"spec.tpu.{f}: not used with accelerator cpu" for f in ("topology", "reservation") if getattr(spec_tpu, f)
        ]
        if problems:
            raise SpecError(problems)
        selector = {tpu.NODE_POOL_LABEL: spec_tpu.node_pool} if spec_tpu.node_pool else {}
        return Placement("cpu", None, selector, [])
    try:
        slice_ = tpu.GENERATIONS[spec_tpu.accelerator].slice(spec_tpu.topology)  # cpu returned above
    except KeyError as e:
        raise SpecError([f"spec.tpu.topology: {e.args[0]}"]) from None
    selector = tpu.node_selector(
        slice_, spot=spec_tpu.spot, reservation=spec_tpu.reservation, node_pool=spec_tpu.node_pool or node_pool
    )
    tolerations = [dict(tpu.TPU_TOLERATION)] + ([dict(tpu.SPOT_TOLERATION)] if spec_tpu.spot else [])
    return Placement(spec_tpu.accelerator, slice_, selector, tolerations, spot=spec_tpu.spot)


def gpu_placement(spec_gpu: api.GPU) -> Placement:
    """GPUs as GKE schedules them: the accelerator's node label, the GPU taint tolerated (and the
    Spot taint on Spot); GKE installs the driver on the node, so the pod needs nothing more."""
    shape = gpu.shape(spec_gpu.type, spec_gpu.count)
    selector = gpu.node_selector(shape, spot=spec_gpu.spot, node_pool=spec_gpu.node_pool)
    tolerations = [dict(gpu.GPU_TOLERATION)] + ([dict(tpu.SPOT_TOLERATION)] if spec_gpu.spot else [])
    return Placement(spec_gpu.type, None, selector, tolerations, gpus=shape, spot=spec_gpu.spot)


def assumed_mfu(place: Placement, settings: OperatorSettings) -> float:
    """The share of peak FLOPs a duration estimate assumes: the TPU's or the GPU's setting."""
    return settings.assumed_gpu_mfu if place.gpus else settings.assumed_mfu


def grace_seconds(spot: bool, settings: OperatorSettings) -> int:
    """The time a training pod has between SIGTERM and SIGKILL: on Spot, what GKE grants after a
    reclaim notice, whatever the pod asks for."""
    if spot:
        return min(settings.termination_grace_seconds, settings.spot_termination_grace_seconds)
    return settings.termination_grace_seconds


def check_paths(uris: dict[str, str | None], storage: api.Storage | None, accelerator: str) -> list[str]:
    """Local paths must be reachable from the pods: under the mounted PVC (cpu may use host paths)."""
    problems = []
    for field, uri in uris.items():
        if not uri or uri.startswith("gs://"):
            continue
        if storage is not None:
            mount = storage.mount_path.rstrip("/") + "/"
            if not uri.startswith(mount):
                problems.append(f"{field}: {uri} is not under spec.storage.mountPath {storage.mount_path}")
        elif accelerator != "cpu":
            problems.append(
                f"{field}: {uri} is a local path; set spec.storage.persistentVolumeClaim so the pods "
                "can reach it, or use a gs:// URI"
            )
    return problems


def hf_source_checks(
    hf_repo: str | None, preset: str | None, token_ref: api.SecretKeyRef | None
) -> tuple[list[str], list[str]]:
    """(problems, warnings) of a Hugging Face model source that the spec already shows: the pod's
    pre-flight refuses a model that is not Gemma 4, and a gated repository refuses a download without
    a token. A repo the catalogue does not know passes only with its preset stated."""
    if not hf_repo:
        return [], []
    problems, warnings = [], []
    if preset is None and infer_preset(hf_repo) is None:
        problems.append(
            f"spec.model.hfRepo: {hf_repo} is not a Gemma 4 model this operator knows "
            f"({', '.join(KNOWN_REPO_NAMES)}); if it is a Gemma 4 checkpoint, state its size in spec.model.preset"
        )
    if token_ref is None and hf_repo.split("/", 1)[0] in GATED_HF_OWNERS:
        warnings.append(
            f"spec.model.hfTokenSecretRef: not set, but {hf_repo} is a gated repository: the download is "
            "refused without the token of an account that accepted its licence"
        )
    return problems, warnings
