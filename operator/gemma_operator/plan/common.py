"""What both plans share: the spec's parsing into field-named problems, the placement on a slice,
the reachability of local paths, and the short digest that names runs and revisions."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gemma_operator import api, tpu
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
    """Where pods go: the slice (None for the cpu profile), and how to select its nodes."""

    accelerator: str
    slice: tpu.Slice | None
    node_selector: dict[str, str]
    tolerations: list[dict[str, str]]

    @property
    def hosts(self) -> int:
        return self.slice.hosts if self.slice else 1

    @property
    def chips(self) -> int:
        return self.slice.chips if self.slice else 0

    @property
    def chips_per_host(self) -> int:
        return self.slice.chips_per_host if self.slice else 0

    @property
    def label(self) -> str:
        return f"{self.slice.name} ({self.slice.topology})" if self.slice else "cpu"


def placement(spec_tpu: api.TPU, node_pool: str | None = None) -> Placement:
    if spec_tpu.accelerator == "cpu":
        problems = [
            f"spec.tpu.{f}: not used with accelerator cpu" for f in ("topology", "reservation") if getattr(spec_tpu, f)
        ]
        if problems:
            raise SpecError(problems)
        selector = {"cloud.google.com/gke-nodepool": spec_tpu.node_pool} if spec_tpu.node_pool else {}
        return Placement("cpu", None, selector, [])
    try:
        slice_ = tpu.GENERATIONS[spec_tpu.accelerator].slice(spec_tpu.topology)  # cpu returned above
    except KeyError as e:
        raise SpecError([f"spec.tpu.topology: {e.args[0]}"]) from None
    selector = tpu.node_selector(
        slice_, spot=spec_tpu.spot, reservation=spec_tpu.reservation, node_pool=spec_tpu.node_pool or node_pool
    )
    tolerations = [dict(tpu.TPU_TOLERATION)] + ([dict(tpu.SPOT_TOLERATION)] if spec_tpu.spot else [])
    return Placement(spec_tpu.accelerator, slice_, selector, tolerations)


def grace_seconds(spec_tpu: api.TPU, settings: OperatorSettings) -> int:
    """The time a training pod has between SIGTERM and SIGKILL: on Spot, what GKE grants after a
    reclaim notice, whatever the pod asks for."""
    if spec_tpu.spot:
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
