"""Kubernetes API semantics the in-process server implements: merge patches, label and field
selectors, and a CRD's defaulting, pruning and validation of custom resources."""

from __future__ import annotations

import copy
import datetime
import re
from typing import Any

import attrs
import kmock

from gemma_devcluster import pod_validation
from gemma_operator import api, crd_validation, object_meta
from gemma_operator.plan.common import SpecError, parse


class ApiError(kmock.KubernetesError):
    pass


def error(status: int, reason: str, message: str) -> ApiError:
    return ApiError(status=status, reason=reason, message=message)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: null removes a key, objects merge, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# ---------------------------------------------------------------------------- selectors

_SET_EXPR = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [p for p in (*parts, current) if p.strip()]


def label_selector_matches(selector: str | None, labels: dict[str, str]) -> bool:
    """Kubernetes label selector syntax: a=b, a==b, a!=b, a in (x,y), a notin (x), a, !a."""
    for term in _split_selector(selector or ""):
        if m := _SET_EXPR.match(term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if (labels.get(key) in values) != (op == "in") or (op == "in" and key not in labels):
                return False
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.strip().startswith("!"):
            if term.strip()[1:] in labels:
                return False
        elif term.strip() not in labels:
            return False
    return True


def field_selector_matches(selector: str | None, obj: dict[str, Any]) -> bool:
    for term in _split_selector(selector or ""):
        negate = "!=" in term
        path, value = (s.strip() for s in term.replace("!=", "=").replace("==", "=").split("=", 1))
        node: Any = obj
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if (str(node) == value if node is not None else value == "") == negate:
            return False
    return True


# ---------------------------------------------------------------------------- schemas


def _apply_defaults(schema: dict, value: Any) -> Any:
    if not isinstance(value, dict) or schema.get("type") != "object":
        if isinstance(value, list) and "items" in schema:
            return [_apply_defaults(schema["items"], v) for v in value]
        return value
    out = dict(value)
    for name, prop in schema.get("properties", {}).items():
        if name not in out and "default" in prop:
            out[name] = copy.deepcopy(prop["default"])
        if name in out:
            out[name] = _apply_defaults(prop, out[name])
    return out


def _prune(schema: dict, value: Any) -> Any:
    """Drop fields the schema does not know, as a structural schema makes the API server do."""
    if isinstance(value, dict) and "properties" in schema:
        props, keep = schema["properties"], schema.get("x-kubernetes-preserve-unknown-fields")
        # preserve-unknown keeps this level's unknown fields; the fields it declares are still pruned within
        return {k: _prune(props[k], v) if k in props else v for k, v in value.items() if k in props or keep}
    if isinstance(value, list) and "items" in schema:
        return [_prune(schema["items"], v) for v in value]
    return value


def default_job_selector(job: dict[str, Any]) -> None:
    """What the API server adds to a new Job: a selector on its uid, and the labels that match it
    on the pod template (so `kubectl logs job/NAME` finds the Job's own pods)."""
    meta, spec = job["metadata"], job.setdefault("spec", {})
    if spec.get("manualSelector"):
        return
    labels = {
        "batch.kubernetes.io/controller-uid": meta["uid"],
        "controller-uid": meta["uid"],
        "batch.kubernetes.io/job-name": meta["name"],
        "job-name": meta["name"],
    }
    spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": meta["uid"]}}
    template_meta = spec.setdefault("template", {}).setdefault("metadata", {})
    template_meta["labels"] = {**(template_meta.get("labels") or {}), **labels}


def _json_path(obj: Any, path: str) -> Any:
    """The simple `.a.b[0].c` JSONPath of printer columns."""
    for part in path.strip(".").split("."):
        name, _, index = part.partition("[")
        obj = obj.get(name) if isinstance(obj, dict) else None
        if index and isinstance(obj, list):
            i = int(index.rstrip("]"))
            obj = obj[i] if -len(obj) <= i < len(obj) else None
    return obj


def _cell(obj: Any, column: dict[str, Any], now: datetime.datetime) -> Any:
    """A table cell; `date` columns become an age, as the API server prints them."""
    value = _json_path(obj, column["jsonPath"])
    if column["type"] == "date" and isinstance(value, str):
        return human_duration(now - datetime.datetime.fromisoformat(value.replace("Z", "+00:00")))
    return value


def human_duration(d: datetime.timedelta) -> str:
    """Kubernetes' short duration (apimachinery's HumanDuration): 45s, 3m12s, 5h, 12d."""
    s = int(d.total_seconds())
    if s < 0:
        return "0s"
    m, h, days = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        return f"{days}d{h % 24}h" if h % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    return f"{days // 365}y{days % 365}d" if days < 365 * 8 else f"{days // 365}y"


@attrs.define
class Kind:
    """What the store needs to know of a resource."""

    resource: kmock.resource
    kind: str
    namespaced: bool
    subresources: set[str]
    schema: dict | None = None  # openAPIV3Schema of a custom resource

    columns: list[dict] = attrs.field(factory=list)  # additionalPrinterColumns of a CRD

    def table(self, items: list[dict[str, Any]], resource_version: str) -> dict[str, Any]:
        """The server-side printing `kubectl get` asks for (Accept: ...;as=Table)."""
        columns = [{"name": "Name", "type": "string", "jsonPath": ".metadata.name"}]
        columns += self.columns or [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
        now = datetime.datetime.now(tz=datetime.UTC)
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": [
                {
                    "name": c["name"],
                    "type": c["type"],
                    "format": "",
                    "description": "",
                    "priority": c.get("priority", 0),
                }
                for c in columns
            ],
            "rows": [
                {
                    "cells": [_cell(item, c, now) for c in columns],
                    "object": {
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": item["metadata"],
                    },
                }
                for item in items
            ],
        }

    def admit(self, obj: dict[str, Any], strict: bool = False) -> dict[str, Any]:
        """Defaulting, pruning and validation, in the API server's order; `strict` is the request's
        fieldValidation=Strict (kubectl's default), which refuses unknown fields rather than drop them."""
        unknown = [f"metadata.{k}" for k in obj.get("metadata") or {} if k not in object_meta.OBJECT_META]
        if strict and self.schema is not None:
            unknown += _unknown_fields(self.schema, obj, "")
        if unknown:  # the in-process API holds no schemas of built-in kinds: for those, only metadata is strict
            if strict:
                version = self.resource.version
                fields = ", ".join(f'unknown field "{u}"' for u in unknown)
                raise error(
                    400,
                    "BadRequest",
                    f'{self.kind} in version "{version}" cannot be handled as a {self.kind}: '
                    f"strict decoding error: {fields}",
                )
            obj = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k in object_meta.OBJECT_META}}
        if self.schema is None:
            if refused := pod_validation.refusal(self.resource.group or "", self.kind, obj):
                raise error(*refused)
            return obj
        return self._admit_custom(obj)

    def _admit_custom(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A custom resource as apiextensions admits one: nulls dropped, defaults applied, unknown fields
        pruned, then checked as the API server checks it (its schema's rules on every field, metadata,
        and for our kinds the cross-field rules its CEL states, which the models hold too)."""
        assert self.schema is not None, "a custom resource's kind has its CRD's schema"
        meta = obj.get("metadata") or {}
        body = _prune(self.schema, _apply_defaults(self.schema, crd_validation.without_nulls(obj)))
        body["metadata"] = meta
        problems = object_meta.problems(body)
        spec_schema = self.schema.get("properties", {}).get("spec")
        if spec_schema is not None and "spec" in body:
            problems += crd_validation.problems(body["spec"], spec_schema, "spec")
        elif spec_schema is not None and "spec" in self.schema.get("required", []):
            problems.append("spec: Required value")
        if not problems and self.kind in api.KINDS and self.resource.group == api.GROUP:
            try:
                parse(api.KINDS[self.kind].spec, body["spec"])
            except SpecError as e:
                problems = e.problems
        if problems:
            raise error(
                422, "Invalid", f"{self.kind}.{api.GROUP} {meta.get('name')!r} is invalid: {'; '.join(problems)}"
            )
        return body


def _unknown_fields(schema: dict, value: Any, path: str) -> list[str]:
    """The dotted paths of fields `schema` does not declare (metadata's are ObjectMeta's, checked apart)."""
    if isinstance(value, dict) and "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out = []
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            if key not in schema["properties"]:
                out.append(where)
            elif where != "metadata":
                out += _unknown_fields(schema["properties"][key], item, where)
        return out
    if isinstance(value, list) and "items" in schema:
        return [u for i, v in enumerate(value) for u in _unknown_fields(schema["items"], v, f"{path}[{i}]")]
    return []
