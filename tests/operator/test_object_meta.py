"""What the API server checks outside a CR's spec, as `render` checks it offline. The rules are
apimachinery's (pkg/api/validation/objectmeta.go, pkg/util/validation/validation.go); the corpus of
tests/control_plane/test_admission_parity.py holds them to a real kube-apiserver."""

import pytest

from gemma_operator import object_meta
from tests.support.builders import finetune


def doc(**metadata) -> dict:
    obj = finetune("a").obj()
    obj["metadata"].update(metadata)
    return obj


@pytest.mark.parametrize(
    "metadata",
    [
        {"labels": {"example.com/team": "ml", "empty": ""}},
        {"labels": {"a" * 63: "b" * 63}},
        {"annotations": {"Example.com/Note": "x" * 1000}},
        {"finalizers": ["example.com/keep"]},
        {"namespace": "ml-1"},
        {"annotations": {"big": "\u00e9" * (128 * 1024 - 2)}},  # 262,141 bytes with the key
        {"name": None, "generateName": "a-"},
    ],
)
def test_what_the_server_takes(metadata):
    assert object_meta.problems(doc(**metadata)) == []


@pytest.mark.parametrize(
    ("metadata", "problem"),
    [
        ({"labels": {"a" * 64: "x"}}, "name part must be no more than 63"),
        ({"labels": {"a/b/c": "x"}}, "at most one '/'"),
        ({"labels": {"Example.com/x": "x"}}, "prefix must be a DNS-1123 subdomain"),
        ({"labels": {"team": "a" * 64}}, "no more than 63 characters"),
        ({"labels": {"team": "ml."}}, "not a valid label value"),
        ({"labels": {"team": 5}}, "is not a string"),
        ({"annotations": {"replicas": 3}}, "is not a string"),
        ({"annotations": {"big": "x" * (256 * 1024)}}, "at most 262144 in all"),
        ({"finalizers": ["keep me"]}, "alphanumeric"),
        ({"namespace": "bad_ns"}, "not a valid namespace name"),
        ({"owner": "me"}, "metadata.owner: unknown field"),
        # Go's `$` is the very end of the text; Python's would also match before a final newline.
        ({"name": "a\n"}, "not a valid Kubernetes name"),
        ({"namespace": "ml\n"}, "not a valid namespace name"),
        ({"labels": {"team\n": "x"}}, "name part must consist"),
        ({"labels": {"team": "ml\n"}}, "not a valid label value"),
        ({"finalizers": ["example.com/keep\n"]}, "alphanumeric"),
        ({"name": None, "generateName": "a\n"}, "not a valid prefix"),
        # 140,000 characters, 280,000 bytes: the limit counts bytes.
        ({"annotations": {"big": "\u00e9" * 140_000}}, "280003 bytes, at most 262144"),
    ],
)
def test_what_the_server_refuses(metadata, problem):
    found = object_meta.problems(doc(**metadata))
    assert any(problem in p for p in found), found


def test_an_unknown_top_level_field_is_refused():
    assert object_meta.problems({**doc(), "extra": 1}) == ["extra: unknown field (strict decoding)"]


def test_a_generated_name_is_the_prefix_cut_to_58_characters_and_5_more():
    assert object_meta.effective_name({"generateName": "g" * 70}) == "g" * 58 + object_meta.GENERATED_STAND_IN
    assert object_meta.effective_name({"name": "a", "generateName": "b-"}) == "a"
    assert object_meta.effective_name({}) is None
