"""A CR checked against its generated CRD schema as the API server checks it, before the models.

The models coerce where the API server refuses: pydantic reads `learningRate: '2e-4'` as a number,
the API server refuses a string where the schema says `type: number`, so a GitOps sync would fail
on what `gemma-tpu plan` passed. This walks the openAPIV3Schema that crd.py generates, over the
subset of OpenAPI it uses (type, properties, items, required, enum, bounds, lengths, pattern), with
the API server's rules: a null is dropped, not refused (apiextensions prunes nulls of non-nullable
fields); an integer field takes no 1.5 and no true; an unknown field is refused (kubectl's strict
field validation). The CEL rules are the models' validators too (crd.CEL_RULES), which run next.

No jsonschema here: the operator image does not ship it, and the API server's semantics differ from
JSON Schema's where it matters (JSON Schema takes 1.0 as an integer).
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from gemma_operator import api, crd

# The schema keywords checked here; the CEL rules (x-kubernetes-validations) are the models' to check,
# and the rest only documents. A keyword crd.py starts to emit must join one of these sets.
CHECKED = frozenset(
    {"type", "properties", "items", "required", "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
    | {"minLength", "maxLength", "pattern", "minItems", "maxItems"}
)
NOT_CHECKED = frozenset({"description", "default", "x-kubernetes-validations"})

_JSON_TYPES = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
}


# How the API server reads JSON numbers (k8s.io/apimachinery pkg/util/json, and kube-openapi's type check,
# which takes a float64 as an integer when it is a whole number within +-2^53): a number written without a
# fraction that fits an int64 is an integer; any other is a float64, an integer only if whole and within 2^53.
INT64 = range(-(2**63), 2**63)
FLOAT_INTEGERS = 2**53


@cache
def go_regex(pattern: str) -> re.Pattern[str]:
    r"""A schema's pattern (Go's RE2 syntax, as the API server runs it) as a Python regex that matches the
    same strings: RE2's `$` matches only at the very end of the text where Python's also matches before a
    final newline, so each `$` outside a character class becomes `\Z`; and RE2's classes (`\d`, `\w`)
    are ASCII."""
    out, escaped, in_class = [], False, False
    for c in pattern:
        if escaped:
            out.append(c)
            escaped = False
            continue
        if c == "\\":
            escaped = True
        elif c == "[":
            in_class = True
        elif c == "]":
            in_class = False
        out.append("\\Z" if c == "$" and not in_class else c)
    return re.compile("".join(out), re.ASCII)


@cache
def _spec_schema(kind: str) -> dict[str, Any]:
    version = crd.crd(api.KINDS[kind])["spec"]["versions"][0]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]


def _type_name(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value not in INT64:
        return "number (beyond a 64-bit integer)"
    if isinstance(value, float) and value.is_integer() and abs(value) > FLOAT_INTEGERS:
        return "number (a whole number beyond 2^53 written with a fraction)"
    for name in ("boolean", "integer", "number", "string", "array", "object"):
        if isinstance(value, _JSON_TYPES[name]) and not (name in ("integer", "number") and isinstance(value, bool)):
            return name
    return type(value).__name__


def _type_ok(value: Any, expected: str) -> bool:
    if isinstance(value, bool):
        return expected == "boolean"
    if expected == "integer" and isinstance(value, float):
        return value.is_integer() and abs(value) <= FLOAT_INTEGERS
    if expected == "integer" and isinstance(value, int):
        return value in INT64
    return isinstance(value, _JSON_TYPES[expected])


_COMPARE = {">=": float.__ge__, ">": float.__gt__, "<=": float.__le__, "<": float.__lt__}


def _bound_rule_problems(value: float, schema: dict[str, Any], path: str) -> list[str]:
    """The exact bounds crd.py states as CEL rules (crd.BOUND_RULE), where OpenAPI's would compare wrongly."""
    out = []
    for rule in schema.get("x-kubernetes-validations", []):
        if (match := crd.BOUND_RULE.match(rule["rule"])) and not _COMPARE[match[1]](float(value), float(match[2])):
            out.append(f"{path}: {value} {rule['message']}")
    return out


def _scalar_problems(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    out = []
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: Unsupported value {value!r}: supported values: {', '.join(map(str, schema['enum']))}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema:
            low, strict = schema["minimum"], schema.get("exclusiveMinimum") is True
            if value < low or (strict and value == low):
                out.append(f"{path}: {value} must be {'greater than' if strict else 'at least'} {low}")
        if "maximum" in schema:
            high, strict = schema["maximum"], schema.get("exclusiveMaximum") is True
            if value > high or (strict and value == high):
                out.append(f"{path}: {value} must be {'less than' if strict else 'at most'} {high}")
        out += _bound_rule_problems(value, schema, path)
    if isinstance(value, str):
        if len(value) > schema.get("maxLength", len(value)):
            out.append(f"{path}: {len(value)} characters, at most {schema['maxLength']} allowed")
        if len(value) < schema.get("minLength", 0):
            out.append(f"{path}: at least {schema['minLength']} character(s) required")
        if "pattern" in schema and not go_regex(schema["pattern"]).search(value):
            hint = api.PATTERN_HINTS.get(schema["pattern"], f"does not match {schema['pattern']}")
            out.append(f"{path}: {value!r} {hint}")
    return out


def problems(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Every way `value` breaks `schema`, each naming its field as the API server would."""
    expected = schema.get("type")
    if expected and not _type_ok(value, expected):
        return [f"{path}: {value!r} is of type {_type_name(value)}, the CRD's schema says {expected}"]
    if isinstance(value, list):
        out = []
        if len(value) > schema.get("maxItems", len(value)):
            out.append(f"{path}: {len(value)} items, at most {schema['maxItems']} allowed")
        if len(value) < schema.get("minItems", 0):
            out.append(f"{path}: at least {schema['minItems']} item(s) required")
        for i, item in enumerate(value):
            out += problems(item, schema.get("items", {}), f"{path}[{i}]")
        return out
    if isinstance(value, dict):
        present = {k: v for k, v in value.items() if v is not None}  # nulls are pruned, not refused
        props = schema.get("properties")
        out = [f"{path}.{name}: Required value" for name in schema.get("required", []) if name not in present]
        for name, item in present.items():
            if props is not None and name not in props and not schema.get("x-kubernetes-preserve-unknown-fields"):
                out.append(f"{path}.{name}: unknown field")
            elif props is not None and name in props:
                out += problems(item, props[name], f"{path}.{name}")
        return out
    return _scalar_problems(value, schema, path)


def spec_problems(kind: str, spec: Any) -> list[str]:
    """What the API server would refuse in a GemmaFineTune's or GemmaServe's spec."""
    if spec is None:
        return ["spec: Required value"]
    return problems(spec, _spec_schema(kind), "spec")


def without_nulls(value: Any) -> Any:
    """`value` with every null field dropped, as the API server stores it: apiextensions prunes a null
    where the schema does not mark the field nullable (none of ours is) and then applies the field's
    default, so `rank: null` is `rank` unset. Nulls inside lists are kept (and refused by the schema)."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) if isinstance(v, dict) else v for v in value]
    return value
