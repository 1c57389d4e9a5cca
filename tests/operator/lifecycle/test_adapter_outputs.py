"""The PEFT adapter as a run's output: planned beside the merged model, shown in status and by
`kubectl get -o wide`, kept alone with spec.merge.output: adapter, and refused for serving then."""

from __future__ import annotations

import json

from gemma_operator import api, crd
from gemma_operator.children import merge_objects
from gemma_operator.lifecycle import finetune as finetune_lifecycle
from gemma_operator.lifecycle import serve as serve_lifecycle
from gemma_operator.plan import plan_finetune, plan_serve
from tests.support.builders import finetune, serve
from tests.support.phases import COMPLETE, NS, SETTINGS, T0, finetune_statuses, pod, serve_view, with_status


def _plan(output: str | None = None):
    b = finetune("ft").tpu("v5p", "2x2x1")
    if output:
        b.set("merge.output", output)
    return plan_finetune("ft", NS, b.spec, SETTINGS)


def _after_merge(plan, result: dict, status: dict | None = None) -> finetune_lifecycle.Decision:
    merging = status or finetune_statuses()["Merging"]
    view = finetune_lifecycle.FineTuneView(
        name="ft",
        namespace=NS,
        generation=1,
        status=merging,
        owner=None,
        now=T0,
        problems=[],
        plan=plan,
        merge=with_status(merge_objects(plan, SETTINGS)[1], COMPLETE),
        merge_pods=[pod("Succeeded", "merge", {"exitCode": 0, "message": json.dumps(result)})],
    )
    return finetune_lifecycle.decide(view, SETTINGS)


def _succeeded_again(plan, status: dict) -> finetune_lifecycle.Decision:
    view = finetune_lifecycle.FineTuneView(
        name="ft", namespace=NS, generation=1, status=status, owner=None, now=T0, problems=[], plan=plan
    )
    return finetune_lifecycle.decide(view, SETTINGS)


def test_the_adapter_is_planned_beside_the_merged_model_and_keeping_it_alone_renames_nothing():
    both, alone = _plan(), _plan("adapter")
    assert both.adapter_dir == both.merged_dir.replace("/merged-", "/adapter-")
    assert both.merge.output == "both" and alone.merge.output == "adapter"
    # Which outputs are kept is not part of their identity: the folders of a run keep their names.
    assert (alone.merged_dir, alone.adapter_dir) == (both.merged_dir, both.adapter_dir)
    assert both.merge.adapter_dir.endswith(both.adapter_dir.split("/", 3)[-1]) and "://" not in both.merge.adapter_dir


def test_a_merge_that_wrote_both_shows_both_and_is_done():
    plan = _plan()
    result = {"status": "succeeded", "output": "/x", "tensors_merged": 7, "seconds": 2.0, "adapter": "/y"}
    d = _after_merge(plan, result)
    assert d.status["phase"] == "Succeeded"
    assert d.status["outputs"]["merged"] == plan.merged_dir and d.status["outputs"]["adapter"] == plan.adapter_dir
    assert plan.adapter_dir in d.status["message"] and plan.merged_dir in d.status["message"]
    assert not _succeeded_again(plan, d.status).create


def test_an_adapter_the_merge_could_not_write_is_a_warning_not_a_retry():
    plan = _plan()
    why = "LoRA layers/0/down_proj adapts model.layers.0.mlp.down_proj.weight, which is not a module ..."
    result = {"status": "succeeded", "output": "/x", "tensors_merged": 7, "seconds": 2.0, "adapter_error": why}
    d = _after_merge(plan, result)
    assert d.status["phase"] == "Succeeded" and "adapter" not in d.status["outputs"]
    assert ("Warning", "AdapterNotWritten", why) in d.events
    merged = next(c for c in d.status["conditions"] if c["type"] == "Merged")
    assert why in merged["message"]
    assert not _succeeded_again(plan, d.status).create, "the merged model is there: nothing to merge again"


def test_an_adapter_only_run_shows_no_merged_model_and_is_not_merged_again():
    plan = _plan("adapter")
    d = _after_merge(plan, {"status": "succeeded", "seconds": 1.0, "adapter": "/y"})
    assert d.status["outputs"].get("merged") is None and d.status["outputs"]["adapter"] == plan.adapter_dir
    assert not _succeeded_again(plan, d.status).create
    # Switched to both: the merged model is now missing, so the merge runs again.
    assert {o["kind"] for o in _succeeded_again(_plan("both"), d.status).create} == {"ConfigMap", "Job"}


def test_serving_an_adapter_only_fine_tune_is_refused_with_the_reason():
    spec = serve("chat").fine_tune("ft").spec
    fine_tune = {
        "spec": {"merge": {"output": "adapter"}},
        "status": {"phase": "Succeeded", "outputs": {"adapter": "gs://a"}},
    }
    uri = serve_lifecycle.resolve_model("ft", fine_tune, {}, spec)
    assert uri is None
    plan = plan_serve("chat", NS, spec, SETTINGS, model_uri=uri, fine_tune_preset="gemma4-31b")
    view = serve_view(plan, {}, fine_tune_name="ft", fine_tune=fine_tune)
    d = serve_lifecycle.decide(view, SETTINGS)
    ready = next(c for c in d.status["conditions"] if c["type"] == "ModelReady")
    assert d.status["phase"] == "WaitingForModel" and not d.create
    assert ready["reason"] == "AdapterOnly" and "spec.merge.output" in ready["message"]


def test_the_crd_shows_the_adapter_in_wide_output_and_bounds_it():
    ft = crd.crd(api.FINETUNE)
    version = ft["spec"]["versions"][0]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    # priority 1: shown by `kubectl get -o wide` only (Kubernetes' printer-column rule).
    assert columns["Adapter"]["jsonPath"] == ".status.outputs.adapter" and columns["Adapter"]["priority"] == 1
    outputs = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["outputs"]["properties"]
    assert outputs["adapter"]["maxLength"] == outputs["merged"]["maxLength"] and outputs["adapter"]["description"]
    merge = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["merge"]["properties"]
    assert merge["output"]["enum"] == ["adapter", "merged", "both"] and merge["output"]["default"] == "both"
