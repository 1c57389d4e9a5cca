"""The table of kinds: each row's parts agree with each other and with what the children build."""

from __future__ import annotations

from pathlib import Path

import yaml

from gemma_operator.children import merge_objects, serving_objects, training_objects
from gemma_operator.cli import plan_documents
from gemma_operator.kinds import KINDS, where
from gemma_operator.settings import OperatorSettings

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_a_kind_that_wakes_its_owner_can_be_watched():
    for kind in where(wakes_owner=True):
        assert {"list", "watch"} <= KINDS[kind].verbs, kind


def test_every_child_kind_is_one_the_operator_writes():
    for kind in where(serving=True) + where(wakes_owner=True):
        assert KINDS[kind].mutable is not None and {"create", "patch"} <= KINDS[kind].verbs, kind


def test_the_kinds_whose_status_we_write_are_our_own():
    assert set(where(status=True)) == {"GemmaFineTune", "GemmaServe"}
    assert not [k for k in where(status=True) if KINDS[k].mutable is not None], "our CRs are never children"


def test_every_kind_the_examples_render_has_a_child_row():
    settings = OperatorSettings()
    docs = [
        d
        for f in sorted(EXAMPLES.rglob("*.yaml"))
        for d in yaml.safe_load_all(f.read_text())
        if d and d.get("apiVersion", "").startswith("gemma-tpu.dev/")  # examples/gitops/ holds other kinds
    ]
    plans, problems = plan_documents(docs, settings)
    assert not problems
    rendered = {
        o["kind"]
        for kind, p in plans
        for o in (
            training_objects(p, settings) + merge_objects(p, settings)
            if kind == "GemmaFineTune"
            else serving_objects(p, settings)
        )
    }
    assert {"Job", "JobSet", "ConfigMap", "Deployment", "LeaderWorkerSet", "Service"} <= rendered
    for kind in rendered:
        assert KINDS[kind].mutable is not None, f"{kind} is written by the operator but has no re-applied fields"
