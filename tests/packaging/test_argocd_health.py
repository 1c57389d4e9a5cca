"""The Argo CD health checks shipped in the chart's docs, run by a real Lua interpreter against the
status of every phase the operator's lifecycles write."""

from pathlib import Path

import pytest
import yaml
from lupa import lua51  # Argo CD runs health checks in gopher-lua, a Lua 5.1 VM

from gemma_operator import api
from tests.support.phases import finetune_statuses, serve_statuses

HEALTH = Path(__file__).resolve().parents[2] / "charts" / "gemma-tpu-operator" / "docs" / "argocd-health.yaml"
# Argo CD's key for a custom health check: resource.customizations.health.<group>_<kind>
# (argo-cd docs/operator-manual/health.md).
KEYS = {kind.kind: f"resource.customizations.health.{api.GROUP}_{kind.kind}" for kind in (api.FINETUNE, api.SERVE)}
EXPECTED = {
    "GemmaFineTune": {
        "Pending": "Progressing",
        "Pending (JobSet missing)": "Degraded",
        "Training": "Progressing",
        "Suspended": "Suspended",
        "Merging": "Progressing",
        "Succeeded": "Healthy",
        "Failed": "Degraded",
        "Failed (invalid spec)": "Degraded",
    },
    "GemmaServe": {
        "WaitingForModel": "Progressing",
        "WaitingForModel (fine-tune failed)": "Degraded",
        "Deploying": "Progressing",
        "Ready": "Healthy",
        "Deploying (rollout stuck)": "Degraded",
        "Failed": "Degraded",
        "Failed (invalid spec)": "Degraded",
        "WaitingForModel (no run passes the gate)": "Degraded",
        "Ready (the newest run fails the gate)": "Healthy",
        "Ready (pinned run not found)": "Degraded",
    },
}
STATUSES = {"GemmaFineTune": finetune_statuses(), "GemmaServe": serve_statuses()}


def health(kind: str, obj: dict) -> dict:
    """What Argo CD gets back from the kind's script: the `hs` table, as a dict."""
    lua = lua51.LuaRuntime()
    lua.globals().obj = lua.table_from(obj, recursive=True)
    script = yaml.safe_load(HEALTH.read_text())["data"][KEYS[kind]]
    return dict(lua.execute(script))


def resource(kind: str, status: dict | None, generation: int = 1) -> dict:
    obj = {
        "apiVersion": api.API_VERSION,
        "kind": kind,
        "metadata": {"name": "x", "namespace": "ml", "generation": generation},
    }
    return obj if status is None else {**obj, "status": status}


def test_the_config_map_has_a_check_for_each_kind_and_nothing_else():
    cm = yaml.safe_load(HEALTH.read_text())
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == "argocd-cm"
    assert set(cm["data"]) == set(KEYS.values())


@pytest.mark.parametrize("kind,case", [(k, c) for k, cases in EXPECTED.items() for c in cases])
def test_every_phase_maps_to_an_argo_cd_health(kind, case):
    assert set(EXPECTED[kind]) == set(STATUSES[kind]), "every case the lifecycles produce is expected something"
    status = STATUSES[kind][case]
    hs = health(kind, resource(kind, status))
    assert hs["status"] == EXPECTED[kind][case], status["conditions"]
    assert hs["message"] == status["message"], "the operator's own message is shown"


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_a_status_the_operator_has_not_written_yet_is_progressing(kind):
    assert health(kind, resource(kind, None))["status"] == "Progressing", "just applied: no status yet"
    done = next(s for s in STATUSES[kind].values() if s["phase"] in ("Succeeded", "Ready"))
    hs = health(kind, resource(kind, done, generation=2))
    assert hs["status"] == "Progressing" and "observe" in hs["message"], "a spec change not yet seen is not Healthy"
