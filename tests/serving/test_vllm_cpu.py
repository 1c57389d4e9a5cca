"""A real vLLM server, started with the command line the operator renders for the cpu profile,
serves a merged tiny Gemma 4 exactly as transformers runs it, behind the API key from its Secret;
the benchmark Job the operator renders, run as the local node runs pods, measures it."""

import base64
import json
import secrets
import socket
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.support.builders import serve
from tests.support.phases import COMPLETE, DEPLOYMENT_READY, serve_view, with_status

from gemma_devcluster import local_vllm, services, tiny
from gemma_devcluster.kubelet import HOST_PORT_ANNOTATION, LocalPod, Node
from gemma_operator.api import SecretKeyRef
from gemma_operator.children import benchmark, serving, serving_objects
from gemma_operator.children.vllm import VllmLaunch
from gemma_operator.lifecycle import serve as serve_lifecycle
from gemma_operator.lifecycle.serve_benchmark import BenchmarkView
from gemma_operator.plan import plan_serve
from gemma_operator.settings import OperatorSettings
from gemma_workloads.config import MergeConfig
from gemma_workloads.merging import merger as merge

pytestmark = pytest.mark.slow

SERVED_NAME = "tiny-gemma"
KEY_REF = SecretKeyRef(name="vllm-api-key", key="token")
API_KEY = secrets.token_hex(16)
MAX_TOKENS = 24
PROMPT = "<bos>Q: What is the capital of France?\nA:"  # the text <bos> is the BOS token; the tokenizer adds none
MESSAGES = [{"role": "user", "content": "Which city is the capital of Japan?"}]
# vLLM's Gemma4ForConditionalGeneration imports transformers' Gemma 4 image processor, which
# needs torchvision; PyPI has only CUDA builds of it, which do not load next to the CPU torch.
# vLLM's Gemma4ForCausalLM reads the same folder: `model.language_model.*` as its decoder, the
# towers skipped (vllm/model_executor/models/gemma4.py, Gemma4ForCausalLM.hf_to_vllm_mapper).
TEXT_ONLY = ("--hf-overrides=" + json.dumps({"architectures": ["Gemma4ForCausalLM"]}),)
ENDPOINTS = {
    "completion": ("/v1/completions", {"prompt": PROMPT}),
    "chat": ("/v1/chat/completions", {"messages": MESSAGES}),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """What the pipeline serves: a tiny base shaped like the release (Gemma4ForConditionalGeneration,
    vision tower included) merged with a LoRA checkpoint by the merge workload.

    float32, so that both runtimes agree to ~1e-5. Random models tend to repeat one token; with
    these seeds the greedy continuations vary and the top-2 logit margins stay far above that noise.
    """
    root = tmp_path_factory.mktemp("tiny-gemma")
    base = tiny.write_checkpoint(root / "base", dtype="float32", seed=3, vision=tiny.TinyVisionConfig())
    tiny.write_lora_checkpoint(root / "checkpoints", base.config, rank=4, alpha=8.0, seed=7)
    result = merge.merge(
        MergeConfig(
            base_model_path=str(base.path),
            checkpoint_dir=str(root / "checkpoints"),
            output_dir=str(root / "merged"),
            dtype="float32",
            termination_log=str(root / "result"),
        )
    )
    assert result.status == "succeeded" and result.tensors_merged > 0
    return SimpleNamespace(path=root / "merged", base=base.path)


@pytest.fixture(scope="module")
def server(vllm_python, checkpoint, tmp_path_factory):
    port = local_vllm.free_port()
    launch = VllmLaunch(
        model=str(checkpoint.path),
        served_name=SERVED_NAME,
        device="cpu",
        dtype="float32",
        max_model_len=512,
        max_num_seqs=4,
        port=port,
        api_key_secret=KEY_REF,
        extra_args=TEXT_ONLY,
    )
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    secret_store = {(KEY_REF.name, KEY_REF.key): API_KEY}
    proc = local_vllm.start_rendered(launch, bin_dir=vllm_python.parent, log_path=log_path, secrets=secret_store)
    try:
        proc.wait_ready(SERVED_NAME, api_key=API_KEY, timeout=240)
    except RuntimeError as err:
        proc.stop()
        pytest.fail(f"vLLM did not start: {err}")
    yield proc
    proc.stop()
    assert not local_vllm.group_alive(proc.proc.pid), "vLLM processes left behind"
    with socket.socket() as sock:  # with SO_REUSEADDR, bind fails only while someone listens
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", port))


@pytest.fixture(scope="module")
def reference(checkpoint):
    """transformers' greedy continuations of the prompt and of the chat: (prompt ids, new ids)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint.path)
    chat_ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True)["input_ids"]
    result = {}
    for label, path in (("", checkpoint.path), ("base-", checkpoint.base)):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        assert type(model).__name__ == "Gemma4ForConditionalGeneration"
        for name, prompt_ids in (("completion", tokenizer(PROMPT)["input_ids"]), ("chat", list(chat_ids))):
            with torch.no_grad():
                out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=MAX_TOKENS, do_sample=False)
            result[label + name] = (prompt_ids, out[0, len(prompt_ids) :].tolist())
    return result


def test_the_merge_changed_what_is_served(reference):
    assert any(reference[e][1] != reference["base-" + e][1] for e in ENDPOINTS), "the adapter must change the output"


def post(server, path, body, api_key=API_KEY):
    return local_vllm.request(f"{server.base_url}{path}", body, api_key=api_key)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_greedy_output_equals_transformers(server, reference, endpoint):
    path, inputs = ENDPOINTS[endpoint]
    prompt_ids, expected = reference[endpoint]
    request = {"model": SERVED_NAME, **inputs, "max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": True}
    status, body = post(server, path, request)
    assert status == 200, body
    choice = body["choices"][0]
    # Completions report the prompt's ids per choice, chat completions once per response.
    served_prompt = choice.get("prompt_token_ids") or body.get("prompt_token_ids")
    assert served_prompt == prompt_ids, "the prompt (or the chat template) was tokenized differently"
    assert served_prompt[0] == tiny.BOS_ID != served_prompt[1], "one <bos>, first: the template's or the prompt's own"
    assert choice["token_ids"] == expected
    assert len(set(expected)) >= 5, f"too uniform to compare: {expected}"


def test_api_key_from_the_secret_is_enforced(server):
    request = {"model": SERVED_NAME, "prompt": PROMPT, "max_tokens": 2}
    assert post(server, "/v1/completions", request, api_key=None)[0] == 401
    assert post(server, "/v1/completions", request, api_key="wrong")[0] == 401
    assert post(server, "/v1/completions", request)[0] == 200
    cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()
    assert API_KEY.encode() not in cmdline, "the API key must not be on the command line"


# ---------------------------------------------------------------------------- the benchmark Job

BENCH_NS, CLAIM = "default", "gemma-data"
BENCH = {"inputLen": 32, "outputLen": 8, "numPrompts": 6, "maxConcurrency": 2, "timeoutSeconds": 300}


def _benchmark_plan(checkpoint):
    """A cpu GemmaServe of the served checkpoint, read from a claim as a pod reads it, with a benchmark."""
    spec = (
        serve("tiny")
        .tpu("cpu")
        .set("model", {"uri": f"/data/{checkpoint.path.name}", "servedName": SERVED_NAME})
        .set("storage", {"persistentVolumeClaim": CLAIM, "mountPath": "/data"})
        .set("vllm", {"maxModelLen": 512, "maxNumSeqs": 4, "apiKeySecretRef": KEY_REF.model_dump(by_alias=True)})
        .set("benchmark", BENCH)
        .spec
    )
    return plan_serve("tiny", BENCH_NS, spec, OperatorSettings())


def _decide(plan, status, job=None, pods=()):
    deployment = serving_objects(plan, OperatorSettings())[0]
    deployment["metadata"]["generation"] = 1
    view = serve_view(
        plan,
        status,
        name="tiny",
        namespace=BENCH_NS,
        workload=with_status(deployment, DEPLOYMENT_READY),
        benchmark=BenchmarkView(job, list(pods)),
    )
    return serve_lifecycle.decide(view, OperatorSettings())


def _run_pod(job, server, plan, vllm_python, checkpoint, workdir) -> dict:
    """Run the Job's pod as the local node's kubelet runs it, with the Service routed to the server."""
    template = job["spec"]["template"]
    pod = {"metadata": {**template["metadata"], "name": "bench-0", "namespace": BENCH_NS}, "spec": template["spec"]}
    port = server.base_url.rsplit(":", 1)[1]
    behind = {
        "metadata": {
            "name": "tiny-vllm-0",
            "namespace": BENCH_NS,
            "labels": serving.selector(plan),
            "annotations": {HOST_PORT_ANNOTATION: port},
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    service = next(o for o in serving_objects(plan, OperatorSettings()) if o["kind"] == "Service")
    node = Node(workdir, {plan.image: vllm_python.parent}, {CLAIM: checkpoint.path.parent})
    secret = {KEY_REF.name: {"data": {KEY_REF.key: base64.b64encode(API_KEY.encode()).decode()}}}
    local = LocalPod.start(pod, node, {}, secret, services.routes([service], [behind]))
    deadline = time.monotonic() + BENCH["timeoutSeconds"]
    while local.exit_code() is None and time.monotonic() < deadline:
        time.sleep(1)
    local.stop(5)
    status = local.status()
    assert status["phase"] == "Succeeded", local.group.log_tail(40)
    return {**pod, "status": status}


def _served(server) -> dict[str, float]:
    """The server's own request and token counters (its Prometheus /metrics, summed over labels)."""
    with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=30) as response:
        text = response.read().decode()
    names = {"requests": "vllm:request_success_total", "generated": "vllm:generation_tokens_total"}
    return {
        key: sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))
        for key, name in names.items()
    }


def test_the_benchmark_job_measures_the_real_server_once(server, checkpoint, vllm_python, tmp_path):
    plan = _benchmark_plan(checkpoint)
    first = _decide(plan, {})
    [job] = [o for o in first.create if o["kind"] == "Job"]
    assert job["metadata"]["name"] == benchmark.name(plan)
    before = _served(server)
    pod = _run_pod(job, server, plan, vllm_python, checkpoint, tmp_path)
    after = _served(server)
    done = _decide(plan, first.status, with_status(job, COMPLETE), [pod])
    figures = done.status["benchmark"]
    print(f"\nbenchmark figures: {json.dumps(figures, sort_keys=True)}")
    assert figures["state"] == "Succeeded" and figures["revision"] == plan.revision
    assert (figures["completed"], figures["errors"]) == (BENCH["numPrompts"], 0)
    assert 0 < figures["ttftP50Ms"] <= figures["ttftP90Ms"] <= figures["ttftP99Ms"]
    assert figures["outputTokensPerSecond"] > 0 and figures["tpotP50Ms"] > 0
    assert not [o for o in _decide(plan, done.status).create if o["kind"] == "Job"], "measured once per revision"
    # The figures are this server's: its own counters saw the benchmark's requests, each decoding
    # outputLen tokens (--ignore-eos), and one more of the same shape, the ready check that vllm bench
    # serve sends first (`wait_for_endpoint` in vllm/benchmarks/serve.py; only its success is counted).
    assert after["requests"] - before["requests"] == BENCH["numPrompts"] + 1, (before, after)
    assert after["generated"] - before["generated"] == (BENCH["numPrompts"] + 1) * BENCH["outputLen"]
