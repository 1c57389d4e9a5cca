"""YAML read as kubectl reads it, so that `render` and `plan` judge the values the API server will get.

kubectl turns YAML into JSON with sigs.k8s.io/yaml, whose parser is a fork of go-yaml v2
(sigs.k8s.io/yaml goyaml.v2/resolve.go, `resolve`): YAML 1.1's booleans but not its base-60 numbers,
Go's integer syntax (strconv.ParseInt with base 0 after every `_` is dropped: `0o10`, `0x1F`, `0b101`,
`010` are integers), a float for what only looks like one (`08`, `1e3`), and timestamps kept as the
text they were written as (each checked with kubectl 1.32's `create --dry-run=client -o json`, and
held to it by tests/control_plane/test_admission_parity.py). PyYAML's YAML 1.1 rules differ on each:
`0o10` would be a string, `y` a string where kubectl sends `true`, `1:20` the integer 80 where kubectl
sends a string. What kubectl refuses to send (an infinity or a NaN, which JSON cannot hold) is refused
here too, with its words.
"""

from __future__ import annotations

import base64
import math
import re
from typing import Any

import yaml

STR, BOOL, INT, FLOAT, NULL = (f"tag:yaml.org,2002:{t}" for t in ("str", "bool", "int", "float", "null"))

# goyaml.v2 resolve.go: the plain scalars looked up by their whole text.
_WORDS: dict[str, tuple[str, Any]] = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), (BOOL, True)),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), (BOOL, False)),
    **dict.fromkeys(("", "~", "null", "Null", "NULL"), (NULL, None)),
    **dict.fromkeys((".nan", ".NaN", ".NAN"), (FLOAT, math.nan)),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), (FLOAT, math.inf)),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), (FLOAT, -math.inf)),
}
_YAML_STYLE_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
# Go's ParseFloat on a text starting with '.': digits, an optional exponent, no underscores.
_DOT_FLOAT = re.compile(r"\.[0-9]+([eE][-+]?[0-9]+)?")
# What a timestamp starts with (resolve.go parseTimestamp's quick check): four digits and a dash.
_TIMESTAMP_START = re.compile(r"[0-9]{4}-")
_GO_INT_BASES = {"0x": 16, "0X": 16, "0o": 8, "0O": 8, "0b": 2, "0B": 2}
_INT64 = range(-(2**63), 2**63)
_DIGITS = "0123456789abcdef"


def _go_integer(text: str, *, signed: bool) -> int | None:
    """The integer Go's strconv.ParseInt(text, 0, ...) (ParseUint when not `signed`, which takes no sign)
    reads, whatever its size: a sign, then `0x`, `0o`, `0b`, a leading `0` (octal) or decimal digits."""
    sign, body = 1, text
    if body[:1] in ("+", "-"):
        if not signed:
            return None
        sign, body = (-1 if body[0] == "-" else 1), body[1:]
    base = _GO_INT_BASES.get(body[:2], 0)
    digits = body[2:] if base else body
    if not base:
        base = 8 if len(digits) > 1 and digits[0] == "0" else 10
    if not digits or any(c not in _DIGITS[:base] for c in digits.lower()):
        return None
    return sign * int(digits, base)


def resolve(text: str) -> tuple[str, Any]:
    """(tag, value) of a plain scalar, as goyaml.v2 resolves it."""
    if text in _WORDS:
        return _WORDS[text]
    first = text[:1]
    if first == ".":
        return (FLOAT, float(text)) if _DOT_FLOAT.fullmatch(text) else (STR, text)
    if not (first.isascii() and (first.isdigit() or first in "+-")):
        return STR, text
    if _TIMESTAMP_START.match(text):  # kubectl sends a timestamp as the text it was written as
        return STR, text
    plain = text.replace("_", "")
    signed = _go_integer(plain, signed=True)
    if signed is not None and signed in _INT64:
        return INT, signed
    unsigned = _go_integer(plain, signed=False)
    if unsigned is not None and unsigned < 2**64:  # a uint64, which kubectl sends as a float64
        return FLOAT, float(unsigned)
    if _YAML_STYLE_FLOAT.fullmatch(plain):
        return FLOAT, float(plain)
    return STR, text  # kubectl 1.32 sends `0x` alone, and hex, octal or binary past 64 bits, as this text


class KubectlLoader(yaml.SafeLoader):
    """PyYAML's safe loader with goyaml.v2's scalars: plain ones resolved by `resolve`, explicitly
    tagged ones (`!!int 0o10`) converted by the same rules."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode and implicit[0]:
            return resolve(value)[0]
        return super().resolve(kind, value, implicit)


def _scalar(tag: str) -> Any:
    def construct(loader: KubectlLoader, node: yaml.ScalarNode) -> Any:
        found, value = resolve(node.value)
        if tag == FLOAT and found == INT:  # resolve.go: an integer is a float where one is asked for
            found, value = FLOAT, float(value)
        if found != tag:
            short = lambda t: "!!" + t.rsplit(":", 1)[1]  # noqa: E731
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot decode {short(found)} `{node.value}` as a {short(tag)}", node.start_mark
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"error converting YAML to JSON: {node.value} has no JSON form (kubectl refuses it as well)",
                node.start_mark,
            )
        return value

    return construct


def _binary(loader: KubectlLoader, node: yaml.ScalarNode) -> str:
    """A !!binary value goes to JSON as the text of its bytes."""
    return base64.b64decode(loader.construct_scalar(node)).decode("utf-8", errors="replace")


for _tag in (BOOL, INT, FLOAT, NULL):
    KubectlLoader.add_constructor(_tag, _scalar(_tag))
KubectlLoader.add_constructor("tag:yaml.org,2002:binary", _binary)


def load_all(text: str) -> list[Any]:
    """Every document of a YAML stream, as kubectl would send it."""
    return [doc for doc in yaml.load_all(text, Loader=KubectlLoader)]
