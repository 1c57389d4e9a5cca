"""vLLM's own argument parser reads the rendered command lines as the operator means them."""

import json
import subprocess

import pytest

from gemma_operator.children.vllm import VllmLaunch, vllm_container

pytestmark = pytest.mark.slow

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
    result = subprocess.run([str(vllm_python), "-c", PARSE], input=json.dumps({"argvs": argvs, "env": env or {}}),
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    return [json.loads(line) for line in lines[-len(argvs) - 1:-1]], json.loads(lines[-1])


def test_tpu_and_cpu_flags_mean_what_the_operator_intends(vllm_python):
    tpu = VllmLaunch(model="/models/merged", served_name="ft", device="tpu", tensor_parallel_size=8,
                     max_num_batched_tokens=4096, port=8001, engine_ready_timeout_s=900)  # fmt: skip
    cpu = VllmLaunch(model="/models/merged", served_name="ft", device="cpu", dtype="float32", port=8001)
    env = {e["name"]: e["value"] for e in vllm_container(tpu)[2] if "value" in e}
    # `--por`: why the builder refuses prefixes of its own flags in extra args.
    (parsed_tpu, parsed_cpu, prefix), timeouts = parse(vllm_python, vllm_container(tpu)[1], vllm_container(cpu)[1],
                                                       ["--por=9"], env=env)  # fmt: skip
    # vLLM gives up on its engine after VLLM_ENGINE_READY_TIMEOUT_S: the operator's value is read.
    assert timeouts == [600, 900]
    shared = {"model": "/models/merged", "served_model_name": ["ft"], "host": "0.0.0.0", "port": 8001,
              "max_model_len": 4096, "max_num_seqs": 64, "gpu_memory_utilization": 0.9}  # fmt: skip
    for parsed in (parsed_tpu, parsed_cpu):
        assert {k: parsed[k] for k in shared} == shared
    assert parsed_tpu["tensor_parallel_size"] == 8 and parsed_tpu["disable_chunked_mm_input"] is True
    assert parsed_tpu["max_num_batched_tokens"] == 4096 and parsed_tpu["dtype"] == "auto"
    assert parsed_cpu["tensor_parallel_size"] == 1 and parsed_cpu["enforce_eager"] is True
    assert parsed_cpu["dtype"] == "float32" and parsed_cpu["api_key"] is None
    assert prefix["port"] == 9

