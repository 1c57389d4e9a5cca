"""docs/reference/ is current, and names every field of both CRDs and of the operator settings."""

from __future__ import annotations

import typing

from pydantic import BaseModel
from scripts.reference_docs import REFERENCE, stale

from gemma_operator import api, crd
from gemma_operator.settings import OperatorSettings


def test_the_reference_docs_are_current():
    assert stale() == [], "run `make manifests`"


def _crd_paths(node: dict, path: str) -> set[str]:
    out = {path}
    for name, child in node.get("properties", {}).items():
        out |= _crd_paths(child, f"{path}.{name}")
    if "properties" in node.get("items", {}):
        out |= {p for p in _crd_paths(node["items"], f"{path}[]") if p != f"{path}[]"}
    return out


def _rows(text: str) -> dict[str, str]:
    """{field path: its table row} of a reference page."""
    return {line.split("`")[1]: line for line in text.splitlines() if line.startswith("| `")}


def test_every_crd_field_has_a_row_with_its_bounds():
    rows = _rows((REFERENCE / "api.md").read_text())
    for kind in api.KINDS.values():
        schema = crd.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for section in ("spec", "status"):
            missing = _crd_paths(schema["properties"][section], section) - set(rows) - {section}
            assert not missing, f"{kind}: fields without a row: {sorted(missing)}"
    rank = crd.crd(api.KINDS["GemmaFineTune"])["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rank = rank["properties"]["spec"]["properties"]["lora"]["properties"]["rank"]
    assert f">= {rank['minimum']}; <= {rank['maximum']}" in rows["spec.lora.rank"]


def _settings_paths(model: type[BaseModel], path: str = "") -> set[str]:
    out = set()
    for name, field in model.model_fields.items():
        here = f"{path}.{name}" if path else name
        out.add(here)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out |= _settings_paths(field.annotation, here)
        item = typing.get_args(field.annotation)[0] if typing.get_origin(field.annotation) is list else None
        if isinstance(item, type) and issubclass(item, BaseModel):  # a list of objects: its items' fields
            out |= _settings_paths(item, f"{here}[]")
    return out


def test_every_setting_has_a_row_with_its_default():
    rows = _rows((REFERENCE / "settings.md").read_text())
    assert _settings_paths(OperatorSettings) == set(rows)
    default = OperatorSettings()
    assert f"`{default.training_host.node_ephemeral_storage}`" in rows["training_host.node_ephemeral_storage"]
    assert f"`{default.images.serving_tpu}`" in rows["images.serving_tpu"]
