"""A corpus of GemmaFineTune and GemmaServe objects generated from the CRDs' own schemas, for holding
`gemma-tpu render` to what a real API server admits.

For every field of both specs: each bound just inside and just outside (an exclusive bound at the
bound), every enum value and one that is not, a pattern broken, strings at their maximum length and
one past it (and at it in four-byte characters: the server counts characters), a valid value with a
trailing newline wherever a pattern applies (Go's `$` is the very end of the text), list sizes, whole
numbers written with a fraction, quoted numbers, wrong types and nulls; an unknown field in every object;
each CEL rule of the CRDs both ways; and what the server checks outside the spec (labels, annotations
and their size in bytes, finalizers, namespace, name, generateName, trailing newlines in each, unknown
fields in metadata and at the top level). Each case starts from a valid base object, the first of several that the project
accepts with the field at its base or inside value, so a case varies one thing.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gemma_operator import api, crd

ROOT = Path(__file__).resolve().parents[2]
DELETE = object()  # `with_values`: remove the field


@dataclass(frozen=True)
class Case:
    id: str
    doc: dict[str, Any]


def _example(path: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / path).read_text())


def with_values(doc: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A copy of `doc` with each dotted path (from the object's root) set, or removed (DELETE)."""
    out = copy.deepcopy(doc)
    for path, value in values.items():
        node = out
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = copy.deepcopy(value)
    return out


def bases() -> dict[str, dict[str, dict[str, Any]]]:
    """Valid objects of each kind that between them set every optional block of the spec."""
    quick_ft, quick_serve = _example("quickstart/finetune.yaml"), _example("quickstart/serve.yaml")
    v5p, dpo, v6e = _example("gemma4-31b-v5p8.yaml"), _example("gemma4-31b-v5p8-dpo.yaml"), _example("serve-v6e8.yaml")
    orpo = with_values(dpo, {"spec.method": "orpo", "spec.preference": {"orpoLambda": 0.2, "labelSmoothing": 0.1}})
    epochs = with_values(quick_ft, {"spec.training.steps": DELETE, "spec.training.epochs": 2})
    full_ft = with_values(
        v5p,
        {
            "spec.model.preset": "gemma4-31b",
            "spec.model.dtype": "bfloat16",
            "spec.dataset.skipInvalid": True,
            "spec.lora.targetModules": ["q_proj", "k_proj", "v_proj", "o_proj"],
            "spec.training.seed": 7,
            "spec.training.logEvery": 5,
            "spec.training.gradientCheckpointing": True,
            "spec.tpu.reservation": "my-reservation",
            "spec.tpu.nodePool": "tpu-v5p-8",
            "spec.merge": {"enabled": True, "dtype": "bfloat16", "shardSize": "5GB", "output": "both"},
            "spec.suspend": False,
            "spec.images": {"training": "example.com/train:1", "merge": "example.com/merge:1"},
            "spec.backoffLimit": 3,
            "spec.evaluation.baseline": True,
        },
    )
    uri_serve = with_values(
        v6e,
        {
            "spec.model": {"uri": "gs://my-bucket/model", "preset": "gemma4-31b", "servedName": "verilog"},
            "spec.rollout": {"maxSurge": 1, "maxUnavailable": 0},
            "spec.benchmark": {"inputLen": 512, "outputLen": 128, "requestRate": 2.5, "durationSeconds": 60},
            "spec.benchmark.slo": {"ttftP99Ms": 2000, "itlP99Ms": 50, "minOutputTokensPerSecond": 100},
            "spec.autoscaling": {"minReplicas": 1, "maxReplicas": 3, "metric": "vllm:num_requests_waiting"},
            "spec.compilationCache": {"pvc": "xla-cache"},
            "spec.vllm.extraArgs": ["--enable-prefix-caching"],
            "spec.vllm.gpuMemoryUtilization": 0.9,
            "spec.vllm.dtype": "bfloat16",
            "spec.vllm.image": "example.com/vllm:1",
            "spec.gcsFuse": {
                "fileCacheCapacity": "10Gi",
                "cacheMedium": "Memory",
                "sidecarCpuLimit": "2",
                "sidecarMemoryLimit": "4Gi",
                "sidecarEphemeralStorageLimit": "10Gi",
                "mountOptions": ["implicit-dirs"],
            },
            "spec.metrics": {"podMonitor": False, "podMonitoring": True},
            "spec.startupTimeoutSeconds": 1800,
            "spec.storage": {"persistentVolumeClaim": "models", "mountPath": "/models"},
        },
    )
    hf_serve = with_values(
        quick_serve,
        {
            "spec.model": {"hfRepo": "google/gemma-4-31B-it", "hfTokenSecretRef": {"name": "hf", "key": "t"}},
            "spec.rollout": DELETE,
        },
    )
    run_ref = with_values(v6e, {"spec.model.fineTuneRef.run": "0a1b2c3d"})
    h100 = with_values(_example("gemma4-31b-h100x2.yaml"), {"spec.gpu.spot": True, "spec.gpu.nodePool": "h100-spot"})
    h100_serve = with_values(_example("serve-h100x2.yaml"), {"spec.gpu.spot": False, "spec.gpu.nodePool": "h100"})
    return {
        "GemmaFineTune": {
            "quickstart": quick_ft,
            "v5p": v5p,
            "full": full_ft,
            "dpo": dpo,
            "orpo": orpo,
            "epochs": epochs,
            "h100": h100,
        },
        "GemmaServe": {
            "quickstart": quick_serve,
            "v6e": v6e,
            "uri": uri_serve,
            "hf": hf_serve,
            "run": run_ref,
            "h100": h100_serve,
        },
    }


# ---------------------------------------------------------------------------------------------- values


TWO_BYTES, FOUR_BYTES = "\u00e9", "\U0001f600"  # é and 😀: one character each, 2 and 4 bytes in UTF-8


def _strings_of_length(node: dict, current: Any, length: int, fill: str = "a") -> str:
    """A string of `length` characters (each `fill`, where the shape allows) that matches the field's
    pattern, where one of a few shapes does."""
    base = current if isinstance(current, str) else ""
    candidates = [
        base + fill * (length - len(base)),
        fill * length,
        "/" + fill * (length - 1),
        "1" * (length - 4) + "x1x1",
        "1" * (length - 2) + "Gi",
        "gs://" + fill * (length - 5),
    ]
    pattern = node.get("pattern")
    for text in candidates:
        if len(text) == length and (not pattern or re.search(pattern, text)):
            return text
    return "a" * length


def _number_cases(node: dict, current: Any) -> Iterator[tuple[str, Any]]:
    whole = node["type"] == "integer"
    for bound, sign in (("minimum", -1), ("maximum", 1)):
        if bound not in node:
            continue
        value, exclusive = node[bound], node.get(f"exclusive{bound.capitalize()}") is True
        step = 1 if whole else max(abs(value) * 1e-6, 1e-6)
        if exclusive:
            yield f"at exclusive {bound} {value}", value
            yield f"just inside exclusive {bound}", value - sign * step
        else:
            yield f"at {bound} {value}", value
            yield f"just outside {bound}", value + sign * step
    if whole and "maximum" not in node:
        yield "largest int64", 2**63 - 1
        yield "beyond int64", 2**63
    sample = current if isinstance(current, int | float) and not isinstance(current, bool) else node.get("minimum", 1)
    if whole:
        yield "whole number written with a fraction", float(sample)
        yield "fraction", sample + 0.5
    else:
        yield "whole number", round(sample) or 1
    yield "quoted number", str(sample)
    yield "boolean", True


def _string_cases(node: dict, current: Any) -> Iterator[tuple[str, Any]]:
    if "enum" in node:
        for value in node["enum"]:
            yield f"enum {value}", value
        yield "not in the enum", "notAValue"
        yield "enum value in upper case", str(node["enum"][0]).upper()
        return
    if "maxLength" in node:
        yield f"at maxLength {node['maxLength']}", _strings_of_length(node, current, node["maxLength"])
        yield "past maxLength", _strings_of_length(node, current, node["maxLength"] + 1)
        # The server counts a string's characters (kube-openapi: utf8.RuneCountInString), not its bytes.
        yield "at maxLength in four-byte characters", _strings_of_length(node, "", node["maxLength"], FOUR_BYTES)
        yield "past maxLength in two-byte characters", _strings_of_length(node, "", node["maxLength"] + 1, TWO_BYTES)
    if node.get("minLength", 0) > 0:
        yield "shorter than minLength", ""
    if "pattern" in node:
        yield "pattern broken", "Not a Match!"
        # Go's `$` matches only at the very end: a valid value and a newline is refused.
        valid = current if isinstance(current, str) else _strings_of_length(node, "", 8)
        yield "pattern with a trailing newline", valid + "\n"
    yield "number for a string", 12


def scalar_cases(node: dict, current: Any) -> Iterator[tuple[str, Any]]:
    kind = node["type"]
    if kind in ("integer", "number"):
        yield from _number_cases(node, current)
    elif kind == "string":
        yield from _string_cases(node, current)
    elif kind == "boolean":
        yield "true", True
        yield "false", False
        yield "quoted boolean", "true"
        yield "number for a boolean", 1
    yield "null", None


def array_cases(node: dict, current: Any) -> Iterator[tuple[str, Any]]:
    items = node["items"]
    sample = list(current) if isinstance(current, list) and current else None
    if sample is None:
        sample = [items["enum"][0]] if "enum" in items else [_strings_of_length(items, "", 3)]
    pool = list(items.get("enum", [])) or [
        copy.deepcopy(sample[i % len(sample)]) for i in range(node.get("maxItems", 2) + 1)
    ]
    if "maxItems" in node:
        size = node["maxItems"]
        yield f"{size} items (maxItems)", (pool * (size + 1))[:size]
        yield f"{size + 1} items (past maxItems)", (pool * (size + 2))[: size + 1]
    if node.get("minItems", 0) > 0:
        yield "empty list (below minItems)", []
    yield "a string for a list", "x"
    for label, value in scalar_cases(items, sample[0]) if items["type"] != "object" else []:
        yield f"item {label}", [value]


# ---------------------------------------------------------------------------------------------- walking


def _leaves(schema: dict, path: str) -> Iterator[tuple[str, dict]]:
    """(dotted path, schema node) of every field under `schema`, objects included."""
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from _leaves(prop, f"{path}.{name}")


def _get(doc: dict, path: str) -> Any:
    node: Any = doc
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def field_cases(kind: str, accepts: Callable[[dict], bool]) -> Iterator[Case]:
    """The spec's cases of one kind; `accepts` says whether the project takes a document (to pick a base)."""
    candidates = list(bases()[kind].values())
    spec = crd.crd(api.KINDS[kind])["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for path, node in _leaves(spec, "spec"):
        base = _pick_base(candidates, path, node, accepts)
        current = _get(base, path)
        if node["type"] == "object":
            if "properties" in node:
                value = copy.deepcopy(current) if isinstance(current, dict) else {}
                yield Case(f"{kind} {path}: unknown field", with_values(base, {path: {**value, "unknownField": 1}}))
                yield Case(f"{kind} {path}: a string for an object", with_values(base, {path: "x"}))
            continue
        cases = array_cases(node, current) if node["type"] == "array" else scalar_cases(node, current)
        for label, value in cases:
            yield Case(f"{kind} {path}: {label}", with_values(base, {path: value}))


def _pick_base(bases: list[dict], path: str, node: dict, accepts: Callable[[dict], bool]) -> dict:
    """The first base that sets `path` (or, failing that, takes a sample value there) and is accepted."""
    for base in bases:
        if _get(base, path) is not None and accepts(base):
            return base
    for base in bases:
        sample = next((v for label, v in _inside_values(node)), None)
        if sample is not None and accepts(with_values(base, {path: sample})):
            return base
    return bases[0]


def _inside_values(node: dict) -> Iterator[tuple[str, Any]]:
    if node["type"] in ("object", "array"):
        return
    for label, value in scalar_cases(node, None):
        if label.startswith(("at min", "at max", "enum ", "true", "just inside")):
            yield label, value


# ---------------------------------------------------------------------------------------------- CEL rules

# Each CEL rule of the CRDs, by its message: (kind, base, values that break it, values that keep it).
CEL_CASES: dict[str, tuple[str, str, dict[str, Any], dict[str, Any]]] = {
    api.ONE_ACCELERATOR: (
        "GemmaFineTune",
        "h100",
        {"spec.tpu": {"accelerator": "v5p"}},
        {"spec.gpu.count": 4},
    ),
    "set exactly one of uri or hfRepo": (
        "GemmaFineTune",
        "v5p",
        {"spec.model.uri": "gs://b/m"},
        {"spec.model": {"uri": "gs://b/m", "preset": "gemma4-31b"}},
    ),
    "hfTokenSecretRef is only used with hfRepo": (
        "GemmaFineTune",
        "quickstart",
        {"spec.model.hfTokenSecretRef": {"name": "hf"}},
        {"spec.model.dtype": "bfloat16"},
    ),
    "packing: preference pairs are not packed": (
        "GemmaFineTune",
        "dpo",
        {"spec.dataset.packing": True},
        {"spec.dataset.packing": False},
    ),
    "k_proj and v_proj share one fused projection on sliding layers: list both or neither": (
        "GemmaFineTune",
        "v5p",
        {"spec.lora.targetModules": ["q_proj", "k_proj"]},
        {"spec.lora.targetModules": ["q_proj"]},
    ),
    "set steps or epochs, not both": (
        "GemmaFineTune",
        "quickstart",
        {"spec.training.epochs": 1},
        {"spec.training.steps": 10},
    ),
    "warmupSteps must be below steps: the training pod refuses a run that would end inside its warmup": (
        "GemmaFineTune",
        "quickstart",
        {"spec.training.warmupSteps": 200},
        {"spec.training.warmupSteps": 199},
    ),
    "microBatchSize must divide batchSize": (
        "GemmaFineTune",
        "v5p",
        {"spec.training.microBatchSize": 3},
        {"spec.training.microBatchSize": 2},
    ),
    "evaluation.maxNewTokens must be below dataset.maxSeqLen, to leave room for a prompt": (
        "GemmaFineTune",
        "quickstart",
        {"spec.evaluation.maxNewTokens": 112},
        {"spec.evaluation.maxNewTokens": 111},
    ),
    "evalLoss and perplexity are better lower: bound them with max (or baseline), not min": (
        "GemmaServe",
        "quickstart",
        {"spec.rollout.gate": [{"metric": "evalLoss", "min": 0.5}]},
        {"spec.rollout.gate": [{"metric": "evalLoss", "max": 0.5}]},
    ),
    "this metric is better higher: bound it with min (or baseline), not max": (
        "GemmaServe",
        "quickstart",
        {"spec.rollout.gate": [{"metric": "exactMatch", "max": 0.5}]},
        {"spec.rollout.gate": [{"metric": "exactMatch", "min": 0.5}]},
    ),
    "maxSurge and maxUnavailable cannot both be 0: the rollout could never progress": (
        "GemmaServe",
        "uri",
        {"spec.rollout.maxUnavailable": 0, "spec.rollout.maxSurge": 0},
        {"spec.rollout.maxSurge": 1},
    ),
    "maxReplicas must be at least minReplicas": (
        "GemmaServe",
        "uri",
        {"spec.autoscaling.minReplicas": 4},
        {"spec.autoscaling.minReplicas": 3},
    ),
    "must be less than 0.5": (
        "GemmaFineTune",
        "dpo",
        {"spec.preference.labelSmoothing": 0.5},
        {"spec.preference.labelSmoothing": 0.49},
    ),
    "evaluation has no rows: set spec.evaluation.uri or spec.dataset.evalFraction above 0": (
        "GemmaFineTune",
        "v5p",
        {"spec.evaluation.uri": DELETE},
        {"spec.evaluation.uri": DELETE, "spec.dataset.evalFraction": 0.1},
    ),
    "methods dpo and orpo train on dataset.format preference, and only they do": (
        "GemmaFineTune",
        "dpo",
        {"spec.dataset.format": "chat", "spec.preference": DELETE},
        {"spec.method": "dpo"},
    ),
    "preference is only used with method dpo or orpo": (
        "GemmaFineTune",
        "v5p",
        {"spec.preference": {"labelSmoothing": 0.1}},
        {"spec.preference": DELETE},
    ),
    "preference.beta is only used with method dpo": (
        "GemmaFineTune",
        "orpo",
        {"spec.preference.beta": 0.1},
        {"spec.preference.orpoLambda": 0.5},
    ),
    "preference.orpoLambda is only used with method orpo": (
        "GemmaFineTune",
        "dpo",
        {"spec.preference.orpoLambda": 0.1},
        {"spec.preference.beta": 0.5},
    ),
    "set exactly one of fineTuneRef, uri or hfRepo": (
        "GemmaServe",
        "uri",
        {"spec.model.hfRepo": "google/gemma-4-31B-it"},
        {"spec.model.uri": "gs://b/other"},
    ),
    "set exactly one of uri or pvc": (
        "GemmaServe",
        "uri",
        {"spec.compilationCache.uri": "gs://b/cache"},
        {"spec.compilationCache": {"uri": "gs://b/c"}},
    ),
    "set min, max or baseline": (
        "GemmaServe",
        "quickstart",
        {"spec.rollout.gate": [{"metric": "evalLoss"}]},
        {"spec.rollout.gate": [{"metric": "evalLoss", "max": 2.0}]},
    ),
    # With the rules on each metric's side no gate condition may set both min and max, so only leaving one out
    # keeps this rule; it stays as a guard of its own.
    "min is above max: nothing could pass": (
        "GemmaServe",
        "quickstart",
        {"spec.rollout.gate": [{"metric": "exactMatch", "min": 0.9, "max": 0.5}]},
        {"spec.rollout.gate": [{"metric": "exactMatch", "min": 0.9}]},
    ),
    "rollout.gate is only used with model.fineTuneRef": (
        "GemmaServe",
        "uri",
        {"spec.rollout.gate": [{"metric": "evalLoss", "baseline": "better"}]},
        {"spec.rollout.gate": []},
    ),
    "benchmark.onMiss rollback is only used with model.fineTuneRef": (
        "GemmaServe",
        "uri",
        {"spec.benchmark.onMiss": "rollback"},
        {"spec.benchmark.onMiss": "report"},
    ),
    "benchmark.inputLen + benchmark.outputLen must be at most vllm.maxModelLen": (
        "GemmaServe",
        "quickstart",
        {"spec.benchmark.inputLen": 241},
        {"spec.benchmark.inputLen": 240},
    ),
    "benchmark.durationSeconds needs benchmark.requestRate": (
        "GemmaServe",
        "uri",
        {"spec.benchmark.requestRate": DELETE},
        {"spec.benchmark.durationSeconds": DELETE},
    ),
    "benchmark.durationSeconds must be below timeoutSeconds": (
        "GemmaServe",
        "uri",
        {"spec.benchmark.durationSeconds": 600},
        {"spec.benchmark.durationSeconds": 599},
    ),
    "benchmark.requestRate x durationSeconds is at most 10000 requests": (
        "GemmaServe",
        "uri",
        {"spec.benchmark.requestRate": 20, "spec.benchmark.durationSeconds": 501},
        {"spec.benchmark.requestRate": 20, "spec.benchmark.durationSeconds": 500},
    ),
    "set at least one of ttftP99Ms, tpotP99Ms, itlP99Ms or minOutputTokensPerSecond": (
        "GemmaServe",
        "v6e",
        {"spec.benchmark.slo": {}},
        {"spec.benchmark.slo": {"itlP99Ms": 40}},
    ),
}


def crd_rule_messages() -> set[str]:
    """The message of every CEL rule in both CRDs."""
    out = set()
    for kind in api.KINDS.values():
        schema = crd.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        stack = [schema]
        while stack:
            node = stack.pop()
            out |= {rule["message"] for rule in node.get("x-kubernetes-validations", [])}
            stack += list(node.get("properties", {}).values()) + ([node["items"]] if "items" in node else [])
    return out


# The rules both kinds hold, for the kind CEL_CASES does not test them on.
SHARED_CEL_CASES: dict[str, tuple[str, str, dict[str, Any], dict[str, Any]]] = {
    api.ONE_ACCELERATOR: ("GemmaServe", "h100", {"spec.tpu": {}}, {"spec.tpu": DELETE}),
}


def cel_cases() -> Iterator[Case]:
    for message, (kind, base, breaks, keeps) in [*CEL_CASES.items(), *SHARED_CEL_CASES.items()]:
        doc = bases()[kind][base]
        yield Case(f"{kind} rule {message!r}: broken", with_values(doc, breaks))
        yield Case(f"{kind} rule {message!r}: kept", with_values(doc, keeps))


# ---------------------------------------------------------------------------------------------- metadata

LONG = "a" * 63
ANNOTATION_BYTES = 256 * 1024  # apimachinery's TotalAnnotationSizeLimitB, keys and values in UTF-8 bytes


def _annotation_of_bytes(total: int, char: str) -> dict[str, str]:
    """One annotation whose key and value make `total` bytes, its value of `char` (and ASCII to make up)."""
    key = "example.com/big"
    room = total - len(key)
    width = len(char.encode())
    return {key: char * (room // width) + "x" * (room % width)}


METADATA_CASES: dict[str, dict[str, Any]] = {
    "label with a prefixed key": {"metadata.labels": {"example.com/team": "ml"}},
    "label key of 63 characters": {"metadata.labels": {LONG: "x"}},
    "label key of 64 characters": {"metadata.labels": {LONG + "a": "x"}},
    "label key with a space": {"metadata.labels": {"my team": "x"}},
    "label key with two slashes": {"metadata.labels": {"a/b/c": "x"}},
    "label key with an upper-case prefix": {"metadata.labels": {"Example.com/team": "x"}},
    "label key with an empty prefix": {"metadata.labels": {"/team": "x"}},
    "label key starting with a dash": {"metadata.labels": {"-team": "x"}},
    "label value of 63 characters": {"metadata.labels": {"team": LONG}},
    "label value of 64 characters": {"metadata.labels": {"team": LONG + "a"}},
    "label value with a space": {"metadata.labels": {"team": "ml team"}},
    "label value ending with a dot": {"metadata.labels": {"team": "ml."}},
    "empty label value": {"metadata.labels": {"team": ""}},
    "label value a number": {"metadata.labels": {"team": 5}},
    "label value a boolean": {"metadata.labels": {"team": True}},
    "annotation with a long value": {"metadata.annotations": {"example.com/note": "x" * 10_000}},
    "annotation value a number": {"metadata.annotations": {"replicas": 3}},
    "annotation value a boolean": {"metadata.annotations": {"enabled": True}},
    "annotation key with a space": {"metadata.annotations": {"my note": "x"}},
    "annotation key in upper case": {"metadata.annotations": {"Example.com/Note": "x"}},
    "annotations over 256 KiB": {"metadata.annotations": {"example.com/big": "x" * (256 * 1024)}},
    "unknown field in metadata": {"metadata.owner": "me"},
    "unknown field at the top level": {"extra": {"a": 1}},
    "a qualified finalizer": {"metadata.finalizers": ["example.com/keep"]},
    "a finalizer with a space": {"metadata.finalizers": ["keep me"]},
    "a finalizer with two slashes": {"metadata.finalizers": ["example.com/a/b"]},
    "namespace with an underscore": {"metadata.namespace": "bad_ns"},
    "namespace of 64 characters": {"metadata.namespace": LONG + "a"},
    "namespace in upper case": {"metadata.namespace": "ML"},
    "name with an upper-case letter": {"metadata.name": "Tiny"},
    "name with an underscore": {"metadata.name": "tiny_capitals"},
    "name with dots": {"metadata.name": "tiny.capitals"},
    "name of 254 characters": {"metadata.name": "a" * 254},
    "name of 63 characters": {"metadata.name": LONG},
    # Go's `$` matches only at the very end of the text: each regex-checked string with a trailing newline.
    "name with a trailing newline": {"metadata.name": "tiny\n"},
    "namespace with a trailing newline": {"metadata.namespace": "ml\n"},
    "label key with a trailing newline": {"metadata.labels": {"team\n": "ml"}},
    "label key prefix with a trailing newline": {"metadata.labels": {"example.com\n/team": "ml"}},
    "label value with a trailing newline": {"metadata.labels": {"team": "ml\n"}},
    "annotation key with a trailing newline": {"metadata.annotations": {"note\n": "x"}},
    "annotation value with a trailing newline": {"metadata.annotations": {"note": "x\n"}},
    "finalizer with a trailing newline": {"metadata.finalizers": ["example.com/keep\n"]},
    "generateName with a trailing newline": {"metadata.name": DELETE, "metadata.generateName": "tiny\n"},
    # Multi-byte strings at the byte limits: annotations count UTF-8 bytes, label values are ASCII.
    "annotations of two-byte characters at 256 KiB": {
        "metadata.annotations": _annotation_of_bytes(ANNOTATION_BYTES, TWO_BYTES)
    },
    "annotations of two-byte characters past 256 KiB": {
        "metadata.annotations": _annotation_of_bytes(ANNOTATION_BYTES + 1, TWO_BYTES)
    },
    "annotations of 140,000 two-byte characters": {"metadata.annotations": {"example.com/big": TWO_BYTES * 140_000}},
    "annotations of four-byte characters at 256 KiB": {
        "metadata.annotations": _annotation_of_bytes(ANNOTATION_BYTES, FOUR_BYTES)
    },
    "annotations of four-byte characters past 256 KiB": {
        "metadata.annotations": _annotation_of_bytes(ANNOTATION_BYTES + 1, FOUR_BYTES)
    },
    "label value of two-byte characters": {"metadata.labels": {"team": TWO_BYTES * 31}},
    "label key of two-byte characters": {"metadata.labels": {TWO_BYTES * 31: "ml"}},
    "name of two-byte characters": {"metadata.name": TWO_BYTES * 10},
    # generateName without a name: the server makes the name (the prefix cut to 58 characters, and 5 more).
    "generateName without a name": {"metadata.name": DELETE, "metadata.generateName": "tiny-"},
    "generateName of 63 characters": {"metadata.name": DELETE, "metadata.generateName": LONG},
    "generateName of 254 characters": {"metadata.name": DELETE, "metadata.generateName": "a" * 254},
    "generateName ending with a dot": {"metadata.name": DELETE, "metadata.generateName": "tiny."},
    "generateName in upper case": {"metadata.name": DELETE, "metadata.generateName": "Tiny-"},
    "generateName beside a name": {"metadata.generateName": "other-"},
    "neither name nor generateName": {"metadata.name": DELETE},
    "no spec": {"spec": DELETE},
    "spec a string": {"spec": "x"},
    "status on create": {"status": {"phase": "Succeeded"}},
}


def metadata_cases() -> Iterator[Case]:
    for kind, named in bases().items():
        for label, values in METADATA_CASES.items():
            yield Case(f"{kind} {label}", with_values(named["quickstart"], values))


def corpus(accepts: Callable[[dict], bool]) -> list[Case]:
    """Every case, each id once."""
    cases = [*field_cases("GemmaFineTune", accepts), *field_cases("GemmaServe", accepts), *cel_cases()]
    cases += list(metadata_cases())
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]
    return cases
