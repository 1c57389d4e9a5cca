"""What the API server checks of a custom resource outside its spec: the object's top-level fields and
its metadata, so that `gemma-tpu render` and `plan` refuse what a `kubectl apply` would be refused.

The rules are apimachinery's (k8s.io/apimachinery pkg/api/validation/objectmeta.go, ValidateObjectMeta,
and pkg/util/validation/validation.go for the name formats), as kube-apiserver 1.36 applies them to a
custom resource (k8s.io/apiextensions-apiserver pkg/registry/customresource/validator.go), plus the
strict decoding of kubectl's field validation (`--validate=strict`, the default since 1.27): an unknown
field at the top level or in metadata is an error, and so is a label or annotation value that is not a
string (ObjectMeta's maps are map[string]string).
"""

from __future__ import annotations

import re
from typing import Any

# The fields of an object and of ObjectMeta (k8s.io/apimachinery pkg/apis/meta/v1/types.go).
TOP_LEVEL = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})
OBJECT_META = frozenset(
    {"name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation"}
    | {"creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations"}
    | {"ownerReferences", "finalizers", "managedFields"}
)
# Go's `$` matches only at the very end of the text, Python's also before a final newline: every pattern
# here is matched whole (`fullmatch`), so `name\n` is refused as the API server refuses it.
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # IsDNS1123Label, at most 63
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")  # at most 253
QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")  # the name part, at most 63
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")  # at most 63, may be empty
TOTAL_ANNOTATION_BYTES = 256 * 1024  # TotalAnnotationSizeLimitB: bytes of the keys and values, UTF-8
# What the API server makes of generateName (k8s.io/apiserver pkg/storage/names/generate.go): the prefix
# cut to 58 characters and 5 random ones added. The stand-in here is valid wherever theirs is.
GENERATED_PREFIX = 63 - 5
GENERATED_STAND_IN = "xxxxx"


def qualified_name_problems(key: str) -> list[str]:
    """IsQualifiedName: an optional DNS-1123 subdomain prefix and '/', then a name of at most 63."""
    prefix, slash, name = key.rpartition("/")
    out = []
    if slash and (not prefix or "/" in prefix):
        out.append("a qualified name has at most one '/', with a prefix before it")
    elif slash and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.fullmatch(prefix)):
        out.append("its prefix must be a DNS-1123 subdomain (lowercase letters, digits, '-' and '.'), at most 253")
    if len(name) > 63:
        out.append("its name part must be no more than 63 characters")
    if not QUALIFIED_NAME.fullmatch(name):
        out.append(
            "its name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
            "with an alphanumeric character"
        )
    return out


def name_problems(name: Any) -> list[str]:
    """A custom resource's name: a DNS-1123 subdomain of at most 253 characters (NameIsDNSSubdomain)."""
    if not isinstance(name, str) or len(name) > 253 or not DNS1123_SUBDOMAIN.fullmatch(name):
        return [
            f"metadata.name: {name!r} is not a valid Kubernetes name (lowercase letters, digits, '-' and '.', "
            "starting and ending with a letter or digit, at most 253)"
        ]
    return []


def generated_name(generate_name: str) -> str:
    """The name the API server gives an object created with `generateName` alone, with a stand-in
    for its 5 random characters."""
    return generate_name[:GENERATED_PREFIX] + GENERATED_STAND_IN


def effective_name(meta: dict[str, Any]) -> Any:
    """The object's name once created: its own, else the one made from its generateName; None if neither."""
    name, prefix = meta.get("name"), meta.get("generateName")
    if name or not prefix or not isinstance(prefix, str):
        return name or None
    return generated_name(prefix)


def _generate_name_problems(prefix: Any) -> list[str]:
    """generateName as a prefix (NameIsDNSSubdomain with prefix true): a trailing '-' is allowed, as
    apimachinery's maskTrailingDash has it (the two last characters become one 'a')."""
    if not isinstance(prefix, str):
        return [f"metadata.generateName: {prefix!r} is not a string"]
    masked = prefix[:-2] + "a" if len(prefix) > 1 and prefix.endswith("-") else prefix
    if len(masked) > 253 or not DNS1123_SUBDOMAIN.fullmatch(masked):
        return [
            f"metadata.generateName: {prefix!r} is not a valid prefix of a Kubernetes name (lowercase letters, "
            "digits, '-' and '.', starting with a letter or digit)"
        ]
    return []


def _string_map_problems(value: Any, where: str) -> tuple[dict[str, str], list[str]]:
    if not isinstance(value, dict):
        return {}, [f"{where}: must be a map of strings"]
    bad = [f"{where}.{k}: {v!r} is not a string (quote it)" for k, v in value.items() if not isinstance(v, str)]
    return {str(k): v for k, v in value.items() if isinstance(v, str)}, bad


def _label_problems(labels: Any) -> list[str]:
    labels, out = _string_map_problems(labels, "metadata.labels")
    for key, value in labels.items():
        out += [f"metadata.labels: key {key!r}: {m}" for m in qualified_name_problems(key)]
        if len(value) > 63:
            out.append(f"metadata.labels.{key}: a label value must be no more than 63 characters")
        elif not LABEL_VALUE.fullmatch(value):
            out.append(
                f"metadata.labels.{key}: {value!r} is not a valid label value (alphanumeric characters, '-', '_' "
                "or '.', starting and ending with an alphanumeric character, or empty)"
            )
    return out


def _annotation_problems(annotations: Any) -> list[str]:
    annotations, out = _string_map_problems(annotations, "metadata.annotations")
    for key in annotations:  # ValidateAnnotations checks the key in lower case
        out += [f"metadata.annotations: key {key!r}: {m}" for m in qualified_name_problems(key.lower())]
    size = sum(_bytes(k) + _bytes(v) for k, v in annotations.items())
    if size > TOTAL_ANNOTATION_BYTES:
        out.append(f"metadata.annotations: {size} bytes, at most {TOTAL_ANNOTATION_BYTES} in all")
    return out


def _bytes(text: str) -> int:
    """Go's len() of a string: its UTF-8 bytes."""
    return len(text.encode("utf-8", errors="surrogatepass"))


def _finalizer_problems(finalizers: Any) -> list[str]:
    if not isinstance(finalizers, list) or not all(isinstance(f, str) for f in finalizers):
        return ["metadata.finalizers: must be a list of strings"]
    return [f"metadata.finalizers: {f!r}: {m}" for f in finalizers for m in qualified_name_problems(f)]


def problems(doc: dict[str, Any]) -> list[str]:
    """Every way the API server would refuse this object's top level and metadata (not its spec)."""
    out = [f"{key}: unknown field (strict decoding)" for key in doc if key not in TOP_LEVEL]
    meta = doc.get("metadata")
    if meta is None:
        return out
    if not isinstance(meta, dict):
        return [*out, "metadata: must be an object"]
    out += [f"metadata.{key}: unknown field (strict decoding)" for key in meta if key not in OBJECT_META]
    if meta.get("generateName"):
        out += _generate_name_problems(meta["generateName"])
    if (name := effective_name(meta)) is not None:
        out += name_problems(name)
    namespace = meta.get("namespace")
    if namespace is not None and (
        not isinstance(namespace, str) or len(namespace) > 63 or not DNS1123_LABEL.fullmatch(namespace)
    ):
        out.append(
            f"metadata.namespace: {namespace!r} is not a valid namespace name (a DNS-1123 label: at most 63 "
            "lowercase letters, digits and '-', starting and ending with a letter or digit)"
        )
    if meta.get("labels") is not None:
        out += _label_problems(meta["labels"])
    if meta.get("annotations") is not None:
        out += _annotation_problems(meta["annotations"])
    if meta.get("finalizers") is not None:
        out += _finalizer_problems(meta["finalizers"])
    return out
