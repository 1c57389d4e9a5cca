"""The two lifecycles as tables: every phase a resource can be in, times what can be observed,
gives one phase and one set of children to create. `decide` is pure, so each cell is one call.

The prior statuses are the ones the lifecycles themselves write (tests/support/phases.py).
"""

from __future__ import annotations

import json

import pytest

from gemma_operator.children import merge, merge_objects, serving, serving_objects, training, training_objects
from gemma_operator.lifecycle import finetune as finetune_lifecycle
from gemma_operator.lifecycle import serve as serve_lifecycle
from gemma_operator.plan import plan_finetune, plan_serve
from tests.support.builders import finetune, serve
from tests.support.phases import (
    COMPLETE,
    DEPLOYMENT_READY,
    NS,
    SETTINGS,
    T0,
    finetune_statuses,
    pod,
    serve_statuses,
    serve_view,
    with_status,
)

# ---------------------------------------------------------------------------- GemmaFineTune

FT_SPEC = finetune("ft").tpu("v5p", "2x2x1").spec
FT_PLAN = plan_finetune("ft", NS, FT_SPEC, SETTINGS)
JOB, MERGE_JOB = training_objects(FT_PLAN, SETTINGS)[1], merge_objects(FT_PLAN, SETTINGS)[1]
FAILED = {"failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}]}
TRAINED = json.dumps({"status": "succeeded", "step": 100, "total_steps": 100, "loss": 0.5, "checkpoint": "gs://out/c"})
MERGED = json.dumps({"status": "succeeded", "output": FT_PLAN.merged_dir, "tensors_merged": 7, "seconds": 1.0})
BAD_DATA = json.dumps({"status": "failed", "error": "train.jsonl line 7: missing 'messages'"})
TRAINED_CHILDREN = {
    "training": with_status(JOB, COMPLETE),
    "training_pods": [pod("Succeeded", "trainer", {"exitCode": 0, "message": TRAINED})],
}

FT_OBSERVED = {
    "nothing": {},
    "training running": {
        "training": with_status(JOB, {"active": 1, "ready": 1}),
        "training_pods": [pod("Running", "trainer")],
    },
    "training succeeded": TRAINED_CHILDREN,
    "training failed": {
        "training": with_status(JOB, FAILED),
        "training_pods": [pod("Failed", "trainer", {"exitCode": 2, "message": BAD_DATA})],
    },
    "merge running": {
        **TRAINED_CHILDREN,
        "merge": with_status(MERGE_JOB, {"active": 1}),
        "merge_pods": [pod("Running", "merge")],
    },
    "merge succeeded": {
        **TRAINED_CHILDREN,
        "merge": with_status(MERGE_JOB, COMPLETE),
        "merge_pods": [pod("Succeeded", "merge", {"exitCode": 0, "message": MERGED})],
    },
    "merge failed": {
        **TRAINED_CHILDREN,
        "merge": with_status(MERGE_JOB, FAILED),
        "merge_pods": [
            pod("Failed", "merge", {"exitCode": 1, "message": '{"status": "failed", "error": "disk full"}'})
        ],
    },
    "invalid spec": "problems",
}
TRAIN, MERGE, NONE = "training", "merge", ""

# Rows: the phase before. Columns: FT_OBSERVED in order. Cells: (phase after, children applied).
# A workload still running is applied again with its ConfigMap: that creates nothing while they
# exist, and puts back labels or config data that someone else changed.
# Before training, the training path reads only the training workload (a merge seen then is
# re-ensured, never trusted); Merging reads only the merge; Succeeded and Failed are terminal; a
# workload that was created and is gone is recreated as a new attempt; an invalid spec fails whatever came before.
FT_TABLE = {
    #                                nothing                running                succeeded            failed               merge running        merge succeeded        merge failed        invalid spec
    "new": [
        ("Pending", TRAIN),
        ("Training", TRAIN),
        ("Merging", MERGE),
        ("Failed", NONE),
        ("Merging", MERGE),
        ("Merging", MERGE),
        ("Merging", MERGE),
        ("Failed", NONE),
    ],
    "Pending": [
        ("Pending", TRAIN),
        ("Training", TRAIN),
        ("Merging", MERGE),
        ("Failed", NONE),
        ("Merging", MERGE),
        ("Merging", MERGE),
        ("Merging", MERGE),
        ("Failed", NONE),
    ],
    "Training": [
        ("Pending", TRAIN),
        ("Training", TRAIN),
        ("Merging", MERGE),
        ("Failed", NONE),
        ("Merging", MERGE),
        ("Merging", MERGE),
        ("Merging", MERGE),
        ("Failed", NONE),
    ],
    "Suspended": [
        ("Pending", TRAIN),
        ("Training", TRAIN),
        ("Merging", MERGE),
        ("Failed", NONE),
        ("Merging", MERGE),
        ("Merging", MERGE),
        ("Merging", MERGE),
        ("Failed", NONE),
    ],
    "Merging": [
        ("Merging", MERGE),
        ("Merging", MERGE),
        ("Merging", MERGE),
        ("Merging", MERGE),
        ("Merging", MERGE),
        ("Succeeded", NONE),
        ("Failed", NONE),
        ("Failed", NONE),
    ],
    "Succeeded": [
        ("Succeeded", NONE),
        ("Succeeded", NONE),
        ("Succeeded", NONE),
        ("Succeeded", NONE),
        ("Succeeded", NONE),
        ("Succeeded", NONE),
        ("Succeeded", NONE),
        ("Failed", NONE),
    ],
    "Failed": [
        ("Failed", NONE),
        ("Failed", NONE),
        ("Failed", NONE),
        ("Failed", NONE),
        ("Failed", NONE),
        ("Failed", NONE),
        ("Failed", NONE),
        ("Failed", NONE),
    ],
    "Failed (invalid spec)": [
        ("Pending", TRAIN),
        ("Training", TRAIN),
        ("Merging", MERGE),
        ("Failed", NONE),
        ("Merging", MERGE),
        ("Merging", MERGE),
        ("Merging", MERGE),
        ("Failed", NONE),
    ],
}


def _created(objs: list[dict]) -> tuple[str, set[str]]:
    """Which workload the created objects make (child names: `<cr>-train-<run>`, `<cr>-merge-<run>-<id>`) and their kinds."""
    roles = {TRAIN if o["metadata"]["name"].startswith("ft-train-") else MERGE for o in objs}
    assert len(roles) <= 1, f"one workload at a time: {roles}"
    return (roles.pop() if roles else NONE), {o["kind"] for o in objs}


CREATED = {TRAIN: (TRAIN, {"ConfigMap", "Job"}), MERGE: (MERGE, {"ConfigMap", "Job"}), NONE: (NONE, set())}


def _finetune_prior(phase: str) -> dict:
    return {} if phase == "new" else finetune_statuses()[phase]


@pytest.mark.parametrize("phase, observed", [(p, o) for p in FT_TABLE for o in FT_OBSERVED])
def test_finetune_decides_every_phase_and_observation(phase, observed):
    children = FT_OBSERVED[observed]
    invalid = children == "problems"
    view = finetune_lifecycle.FineTuneView(
        name="ft",
        namespace=NS,
        generation=1,
        status=_finetune_prior(phase),
        owner=None,
        now=T0,
        problems=["spec.tpu.topology: 9x9x9 is not a v5p topology"] if invalid else [],
        plan=None if invalid else FT_PLAN,
        **({} if invalid else children),
    )
    d = finetune_lifecycle.decide(view, SETTINGS)
    expected_phase, created = FT_TABLE[phase][list(FT_OBSERVED).index(observed)]
    assert (d.status["phase"], _created(d.create)) == (expected_phase, CREATED[created])
    assert not d.delete, "a run's own children are never deleted"
    if expected_phase == "Failed":
        assert d.status["message"]


def test_a_failed_training_says_why_and_a_recreated_one_is_a_new_attempt():
    pending = finetune_statuses()["Pending"]
    view = finetune_lifecycle.FineTuneView(
        name="ft", namespace=NS, generation=1, status=pending, owner=None, now=T0, problems=[], plan=FT_PLAN
    )
    d = finetune_lifecycle.decide(view, SETTINGS)
    assert d.status["attempt"] == 2 and ("Warning", "TrainingRecreated") in [e[:2] for e in d.events]
    failed = finetune_lifecycle.FineTuneView(
        name="ft",
        namespace=NS,
        generation=1,
        status=pending,
        owner=None,
        now=T0,
        problems=[],
        plan=FT_PLAN,
        **FT_OBSERVED["training failed"],
    )
    assert (
        finetune_lifecycle.decide(failed, SETTINGS).status["message"]
        == "exit code 2: train.jsonl line 7: missing 'messages'"
    )


# ---------------------------------------------------------------------------- GemmaServe

FT_MULTIHOST_PLAN = plan_finetune(
    "big", NS, finetune("big").tpu("v5p", "2x2x2").training(microBatchSize=2).spec, SETTINGS
)
TRAIN_1, TRAIN_2 = (training.names(FT_PLAN, attempt)[0] for attempt in (1, 2))
# status -> (kind, name, training, earlier_runs): what a reconcile reads before decide().
FT_READS = [
    ({}, ("Job", TRAIN_1, True, False)),
    ({"run": FT_PLAN.run, "attempt": 1, "phase": "Training"}, ("Job", TRAIN_1, True, False)),
    ({"run": FT_PLAN.run, "attempt": 2, "phase": "Pending"}, ("Job", TRAIN_2, True, False)),
    ({"run": FT_PLAN.run, "attempt": 2, "phase": "Failed"}, ("Job", TRAIN_2, True, False)),
    ({"run": FT_PLAN.run, "attempt": 2, "phase": "Merging"}, ("Job", merge.name(FT_PLAN), False, False)),
    ({"run": FT_PLAN.run, "phase": "Succeeded"}, ("Job", merge.name(FT_PLAN), False, False)),
    # a new run: its first attempt's training, and the workloads the earlier run may have left
    ({"run": "older", "attempt": 3, "phase": "Succeeded"}, ("Job", TRAIN_1, True, True)),
]


@pytest.mark.parametrize("status,expected", FT_READS)
def test_finetune_reads_the_current_attempt_until_trained_then_the_merge(status, expected):
    r = finetune_lifecycle.reads(status, FT_PLAN)
    assert (r.kind, r.name, r.training, r.earlier_runs) == expected


def test_a_multi_host_fine_tune_reads_its_jobset():
    r = finetune_lifecycle.reads({}, FT_MULTIHOST_PLAN)
    assert (r.kind, r.name) == ("JobSet", training.names(FT_MULTIHOST_PLAN, 1)[0])


SV_SPEC = serve("chat").fine_tune("ft").spec
MERGED_URI = "gs://out/ft/merged"
SV_PLAN = plan_serve("chat", NS, SV_SPEC, SETTINGS, model_uri=MERGED_URI, fine_tune_preset="gemma4-31b")
DEPLOYMENT = {**serving_objects(SV_PLAN, SETTINGS)[0]}
DEPLOYMENT["metadata"] = {**DEPLOYMENT["metadata"], "generation": 1}
READY = DEPLOYMENT_READY
ROLLING = {  # the ready Deployment's new replica not ready yet
    **DEPLOYMENT_READY,
    "readyReplicas": 0,
    "conditions": [{"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}],
}
DEADLINE = {
    **ROLLING,
    "conditions": [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "timed out"}
    ],
}
TRAINING_FT = {"status": {"phase": "Training", "message": "step 40/100"}}
DONE_FT = {"status": {"phase": "Succeeded", "outputs": {"merged": MERGED_URI}}}

SV_OBSERVED = {
    "fine-tune training": (TRAINING_FT, None),
    "fine-tune missing": (None, None),
    "model, no server": (DONE_FT, None),
    "server rolling out": (DONE_FT, ROLLING),
    "server ready": (DONE_FT, READY),
    "no replica by the deadline": (DONE_FT, DEADLINE),
    "invalid spec": "problems",
}
SERVING, NONE_SV = "serving", ""
# A GemmaServe has no terminal phase: once a model was served, it keeps serving it (modelUri in the
# status) while the fine-tune re-runs or is gone; before that it waits. The serving objects are
# re-applied on every decision that knows the model.
SV_TABLE = {
    #                          training                      missing                        model, no server          rolling out              ready                  deadline              invalid spec
    "new": [
        ("WaitingForModel", NONE_SV),
        ("WaitingForModel", NONE_SV),
        ("Deploying", SERVING),
        ("Deploying", SERVING),
        ("Ready", SERVING),
        ("Failed", SERVING),
        ("Failed", NONE_SV),
    ],
    "WaitingForModel": [
        ("WaitingForModel", NONE_SV),
        ("WaitingForModel", NONE_SV),
        ("Deploying", SERVING),
        ("Deploying", SERVING),
        ("Ready", SERVING),
        ("Failed", SERVING),
        ("Failed", NONE_SV),
    ],
    "Deploying": [
        ("Deploying", SERVING),
        ("Deploying", SERVING),
        ("Deploying", SERVING),
        ("Deploying", SERVING),
        ("Ready", SERVING),
        ("Failed", SERVING),
        ("Failed", NONE_SV),
    ],
    "Ready": [
        ("Deploying", SERVING),
        ("Deploying", SERVING),
        ("Deploying", SERVING),
        ("Deploying", SERVING),
        ("Ready", SERVING),
        ("Failed", SERVING),
        ("Failed", NONE_SV),
    ],
    "Failed": [
        ("Deploying", SERVING),
        ("Deploying", SERVING),
        ("Deploying", SERVING),
        ("Deploying", SERVING),
        ("Ready", SERVING),
        ("Failed", SERVING),
        ("Failed", NONE_SV),
    ],
    "Failed (invalid spec)": [
        ("WaitingForModel", NONE_SV),
        ("WaitingForModel", NONE_SV),
        ("Deploying", SERVING),
        ("Deploying", SERVING),
        ("Ready", SERVING),
        ("Failed", SERVING),
        ("Failed", NONE_SV),
    ],
}


SV_MULTIHOST_PLAN = plan_serve(
    "big", NS, serve("big").tpu("v6e", "4x4").spec, SETTINGS, model_uri=MERGED_URI, fine_tune_preset="gemma4-31b"
)
SV_MONITORED_PLAN = plan_serve(
    "chat",
    NS,
    serve("chat").fine_tune("ft").set("metrics", {"podMonitor": True, "podMonitoring": True}).spec,
    SETTINGS,
    model_uri=MERGED_URI,
    fine_tune_preset="gemma4-31b",
)
SV_WAITING_PLAN = plan_serve("chat", NS, SV_SPEC, SETTINGS, fine_tune_preset="gemma4-31b")


@pytest.mark.parametrize(
    "plan,expected",
    [
        (SV_WAITING_PLAN, None),  # no model yet: nothing is read
        (SV_PLAN, ({}, "Deployment")),
        (SV_MULTIHOST_PLAN, ({"LeaderWorkerSet": True}, "LeaderWorkerSet")),
        (SV_MONITORED_PLAN, ({"PodMonitor": False, "PodMonitoring": False}, "Deployment")),
    ],
)
def test_serve_reads_its_children_and_the_add_ons_its_plan_needs(plan, expected):
    r = serve_lifecycle.reads(plan)
    assert (r and (r.addons, r.workload_kind)) == expected
    assert r is None or r.name == serving.name(plan)


def _serve_prior(phase: str) -> dict:
    return {} if phase == "new" else serve_statuses()[phase]


@pytest.mark.parametrize("phase, observed", [(p, o) for p in SV_TABLE for o in SV_OBSERVED])
def test_serve_decides_every_phase_and_observation(phase, observed):
    prior = _serve_prior(phase)
    invalid = SV_OBSERVED[observed] == "problems"
    fine_tune, workload = (DONE_FT, None) if invalid else SV_OBSERVED[observed]
    uri = serve_lifecycle.resolve_model("ft", fine_tune, prior, SV_SPEC)
    plan = None if invalid else plan_serve("chat", NS, SV_SPEC, SETTINGS, model_uri=uri, fine_tune_preset="gemma4-31b")
    view = serve_view(
        plan,
        prior,
        problems=["spec.replicas: must be at least 0"] if invalid else [],
        fine_tune_name="ft",
        fine_tune=fine_tune,
        workload=with_status(DEPLOYMENT, workload) if workload else None,
    )
    d = serve_lifecycle.decide(view, SETTINGS)
    expected_phase, created = SV_TABLE[phase][list(SV_OBSERVED).index(observed)]
    kinds = {o["kind"] for o in serving_objects(SV_PLAN, SETTINGS)} if created else set()
    assert (d.status["phase"], {o["kind"] for o in d.create}) == (expected_phase, kinds)
    if created:
        assert d.status["modelUri"] == MERGED_URI, "the one model there is, served or kept"
