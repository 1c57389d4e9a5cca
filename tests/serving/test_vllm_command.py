"""The vLLM command line: one shape for TPU and CPU, owned flags protected, the key in a Secret;
and vLLM's own argument parser reads the rendered command lines as the operator means them."""

import json
import re
import shlex
import subprocess
from dataclasses import replace
from typing import Any

import kubernetes_validate
import pytest
import yaml
from scripts.manifests import ROOT

from gemma_operator.api import SecretKeyRef
from gemma_operator.children import serving, serving_objects
from gemma_operator.children.vllm import COMMAND, VllmLaunch, vllm_container
from gemma_operator.cli import plan_documents
from gemma_operator.settings import OperatorSettings

KEY_REF = SecretKeyRef(name="vllm-key", key="api-key")


def launch(**overrides) -> VllmLaunch:
    base = VllmLaunch(model="/models/merged", served_name="gemma4-31b-ft", device="tpu", tensor_parallel_size=8)
    return replace(base, **overrides)


def test_tpu_command_line_is_the_known_good_one():
    command, args, env = vllm_container(launch(max_num_batched_tokens=4096))
    assert command == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert args == [
        "--model=/models/merged",
        "--served-model-name=gemma4-31b-ft",
        "--host=0.0.0.0",
        "--port=8000",
        "--max-model-len=4096",
        "--max-num-seqs=64",
        "--max-num-batched-tokens=4096",
        "--gpu-memory-utilization=0.9",
        "--tensor-parallel-size=8",
        "--disable-chunked-mm-input",
    ]
    assert env == []


def test_cpu_differs_from_tpu_only_in_device_flags_and_env():
    tpu_command, tpu_args, _ = vllm_container(launch())
    cpu_command, cpu_args, cpu_env = vllm_container(launch(device="cpu", tensor_parallel_size=1, dtype="float32"))
    tpu_only = ["--tensor-parallel-size=8", "--disable-chunked-mm-input"]
    cpu_only = ["--dtype=float32", "--enforce-eager", "--distributed-executor-backend=uni"]
    assert cpu_command == tpu_command
    assert [a for a in tpu_args if a not in tpu_only] == [a for a in cpu_args if a not in cpu_only]
    assert set(tpu_only) <= set(tpu_args) and not set(tpu_only) & set(cpu_args)
    assert set(cpu_only) <= set(cpu_args) and not set(cpu_only) & set(tpu_args)
    assert cpu_env == [
        {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"},
        {"name": "VLLM_ENABLE_V1_MULTIPROCESSING", "value": "0"},
    ]


def test_cpu_profile_refuses_tensor_parallelism():
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        launch(device="cpu")


def test_optional_batched_tokens_and_extra_args_come_in_order():
    _, args, _ = vllm_container(launch(extra_args=["--kv-cache-dtype=fp8", "--max-loras", "2"]))
    assert not any(a.startswith("--max-num-batched-tokens") for a in args)
    assert args[-3:] == ["--kv-cache-dtype=fp8", "--max-loras", "2"]


def test_rendering_is_deterministic_and_returns_fresh_lists():
    spec = launch(extra_args=["--seed=1"], api_key_secret=KEY_REF)
    first = vllm_container(spec)
    first[0].append("mutated")
    first[1].clear()
    assert vllm_container(spec) == vllm_container(replace(spec))
    assert vllm_container(spec)[0] == COMMAND == ["python3", "-m", "vllm.entrypoints.openai.api_server"]


def test_api_key_comes_from_the_secret_never_from_args():
    _, args, env = vllm_container(launch(device="cpu", tensor_parallel_size=1, api_key_secret=KEY_REF))
    assert {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "vllm-key", "key": "api-key"}}} in env
    assert not any("api-key" in a or "vllm-key" in a for a in args)
    assert all(e["name"] != "VLLM_API_KEY" for e in vllm_container(launch())[2])


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--port=9000"], "--port"),
        (["--port", "9000"], "--port"),
        (["--host=127.0.0.1"], "--host"),
        (["--model", "/elsewhere"], "--model"),
        (["--served-model-name=x"], "--served-model-name"),
        (["--served_model_name=x"], "--served-model-name"),  # vLLM reads _ as -
        (["--por=9000"], "--port"),  # argparse takes unambiguous prefixes
        (["--seed=1", "--ho", "x"], "--host"),
    ],
)
def test_extra_args_may_not_override_owned_flags(extra, flag):
    with pytest.raises(ValueError, match=f"{flag} .*the operator sets it"):
        vllm_container(launch(extra_args=extra))


@pytest.mark.parametrize("extra", [["--api-key=secret"], ["--api_key", "secret"]])
def test_extra_args_may_not_carry_the_api_key(extra):
    with pytest.raises(ValueError, match="--api-key must come from a Secret"):
        vllm_container(launch(extra_args=extra))


def test_flags_that_merely_start_like_owned_ones_are_allowed():
    extra = ["--model-impl=vllm", "--hf-overrides={}", "--model-loader-extra-config={}"]
    assert vllm_container(launch(extra_args=extra))[1][-3:] == extra


def test_rendered_container_is_a_valid_kubernetes_container():
    command, args, env = vllm_container(launch(device="cpu", tensor_parallel_size=1, api_key_secret=KEY_REF))
    container = {"name": "vllm", "image": "vllm/vllm-cpu", "command": command, "args": args, "env": env}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "vllm"}, "spec": {"containers": [container]}}
    kubernetes_validate.validate(pod, "1.34", strict=True)


# Runs in the vLLM environment: parse each argv as the api_server module does, print what it set;
# then the engine start-up timeout vLLM reads (vllm/envs.py), without and with the given env.
PARSE = """
import json, os, sys
import vllm.envs as envs
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
plain = (str, int, float, bool, list, type(None))
given = json.loads(sys.stdin.read())
for argv in given["argvs"]:
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    validate_parsed_serve_args(args)
    print(json.dumps({k: v for k, v in vars(args).items() if isinstance(v, plain)}))
default = envs.VLLM_ENGINE_READY_TIMEOUT_S
os.environ.update(given["env"])
print(json.dumps([default, envs.VLLM_ENGINE_READY_TIMEOUT_S]))
"""


def parse(vllm_python, *argvs: list[str], env: dict[str, str] | None = None) -> tuple[list[dict], list[int]]:
    """One interpreter for all argvs: importing vLLM takes a while on a small machine."""
    result = subprocess.run(
        [str(vllm_python), "-c", PARSE],
        input=json.dumps({"argvs": argvs, "env": env or {}}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    return [json.loads(line) for line in lines[-len(argvs) - 1 : -1]], json.loads(lines[-1])


@pytest.mark.slow
def test_tpu_and_cpu_flags_mean_what_the_operator_intends(vllm_python):
    tpu = VllmLaunch(
        model="/models/merged",
        served_name="ft",
        device="tpu",
        tensor_parallel_size=8,
        max_num_batched_tokens=4096,
        port=8001,
        engine_ready_timeout_s=900,
    )
    cpu = VllmLaunch(model="/models/merged", served_name="ft", device="cpu", dtype="float32", port=8001)
    env = {e["name"]: e["value"] for e in vllm_container(tpu)[2] if "value" in e}
    # `--por`: why the builder refuses prefixes of its own flags in extra args.
    (parsed_tpu, parsed_cpu, prefix), timeouts = parse(
        vllm_python, vllm_container(tpu)[1], vllm_container(cpu)[1], ["--por=9"], env=env
    )
    # vLLM gives up on its engine after VLLM_ENGINE_READY_TIMEOUT_S: the operator's value is read.
    assert timeouts == [600, 900]
    shared = {
        "model": "/models/merged",
        "served_model_name": ["ft"],
        "host": "0.0.0.0",
        "port": 8001,
        "max_model_len": 4096,
        "max_num_seqs": 64,
        "gpu_memory_utilization": 0.9,
    }
    for parsed in (parsed_tpu, parsed_cpu):
        assert {k: parsed[k] for k in shared} == shared
    assert parsed_tpu["tensor_parallel_size"] == 8 and parsed_tpu["disable_chunked_mm_input"] is True
    assert parsed_tpu["max_num_batched_tokens"] == 4096 and parsed_tpu["dtype"] == "auto"
    assert parsed_cpu["tensor_parallel_size"] == 1 and parsed_cpu["enforce_eager"] is True
    assert parsed_cpu["dtype"] == "float32" and parsed_cpu["api_key"] is None
    assert prefix["port"] == 9


def example_servers() -> dict[str, tuple[Any, list[str]]]:
    """The vLLM argv (after the module) of every example GemmaServe, TPU ones included: a
    Deployment's container args, or the command a LeaderWorkerSet leader runs once Ray has formed."""
    docs = [d for f in sorted((ROOT / "examples").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    settings = OperatorSettings()
    plans, problems = plan_documents(docs, settings)
    assert not problems, problems
    out = {}
    for kind, plan in plans:
        if kind != "GemmaServe":
            continue
        workload = serving_objects(plan, settings)[0]
        container = serving.pod_template(workload)["spec"]["containers"][0]
        if workload["kind"] == "LeaderWorkerSet":
            argv = shlex.split(container["command"][-1].rsplit("; exec ", 1)[1])
        else:
            argv = container["command"] + container["args"]
        assert argv[: len(COMMAND)] == COMMAND
        out[plan.name] = (plan, argv[len(COMMAND) :])
    return out


@pytest.mark.slow
def test_every_example_servers_flags_are_accepted_by_the_pinned_vllm(vllm_python):
    """The TPU image's vLLM (vllm-tpu), the GPU image's (vllm/vllm-openai) and the CPU build here are
    the same vLLM release, whose engine arguments (vllm/engine/arg_utils.py) do not depend on the
    platform: its parser reads the TPU and GPU command lines too. Not checked here: tpu-inference's
    own checks of the config at start-up (tpu_platform.py), which need a TPU, the CUDA platform's,
    which need a GPU, and the Ray launcher's flags (a shell script)."""
    version = subprocess.run(
        [str(vllm_python), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    pinned = re.search(r"^VLLM_TPU_VERSION = (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert version == pinned, "the parser here is not the serving image's vLLM"
    assert re.search(r"^VLLM_GPU_VERSION = (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1) == pinned
    servers = example_servers()
    assert len(servers) >= 2 and any(p.multi_host for p, _ in servers.values())
    parsed, _ = parse(vllm_python, *(argv for _, argv in servers.values()))
    for (plan, _), args in zip(servers.values(), parsed, strict=True):
        assert args["tensor_parallel_size"] == plan.tensor_parallel > 1
        assert args["max_model_len"] == plan.spec.vllm.max_model_len
        # Gemma 4's wide heads break chunked multimodal prefill on TPU only (children/vllm.py).
        assert args["disable_chunked_mm_input"] is (plan.placement.gpus is None) and args["port"] == 8000
    assert any(p.placement.gpus for p, _ in servers.values()), "a GPU server's command line is read too"


BENCH_PARSE = """
import json, sys
from vllm.benchmarks.serve import add_cli_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for argv in json.loads(sys.stdin.read()):
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    out.append({k: v for k, v in vars(parser.parse_args(argv)).items() if isinstance(v, (str, int, float, list))})
print(json.dumps(out))
"""


@pytest.mark.slow
def test_the_benchmark_jobs_flags_are_vllm_bench_serves(vllm_python):
    """The benchmark Job's arguments, random prompts and a prompts file, through the parser the Job's
    program uses (vllm.benchmarks.serve.add_cli_args, as `vllm bench serve`)."""
    from tests.support.builders import serve

    from gemma_operator.children import benchmark
    from gemma_operator.plan import plan_serve

    argvs = []
    for extra in (
        {"requestRate": 2, "slo": {"ttftP99Ms": 800, "tpotP99Ms": 40}},
        {"promptsUri": "gs://evals/eval.jsonl"},
    ):
        spec = serve("s").fine_tune("ft").set("benchmark", {"numPrompts": 5, "maxConcurrency": 3, **extra}).spec
        plan = plan_serve("s", "ns", spec, OperatorSettings(), model_uri="gs://o/m", fine_tune_preset="gemma4-31b")
        argvs.append(benchmark.job(plan, OperatorSettings(), None)["spec"]["template"]["spec"]["containers"][0]["args"])
    result = subprocess.run(
        [str(vllm_python), "-c", BENCH_PARSE], input=json.dumps(argvs), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    random, custom = json.loads(result.stdout.strip().splitlines()[-1])
    assert (random["dataset_name"], random["random_input_len"], random["random_output_len"]) == ("random", 256, 128)
    assert (random["num_prompts"], random["max_concurrency"], random["request_rate"]) == (5, 3, 2.0)
    assert random["goodput"] == ["ttft:800", "tpot:40"] and random["metric_percentiles"] == "50,90,99"
    assert random["base_url"] == "http://s-vllm.ns.svc:8000" and random["model"] == "s"
    assert (custom["dataset_name"], custom["dataset_path"], custom["custom_output_len"]) == (
        "custom",
        "/benchmark-prompts/eval.jsonl",
        128,
    )
