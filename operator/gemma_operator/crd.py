"""CustomResourceDefinitions generated from the pydantic models of the `api` package.

Pydantic writes JSON Schema (draft 2020-12 with $refs); the API server wants a structural
OpenAPI v3.0 schema. The conversion inlines references, drops `null` branches and titles, turns
numeric exclusive bounds into OpenAPI's boolean form, and keeps enums, bounds, patterns,
descriptions and defaults, so `kubectl explain` documents every field and the API server applies
the defaults. Cross-field rules come from the models' `x-kubernetes-validations` (CEL).
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any

from pydantic import BaseModel

from gemma_operator import api

# Whether a GemmaFineTuneSpec's method trains on preference pairs, in CEL.
_PREFERENCE_METHOD = "(has(self.method) && self.method in [{}])".format(
    ", ".join(f"'{m}'" for m in api.config.PREFERENCE_METHODS)
)

# Whether a GateCondition's metric is better lower, in CEL.
_LOWER_IS_BETTER = "self.metric in [{}]".format(", ".join(f"'{m}'" for m in sorted(api.config.LOWER_IS_BETTER)))

# A TPU slice or GPUs, not both: the spec's rule of both kinds (api.one_accelerator).
_ONE_ACCELERATOR = {"rule": "!(has(self.tpu) && has(self.gpu))", "message": api.ONE_ACCELERATOR}

# Cross-field rules the API server enforces at admission (the models enforce them too).
CEL_RULES: dict[type[BaseModel], list[dict[str, str]]] = {
    api.ModelSource: [
        {"rule": "has(self.uri) != has(self.hfRepo)", "message": "set exactly one of uri or hfRepo"},
        {
            "rule": "!has(self.hfTokenSecretRef) || has(self.hfRepo)",
            "message": "hfTokenSecretRef is only used with hfRepo",
        },
    ],
    api.ServeModel: [
        {
            "rule": "(has(self.fineTuneRef) ? 1 : 0) + (has(self.uri) ? 1 : 0) + (has(self.hfRepo) ? 1 : 0) == 1",
            "message": "set exactly one of fineTuneRef, uri or hfRepo",
        },
    ],
    api.Training: [
        {"rule": "!(has(self.steps) && has(self.epochs))", "message": "set steps or epochs, not both"},
        {
            "rule": "!has(self.steps) || self.warmupSteps < self.steps",
            "message": "warmupSteps must be below steps: the training pod refuses a run that would end inside its warmup",
        },
        {
            "rule": "!has(self.microBatchSize) || self.batchSize % self.microBatchSize == 0",
            "message": "microBatchSize must divide batchSize",
        },
    ],
    api.Lora: [
        {
            "rule": "self.targetModules.exists(t, t == 'k_proj') == self.targetModules.exists(t, t == 'v_proj')",
            "message": "k_proj and v_proj share one fused projection on sliding layers: list both or neither",
        },
    ],
    api.CompilationCache: [
        {"rule": "has(self.uri) != has(self.pvc)", "message": "set exactly one of uri or pvc"},
    ],
    api.Dataset: [
        {
            "rule": "!has(self.format) || self.format != 'preference' || !has(self.packing) || !self.packing",
            "message": "packing: preference pairs are not packed",
        },
    ],
    api.GemmaFineTuneSpec: [
        {
            "rule": "!has(self.evaluation) || has(self.evaluation.uri) || self.dataset.evalFraction > 0.0",
            "message": "evaluation has no rows: set spec.evaluation.uri or spec.dataset.evalFraction above 0",
        },
        {
            "rule": "!has(self.evaluation) || self.evaluation.maxNewTokens < self.dataset.maxSeqLen",
            "message": "evaluation.maxNewTokens must be below dataset.maxSeqLen, to leave room for a prompt",
        },
        # An unset method is sft and an unset format chat (their defaults, which the API server applies first).
        {
            "rule": f"{_PREFERENCE_METHOD} == (has(self.dataset.format) && self.dataset.format == 'preference')",
            "message": "methods dpo and orpo train on dataset.format preference, and only they do",
        },
        {
            "rule": f"!has(self.preference) || {_PREFERENCE_METHOD}",
            "message": "preference is only used with method dpo or orpo",
        },
        {
            "rule": "!has(self.preference) || !has(self.preference.beta) || (has(self.method) && self.method == 'dpo')",
            "message": "preference.beta is only used with method dpo",
        },
        {
            "rule": "!has(self.preference) || !has(self.preference.orpoLambda) "
            "|| (has(self.method) && self.method == 'orpo')",
            "message": "preference.orpoLambda is only used with method orpo",
        },
        _ONE_ACCELERATOR,
    ],
    api.GateCondition: [
        {"rule": "has(self.min) || has(self.max) || has(self.baseline)", "message": "set min, max or baseline"},
        # A floor on a loss or a ceiling on a match rate would let worse outputs through (api.GateCondition).
        {
            "rule": f"!has(self.min) || !({_LOWER_IS_BETTER})",
            "message": "evalLoss and perplexity are better lower: bound them with max (or baseline), not min",
        },
        {
            "rule": f"!has(self.max) || {_LOWER_IS_BETTER}",
            "message": "this metric is better higher: bound it with min (or baseline), not max",
        },
        {
            "rule": "!has(self.min) || !has(self.max) || self.min <= self.max",
            "message": "min is above max: nothing could pass",
        },
    ],
    api.GemmaServeSpec: [
        {
            "rule": "!has(self.rollout) || !has(self.rollout.gate) || size(self.rollout.gate) == 0 || has(self.model.fineTuneRef)",
            "message": "rollout.gate is only used with model.fineTuneRef",
        },
        {
            "rule": "!has(self.benchmark) || !has(self.benchmark.onMiss) || self.benchmark.onMiss != 'rollback' "
            "|| has(self.model.fineTuneRef)",
            "message": "benchmark.onMiss rollback is only used with model.fineTuneRef",
        },
        {
            # The API server defaults before it validates, and vllm has a whole default (_object_defaults).
            "rule": "!has(self.benchmark) || self.benchmark.inputLen + self.benchmark.outputLen <= "
            "self.vllm.maxModelLen",
            "message": "benchmark.inputLen + benchmark.outputLen must be at most vllm.maxModelLen",
        },
        _ONE_ACCELERATOR,
    ],
    api.Rollout: [
        {
            "rule": "self.maxSurge > 0 || self.maxUnavailable > 0",
            "message": "maxSurge and maxUnavailable cannot both be 0: the rollout could never progress",
        },
    ],
    api.Autoscaling: [
        {"rule": "self.maxReplicas >= self.minReplicas", "message": "maxReplicas must be at least minReplicas"},
    ],
    api.Benchmark: [
        {
            "rule": "!has(self.durationSeconds) || has(self.requestRate)",
            "message": "benchmark.durationSeconds needs benchmark.requestRate",
        },
        {
            "rule": "!has(self.durationSeconds) || self.durationSeconds < self.timeoutSeconds",
            "message": "benchmark.durationSeconds must be below timeoutSeconds",
        },
        {
            "rule": "!has(self.durationSeconds) || !has(self.requestRate) "
            f"|| self.requestRate * double(self.durationSeconds) <= {api.MAX_BENCHMARK_REQUESTS}.0",
            "message": f"benchmark.requestRate x durationSeconds is at most {api.MAX_BENCHMARK_REQUESTS} requests",
        },
    ],
    api.BenchmarkSLO: [
        {
            "rule": "has(self.ttftP99Ms) || has(self.tpotP99Ms) || has(self.itlP99Ms) "
            "|| has(self.minOutputTokensPerSecond)",
            "message": "set at least one of ttftP99Ms, tpotP99Ms, itlP99Ms or minOutputTokensPerSecond",
        },
    ],
}

_DROP = {"title", "additionalProperties", "$defs"}


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of one model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    rules = {m.__name__: r for m, r in CEL_RULES.items()}
    return _convert(raw, defs, rules, model.__name__)


def _convert(node: dict, defs: dict, rules: dict, name: str | None = None) -> dict[str, Any]:  # noqa: C901  one case per keyword the CRD dialect of JSON Schema treats differently
    if "$ref" in node:
        ref = node["$ref"].rsplit("/", 1)[-1]
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return _convert({**defs[ref], **extra}, defs, rules, ref)
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        extra = {k: v for k, v in node.items() if k != "anyOf"}
        if len(branches) != 1:
            raise ValueError(f"unions are not structural: {node}")
        return _convert({**branches[0], **extra}, defs, rules, name)

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "default" and value is None:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
        elif key == "properties":
            out["properties"] = {k: _convert(v, defs, rules) for k, v in value.items()}
        elif key == "items":
            out["items"] = _convert(value, defs, rules)
        else:
            out[key] = copy.deepcopy(value)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if out.get("type") in ("number", "integer"):
        _integer_safe_bounds(out)
    if name in rules and out.get("type") == "object":
        out["x-kubernetes-validations"] = rules[name]
    return out


# How kube-openapi compares a number with a bound (k8s.io/kube-openapi pkg/validation/validate/values.go,
# MinimumNativeType/MaximumNativeType): a value that arrived as a JSON integer, as kubectl, Helm and every
# Go client send `0.0`, is compared with int64(bound), the bound truncated toward zero. A bound that is not
# a whole number then answers wrongly for whole values: `exclusiveMaximum: 0.5` refuses 0 (0 < int64(0.5)
# is false), which the API server also applies to the CRD's own defaults, and so refuses the CRD; `minimum:
# 0.5` takes 0. A bound that is a whole number compares exactly, exclusive or not.
BOUND_RULE = re.compile(r"^self (>=|>|<=|<) (-?[0-9.e+-]+)$")  # the CEL rule of one exact bound
_WORDS = {">=": "at least", ">": "greater than", "<=": "at most", "<": "less than"}


def _integer_safe_bounds(node: dict[str, Any]) -> None:
    """Rewrite every fractional bound so that no value is refused by a truncated bound, and none taken:
    on an integer field, as the whole-number bound it means; on a number field, as an inclusive bound
    (truncation never makes one stricter) plus, where truncation makes it looser for whole numbers, a
    CEL rule with the exact comparison (CEL compares a number field as a double)."""
    for bound in ("minimum", "maximum"):
        value = node.get(bound)
        if value is None or float(value).is_integer():
            continue
        exclusive = node.pop(f"exclusive{bound.capitalize()}", False) is True
        if node["type"] == "integer":  # past a fractional bound, exclusive or not, the first whole number
            node[bound] = math.ceil(value) if bound == "minimum" else math.floor(value)
            continue
        truncated_exact = value > 0 if bound == "maximum" else value < 0  # int64() rounds toward zero
        if exclusive or not truncated_exact:
            op = (">" if bound == "minimum" else "<") + ("" if exclusive else "=")
            node.setdefault("x-kubernetes-validations", []).append(
                {"rule": f"self {op} {float(value)!r}", "message": f"must be {_WORDS[op]} {value}"}
            )


def _status_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = openapi_schema(model)
    conditions = schema["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    conditions["items"]["required"] = ["type", "status", "reason"]
    conditions.pop("default", None)
    return schema


def _object_defaults(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """Give optional object fields built by a default factory their full default value, so the
    API server fills nested defaults even when the user leaves the whole block out."""
    for name, field in model.model_fields.items():
        alias = field.alias or name
        prop = schema["properties"].get(alias)
        if prop is None or field.default_factory is None:
            continue
        value = field.get_default(call_default_factory=True)
        if isinstance(value, BaseModel):
            prop["default"] = value.model_dump(mode="json", by_alias=True, exclude_none=True)
            _object_defaults(prop, type(value))
        elif value:
            prop["default"] = copy.deepcopy(value)


def crd(kind: api.Kind) -> dict[str, Any]:
    """The CustomResourceDefinition of one kind."""
    spec_schema = openapi_schema(kind.spec)
    _object_defaults(spec_schema, kind.spec)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{kind.plural}.{api.GROUP}",
            "labels": {"app.kubernetes.io/name": "gemma-tpu-operator", "app.kubernetes.io/component": "crd"},
        },
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": [kind.short_name],
                "categories": ["gemma"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": kind.columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": (kind.spec.__doc__ or kind.kind).strip().splitlines()[0],
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": _status_schema(kind.status),
                            },
                        }
                    },
                }
            ],
        },
    }


def all_crds() -> list[dict[str, Any]]:
    return [crd(kind) for kind in api.KINDS.values()]


def crd_filename(kind: api.Kind) -> str:
    return f"{api.GROUP}_{kind.plural}.yaml"
