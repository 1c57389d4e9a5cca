"""What the controller reads for each kind, as the lifecycles declare it (lifecycle.wiring), and how
what it found becomes the view decide() reads: the one reconcile loop carries these out for every kind."""

import datetime

import pytest

from gemma_operator.children import merge, serving, training
from gemma_operator.lifecycle import wiring
from gemma_operator.lifecycle.reads import AddOns, Found, Get, Listed, Pods, ProgressLog, Refusal
from gemma_operator.plan import plan_finetune, plan_serve
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune, serve

SETTINGS = OperatorSettings()
NS = "default"
FT = plan_finetune("ft", NS, finetune("ft").tpu("v5p", "2x2x1").spec, SETTINGS)
FT_BIG = plan_finetune("big", NS, finetune("big").tpu("v5p", "2x2x2").training(microBatchSize=2).spec, SETTINGS)
SV = plan_serve("chat", NS, serve("chat").fine_tune("ft").spec, SETTINGS, model_uri="gs://o/m", fine_tune_preset="tiny")


def _kinds(reads) -> list[str]:
    return [type(r).__name__ for r in reads]


@pytest.mark.parametrize(
    "plan, status, expected",
    [
        (FT, {}, ["Get", "Pods", "ProgressLog", "Refusal"]),  # training: its log is read for progress
        (FT_BIG, {}, ["AddOns", "Get", "Pods", "ProgressLog", "Refusal"]),  # a JobSet needs its controller
        (FT, {"run": FT.run, "phase": "Merging"}, ["Get", "Pods", "Refusal"]),  # the merge: no progress log
        (FT, {"run": "older", "phase": "Succeeded"}, ["Get", "Pods", "ProgressLog", "Refusal", "Listed"]),
    ],
)
def test_a_fine_tune_declares_its_reads_in_the_order_they_depend_on_each_other(plan, status, expected):
    assert _kinds(wiring.FINETUNE.reads(status, plan)) == expected


def test_the_pods_of_a_fine_tune_workload_are_selected_by_the_label_its_controller_sets():
    # batch/v1 Jobs label their pods batch.kubernetes.io/job-name; JobSet labels its jobset-name.
    job = wiring.finetune_reads({}, FT)
    assert job.pods == Pods(Get("Job", training.names(FT)[0]), f"batch.kubernetes.io/job-name={job.workload.name}")
    jobset = wiring.finetune_reads({}, FT_BIG)
    assert jobset.pods.selector == f"jobset.sigs.k8s.io/jobset-name={jobset.workload.name}"
    assert wiring.finetune_reads({"run": "older"}, FT).stale == Listed(
        ("Job", "JobSet"), f"gemma-tpu.dev/finetune=ft,gemma-tpu.dev/run!={FT.run}"
    )


def _fields(status: dict) -> dict:
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    return dict(name="ft", namespace=NS, generation=1, status=status, owner=None, now=now)


def test_what_was_found_lands_in_the_fine_tune_view_where_decide_reads_it():
    status = {"run": FT.run, "phase": "Merging"}
    r, found = wiring.finetune_reads(status, FT), Found()
    job = {"kind": "Job", "metadata": {"name": merge.name(FT)}}
    found[r.workload], found[r.pods], found[r.refusal] = job, [{"metadata": {"name": "p"}}], None
    view = wiring.FINETUNE.view(_fields(status), {}, FT, [], found)
    assert (view.merge, view.merge_pods, view.training, view.progress) == (job, found[r.pods], None, None)


def test_a_gemma_serve_reads_its_fine_tune_before_planning_and_its_children_after():
    body = serve("chat").fine_tune("ft").obj()
    assert wiring.SERVE.inputs(body) == [Get("GemmaFineTune", "ft")]
    assert wiring.SERVE.inputs(serve("chat").obj()) == []
    reads = wiring.SERVE.reads({}, SV)
    name = serving.name(SV)
    assert reads[0] == AddOns(()) and Get("Deployment", name) in reads
    assert (
        isinstance(reads[-2], Pods)
        and isinstance(reads[-1], Refusal)
        and not any(isinstance(r, ProgressLog) for r in reads)
    )


def test_the_serving_children_found_are_the_workload_and_the_extras():
    r, found = wiring.serve_reads(SV), Found()
    assert r is not None
    hpa = {"kind": "HorizontalPodAutoscaler", "metadata": {"name": r.workload.name}}
    deployment = {"kind": "Deployment", "metadata": {"name": r.workload.name}}
    found[Get("GemmaFineTune", "ft")] = None
    for child in r.children:
        found[child] = {"Deployment": deployment, "HorizontalPodAutoscaler": hpa}.get(child.kind)
    found[r.addons], found[r.pods], found[r.refusal] = [], [], None
    view = wiring.SERVE.view(_fields({}), serve("chat").fine_tune("ft").obj(), SV, [], found)
    assert (view.workload, view.extras, view.fine_tune_name, view.fine_tune) == (deployment, [hpa], "ft", None)
