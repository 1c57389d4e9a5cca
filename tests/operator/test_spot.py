"""Spot TPU capacity: the taint GKE puts on Spot nodes, and the grace GKE really gives a reclaim."""

from __future__ import annotations

import pytest

from gemma_operator.children import serving_objects, training
from gemma_operator.plan import plan_finetune, plan_serve
from gemma_operator.settings import OperatorSettings
from gemma_workloads.config import TrainConfig
from tests.support.builders import finetune, serve
from tests.support.scheduling import tolerates

SETTINGS = OperatorSettings()
# GKE docs, "Spot VMs": node auto-provisioning taints Spot pools cloud.google.com/gke-spot=true:NoSchedule.
SPOT_TAINT = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}
# Same page: after the reclaim notice pods get a best-effort 15 s of graceful termination.
GKE_SPOT_GRACE = 15


def training_pod(spot: bool, topology: str = "2x2x1") -> tuple[dict, TrainConfig]:
    b = finetune("ft").tpu("v5p", topology, spot=spot)
    p = plan_finetune(b.name, "ns", b.spec, SETTINGS)
    wl = training.workload(p, SETTINGS, None)
    job = wl["spec"]["replicatedJobs"][0]["template"]["spec"] if wl["kind"] == "JobSet" else wl["spec"]
    return job["template"]["spec"], TrainConfig.model_validate_json(training.config_map(p, None)["data"]["train.json"])


@pytest.mark.parametrize("topology", ["2x2x1", "2x2x2"])
def test_spot_training_tolerates_the_spot_taint_and_budgets_gke_s_grace(topology):
    pod, config = training_pod(True, topology)
    assert pod["nodeSelector"]["cloud.google.com/gke-spot"] == "true" and tolerates(pod, SPOT_TAINT)
    assert config.termination_grace_seconds == pod["terminationGracePeriodSeconds"] == GKE_SPOT_GRACE
    on_demand, config = training_pod(False, topology)
    assert not tolerates(on_demand, SPOT_TAINT)
    assert config.termination_grace_seconds == on_demand["terminationGracePeriodSeconds"] == 120


def test_a_longer_spot_grace_is_a_setting():
    settings = OperatorSettings(spot_termination_grace_seconds=120)
    b = finetune("ft").tpu("v5p", spot=True)
    assert plan_finetune(b.name, "ns", b.spec, settings).train.termination_grace_seconds == 120


def test_spot_serving_tolerates_the_spot_taint():
    b = serve("s").tpu("v6e", "2x4", spot=True)
    dep = serving_objects(plan_serve(b.name, "ns", b.spec, SETTINGS, fine_tune_preset="gemma4-31b"), SETTINGS)[0]
    assert tolerates(dep["spec"]["template"]["spec"], SPOT_TAINT)
