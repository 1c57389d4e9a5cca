"""The benchmark Job: a valid batch/v1 Job of the serving image, one per revision and load, bounded,
with the API key from its Secret, that reports through its termination message."""

from __future__ import annotations

from gemma_operator.children import benchmark, serving
from gemma_operator.plan import plan_serve
from gemma_operator.settings import OperatorSettings
from tests.support.builders import serve
from tests.support.validation import validate_builtin

SETTINGS = OperatorSettings()
KEY = {"name": "vllm-key", "key": "token"}


def _plan(model_uri: str = "gs://out/ft/merged", **bench):
    spec = serve("chat").fine_tune("ft").set("benchmark", {"numPrompts": 16, **bench}).spec
    spec["vllm"] = {"apiKeySecretRef": KEY}
    return plan_serve("chat", "ns", spec, SETTINGS, model_uri=model_uri, fine_tune_preset="gemma4-31b")


def test_the_job_is_valid_and_runs_vllm_bench_from_the_serving_image():
    plan = _plan(maxConcurrency=2, requestRate=1.5, slo={"ttftP99Ms": 800})
    job = benchmark.job(plan, SETTINGS, None)
    validate_builtin(job)
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == plan.image
    script = " ".join(container["args"])
    assert f"--base-url={serving.endpoint(plan).removesuffix('/v1')}" in script
    for flag in ("--max-concurrency=2", "--request-rate=1.5", "--num-prompts=16", "--goodput ttft:800"):
        assert flag in script
    assert "--tokenizer=/models/model" in script, "the served model's tokenizer, from the model's mount"
    assert job["spec"]["activeDeadlineSeconds"] == 600 and job["spec"]["backoffLimit"] == 0


def test_the_api_key_comes_from_its_secret_never_the_manifest():
    [container] = benchmark.job(_plan(), SETTINGS, None)["spec"]["template"]["spec"]["containers"]
    [key] = [e for e in container["env"] if e["name"] == "OPENAI_API_KEY"]
    # vllm bench serve sends $OPENAI_API_KEY as a Bearer token (vllm/benchmarks/lib/endpoint_request_func.py).
    assert key == {"name": "OPENAI_API_KEY", "valueFrom": {"secretKeyRef": KEY}}


def test_one_job_per_revision_and_load_whatever_the_slo():
    base = benchmark.name(_plan())
    assert benchmark.name(_plan(slo={"ttftP99Ms": 100}, onMiss="report")) == base
    assert benchmark.name(_plan(numPrompts=32)) != base
    assert benchmark.name(_plan(model_uri="gs://out/ft/other/merged")) != base
    assert len(base) <= 63


def test_prompts_from_a_jsonl_reach_vllms_custom_dataset():
    # vllm bench serve's custom dataset reads a JSONL with a `prompt` column (vllm/benchmarks/datasets).
    job = benchmark.job(_plan(promptsUri="gs://evals/verilog/eval.jsonl", outputLen=64), SETTINGS, None)
    validate_builtin(job)
    pod = job["spec"]["template"]
    [container] = pod["spec"]["containers"]
    args = container["args"]
    assert "--dataset-name=custom" in args and "--dataset-path=/benchmark-prompts/eval.jsonl" in args
    assert "--custom-output-len=64" in args and not any(a.startswith("--random-") for a in args)
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "benchmark-prompts"]
    assert volume["csi"]["readOnly"] and "only-dir=verilog" in volume["csi"]["volumeAttributes"]["mountOptions"]
    assert pod["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"


def test_prompts_on_the_claim_are_read_where_they_are():
    spec = serve("chat").fine_tune("ft").set("benchmark", {"promptsUri": "/data/eval.jsonl"}).spec
    spec["storage"] = {"persistentVolumeClaim": "data"}
    plan = plan_serve("chat", "ns", spec, SETTINGS, model_uri="/data/merged", fine_tune_preset="gemma4-31b")
    job = benchmark.job(plan, SETTINGS, None)
    assert "--dataset-path=/data/eval.jsonl" in job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "annotations" not in job["spec"]["template"]["metadata"], "no FUSE sidecar for a claim"
