"""The status of both kinds in every phase, as the lifecycles' own `decide` writes it.

Each case drives `lifecycle.finetune.decide` / `lifecycle.serve.decide` with the children a
cluster would show at that point (the manifests the operator renders, with the status their controllers set),
so health checks are tested against statuses the operator really produces, not hand-written ones.
"""

from __future__ import annotations

import copy
import datetime
import json

from gemma_operator.addons import Missing
from gemma_operator.children import merge_objects, serving_objects, training_objects
from gemma_operator.lifecycle import finetune as finetune_lifecycle
from gemma_operator.lifecycle import serve as serve_lifecycle
from gemma_operator.plan import plan_finetune, plan_serve
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune, serve

SETTINGS = OperatorSettings()
NS = "default"
T0 = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
COMPLETE = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True", "reason": "CompletionsReached"}]}


# A Deployment of generation 1 whose one replica is ready and updated, as the deployment controller reports it.
DEPLOYMENT_READY = {
    "observedGeneration": 1,
    "replicas": 1,
    "readyReplicas": 1,
    "updatedReplicas": 1,
    "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}],
}


def pod(phase: str, container: str, terminated: dict | None = None) -> dict:
    state = {"terminated": terminated} if terminated else {"running": {}}
    return {
        "metadata": {"name": "p", "creationTimestamp": "2026-01-01T12:00:00Z"},
        "status": {"phase": phase, "containerStatuses": [{"name": container, "state": state}]},
    }


def with_status(obj: dict, status: dict) -> dict:
    return {**copy.deepcopy(obj), "status": status}


def _finetune(spec: dict, status: dict, problems: list[str] = (), **children) -> dict:
    plan = None if problems else plan_finetune("ft", NS, spec, SETTINGS)
    view = finetune_lifecycle.FineTuneView(
        name="ft",
        namespace=NS,
        generation=1,
        status=status,
        problems=list(problems),
        owner=None,
        now=T0,
        plan=plan,
        **children,
    )
    return finetune_lifecycle.decide(view, SETTINGS).status


def finetune_statuses() -> dict[str, dict]:
    """Case name -> status of a GemmaFineTune, one case (at least) per phase."""
    spec = finetune("ft").tpu("v5p", "2x2x1").spec
    plan = plan_finetune("ft", NS, spec, SETTINGS)
    job = training_objects(plan, SETTINGS)[1]
    merge_job = merge_objects(plan, SETTINGS)[1]
    trained = json.dumps(
        {"status": "succeeded", "step": 100, "total_steps": 100, "loss": 0.5, "checkpoint": "gs://out/c"}
    )
    merged = json.dumps({"status": "succeeded", "output": plan.merged_dir, "tensors_merged": 7, "seconds": 1.0})
    out = {"Pending": _finetune(spec, {})}
    running = with_status(job, {"active": 1, "ready": 1})
    out["Training"] = _finetune(spec, out["Pending"], training=running, training_pods=[pod("Running", "trainer")])
    out["Suspended"] = _finetune({**spec, "suspend": True}, out["Training"], training=with_status(job, {}))
    out["Merging"] = _finetune(
        spec,
        out["Training"],
        training=with_status(job, COMPLETE),
        training_pods=[pod("Succeeded", "trainer", {"exitCode": 0, "message": trained})],
    )
    out["Succeeded"] = _finetune(
        spec,
        out["Merging"],
        merge=with_status(merge_job, COMPLETE),
        merge_pods=[pod("Succeeded", "merge", {"exitCode": 0, "message": merged})],
    )
    failed = {"failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}]}
    error = json.dumps({"status": "failed", "error": "train.jsonl line 7: missing 'messages'"})
    out["Failed"] = _finetune(
        spec,
        out["Training"],
        training=with_status(job, failed),
        training_pods=[pod("Failed", "trainer", {"exitCode": 2, "message": error})],
    )
    out["Failed (invalid spec)"] = _finetune(spec, {}, problems=["spec.tpu.topology: 9x9x9 is not a v5p topology"])
    multi_host = finetune("ft").tpu("v5p", "2x2x2").spec
    no_jobset = Missing("JobSet", "JobSet >= v0.10.0 is required for multi-host slices: it is not installed", True)
    out["Pending (JobSet missing)"] = _finetune(multi_host, {}, missing=[no_jobset])
    return out


def serve_view(plan, status: dict, *, name: str = "chat", namespace: str = NS, now=T0, problems=(), **children):
    """What the serve lifecycle decides on: generation 1, no owner, `children` as observed."""
    return serve_lifecycle.ServeView(
        name=name,
        namespace=namespace,
        generation=1,
        status=status,
        problems=list(problems),
        owner=None,
        now=now,
        plan=plan,
        **children,
    )


def _serve(spec: dict, status: dict, fine_tune: dict | None = None, problems: list[str] = (), **children) -> dict:
    ref = ((spec.get("model") or {}).get("fineTuneRef") or {}).get("name")
    uri = serve_lifecycle.resolve_model(ref, fine_tune, status, spec) if ref else None
    plan = None if problems else plan_serve("chat", NS, spec, SETTINGS, model_uri=uri, fine_tune_preset="gemma4-31b")
    view = serve_view(plan, status, problems=problems, fine_tune_name=ref, fine_tune=fine_tune, **children)
    return serve_lifecycle.decide(view, SETTINGS).status


def serve_statuses() -> dict[str, dict]:
    """Case name -> status of a GemmaServe, one case (at least) per phase."""
    spec = serve("chat").fine_tune("ft").spec
    training = {"status": {"phase": "Training", "message": "step 40/100"}}
    failed = {"status": {"phase": "Failed", "message": "exit code 2: bad data"}}
    done = {"status": {"phase": "Succeeded", "outputs": {"merged": "gs://out/ft/merged"}}}
    out = {
        "WaitingForModel": _serve(spec, {}, training),
        "WaitingForModel (fine-tune failed)": _serve(spec, {}, failed),
    }
    out["Deploying"] = _serve(spec, out["WaitingForModel"], done)
    plan = plan_serve("chat", NS, spec, SETTINGS, model_uri="gs://out/ft/merged", fine_tune_preset="gemma4-31b")
    deployment = serving_objects(plan, SETTINGS)[0]
    deployment["metadata"]["generation"] = 1
    ready = DEPLOYMENT_READY
    out["Ready"] = _serve(spec, out["Deploying"], done, workload=with_status(deployment, ready))
    deadline = {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "timed out"}
    stuck = {**ready, "readyReplicas": 1, "updatedReplicas": 1, "conditions": [deadline]}
    out["Deploying (rollout stuck)"] = _serve(spec, out["Ready"], done, workload=with_status(deployment, stuck))
    never = {**stuck, "readyReplicas": 0}
    out["Failed"] = _serve(spec, out["Deploying"], done, workload=with_status(deployment, never))
    out["Failed (invalid spec)"] = _serve(spec, {}, done, problems=["spec.replicas: must be at least 0"])
    gated = {**spec, "rollout": {"gate": [{"metric": "evalLoss", "baseline": "better"}]}}
    worse = {
        "run": "r2",
        "merged": "gs://out/ft/runs/r2/merged",
        "evaluation": [{"name": "evalLoss", "value": 2.0, "baseline": 1.8, "rows": 9}],
    }
    better = {
        "run": "r1",
        "merged": "gs://out/ft/merged",
        "evaluation": [{"name": "evalLoss", "value": 1.2, "baseline": 1.8, "rows": 9}],
    }
    out["WaitingForModel (no run passes the gate)"] = _serve(gated, {}, {"status": {**done["status"], "runs": [worse]}})
    two_runs = {"status": {"phase": "Succeeded", "outputs": {"merged": worse["merged"]}, "runs": [worse, better]}}
    out["Ready (the newest run fails the gate)"] = _serve(
        gated, out["Ready"], two_runs, workload=with_status(deployment, ready)
    )
    pinned = {**spec, "model": {"fineTuneRef": {"name": "ft", "run": "0000aaaa"}}}
    out["Ready (pinned run not found)"] = _serve(
        pinned, out["Ready"], two_runs, workload=with_status(deployment, ready)
    )
    return out
