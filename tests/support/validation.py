"""Offline validation of rendered objects: built-in kinds with kubernetes-validate (strict),
custom kinds through the built-in objects they embed, and CRs against the generated CRD schema."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate

from gemma_operator import api, crd

KUBE_VERSION = "1.33.0"


def validate_builtin(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def _as_job(name: str, namespace: str, job_spec: dict) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": job_spec,
    }


def pod_templates(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(where, template) of each pod template an object holds: a Job's or Deployment's, each replicated
    Job's of a JobSet, a LeaderWorkerSet's leader and worker."""
    spec = obj.get("spec") or {}
    if obj["kind"] in ("Job", "Deployment"):
        return [(obj["kind"], spec["template"])]
    if obj["kind"] == "JobSet":
        return [(f"JobSet job {r['name']}", r["template"]["spec"]["template"]) for r in spec["replicatedJobs"]]
    if obj["kind"] == "LeaderWorkerSet":
        lws = spec["leaderWorkerTemplate"]
        return [("LWS leader", lws["leaderTemplate"]), ("LWS worker", lws["workerTemplate"])]
    return []


def validate_object(obj: dict[str, Any]) -> None:
    """Validate any object the operator renders; raises on the first schema violation."""
    kind, meta = obj["kind"], obj["metadata"]
    if kind == "JobSet":
        # kubernetes-validate has no JobSet schema: check each embedded Job (pod template and
        # podFailurePolicy included) as a batch/v1 Job; the test checks JobSet's own fields.
        for rj in obj["spec"]["replicatedJobs"]:
            validate_builtin(_as_job(f"{meta['name']}-{rj['name']}", meta["namespace"], rj["template"]["spec"]))
        return
    if kind == "LeaderWorkerSet":
        tmpl = obj["spec"]["leaderWorkerTemplate"]
        for key in ("leaderTemplate", "workerTemplate"):
            if key in tmpl:
                validate_builtin(
                    {
                        "apiVersion": "v1",
                        "kind": "PodTemplate",
                        "metadata": {"name": f"{meta['name']}-{key}", "namespace": meta["namespace"]},
                        "template": tmpl[key],
                    }
                )
        return
    validate_builtin(obj)


def _openapi_to_jsonschema(schema: dict) -> dict:
    """OpenAPI v3.0 bits jsonschema does not know: boolean exclusive bounds, k8s extensions."""
    schema = copy.deepcopy(schema)

    def walk(node: dict) -> None:
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            if node.get(key) is True:
                node[key] = node.pop("minimum" if key == "exclusiveMinimum" else "maximum")
        for key in list(node):
            if key.startswith("x-kubernetes-"):
                node.pop(key)
        for child in node.get("properties", {}).values():
            walk(child)
        if isinstance(node.get("items"), dict):
            walk(node["items"])
        if node.get("type") == "object" and "properties" in node:
            node["additionalProperties"] = False

    walk(schema)
    return schema


def validate_cr(obj: dict[str, Any]) -> None:
    """A CR against its generated CRD schema, with unknown fields refused (what pruning would drop)."""
    kind = api.KINDS[obj["kind"]]
    schema = crd.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema = _openapi_to_jsonschema(schema)
    schema["properties"]["metadata"]["additionalProperties"] = True
    jsonschema.Draft7Validator(schema).validate(obj)
