"""What a real API server refuses in a pod or a pod template, so that a manifest bug fails here as
it would on a cluster: a container without an image, a resource quantity Kubernetes cannot read.

Only rules the operator's children could break are checked; each names its upstream source.
"""

from __future__ import annotations

import re
from typing import Any

# Where each built-in kind keeps its pod spec (the path the API server's messages name).
POD_SPEC_PATHS: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "Pod"): ("spec",),
    ("batch", "Job"): ("spec", "template", "spec"),
    ("batch", "CronJob"): ("spec", "jobTemplate", "spec", "template", "spec"),
    ("apps", "Deployment"): ("spec", "template", "spec"),
    ("apps", "StatefulSet"): ("spec", "template", "spec"),
    ("apps", "ReplicaSet"): ("spec", "template", "spec"),
    ("apps", "DaemonSet"): ("spec", "template", "spec"),
}

# The serialisation of resource.Quantity (k8s.io/apimachinery/pkg/api/resource/quantity.go):
# what its parser accepts, and the pattern its decode error quotes.
_QUANTITY = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?\d+)?")
QUANTITY_PATTERN = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"


def _pod_spec(obj: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    node: Any = obj
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


def _quantities(spec: dict[str, Any], where: str):
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or []):
            resources = container.get("resources") or {}
            for bound in ("requests", "limits"):
                for name, value in (resources.get(bound) or {}).items():
                    yield f"{where}.{group}[{i}].resources.{bound}.{name}", value


def refusal(group: str, kind: str, obj: dict[str, Any]) -> tuple[int, str, str] | None:
    """(status, reason, message) of the API server's refusal of `obj`: 400 when a quantity cannot
    be decoded, 422 with its field errors when the pod spec is invalid; None when it is accepted."""
    path = POD_SPEC_PATHS.get((group, kind))
    if path is None:
        return None
    spec = _pod_spec(obj, path)
    if spec is None:
        return None
    where = ".".join(path)
    version = obj.get("apiVersion", "v1")
    for _, value in _quantities(spec, where):
        # Quantity.UnmarshalJSON: a value it cannot parse fails the whole request body's decoding.
        if not _QUANTITY.fullmatch(str(value).strip()):
            return (
                400,
                "BadRequest",
                f'{kind} in version "{version.split("/")[-1]}" cannot be handled as a {kind}: '
                f"quantities must match the regular expression '{QUANTITY_PATTERN}'",
            )
    problems = []
    for group_name in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group_name) or []):
            # pkg/apis/core/validation/validation.go, validateContainers: field.Required(path.Child("image"), "")
            if not container.get("image"):
                problems.append(f"{where}.{group_name}[{i}].image: Required value")
    for field, value in _quantities(spec, where):
        # validation.go, ValidateResourceQuantityValue: ValidateNonnegativeQuantity
        if str(value).strip().startswith("-"):
            problems.append(f'{field}: Invalid value: "{value}": must be greater than or equal to 0')
    if problems:
        # apimachinery's errors.NewInvalid: one cause is written as it is, several as a list.
        shown = problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
        qualified = f"{kind}.{group}" if group else kind
        name = (obj.get("metadata") or {}).get("name")
        return 422, "Invalid", f'{qualified} "{name}" is invalid: {shown}'
    return None
