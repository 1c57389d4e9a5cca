"""vLLM's start-up on a real cluster: its own engine timeout, and the multi-host Ray launch."""

from __future__ import annotations

import re
import subprocess

import pytest

from gemma_operator.children import serving_objects
from gemma_operator.plan import plan_serve
from gemma_operator.settings import Images, OperatorSettings
from tests.support.builders import serve

SETTINGS = OperatorSettings()
VLLM_DEFAULT_ENGINE_READY_TIMEOUT_S = 600  # vllm/envs.py: VLLM_ENGINE_READY_TIMEOUT_S


def workload(b, settings=SETTINGS, **kw) -> dict:
    return serving_objects(plan_serve(b.name, "ns", b.spec, settings, **kw), settings)[0]


def containers(obj: dict) -> dict[str, dict]:
    if obj["kind"] == "Deployment":
        return {"server": obj["spec"]["template"]["spec"]["containers"][0]}
    tmpl = obj["spec"]["leaderWorkerTemplate"]
    return {role: tmpl[f"{role}Template"]["spec"]["containers"][0] for role in ("leader", "worker")}


def env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container["env"]}


@pytest.mark.parametrize(
    "b, preset",
    [
        (serve("s"), "gemma4-31b"),
        (serve("s").tpu("v6e", "4x4"), "gemma4-31b"),
        (serve("s").set("startupTimeoutSeconds", 3600), "gemma4-31b"),
        (serve("s").tpu("cpu").set("model", {"uri": "/data/m"}).set("storage", {"persistentVolumeClaim": "d"}), None),
    ],
)
def test_the_engine_waits_as_long_as_the_startup_probe(b, preset):
    c = containers(workload(b, fine_tune_preset=preset))
    served = c.get("server") or c["leader"]
    probe = served["startupProbe"]
    budget = probe["periodSeconds"] * probe["failureThreshold"]
    assert int(env(served)["VLLM_ENGINE_READY_TIMEOUT_S"]) >= budget
    if preset == "gemma4-31b":
        assert budget > VLLM_DEFAULT_ENGINE_READY_TIMEOUT_S, "the default would give up before the probe"


def test_every_host_of_a_multi_host_slice_uses_the_ray_executor():
    c = containers(workload(serve("s").tpu("v6e", "4x4"), fine_tune_preset="gemma4-31b"))
    assert env(c["leader"])["TPU_MULTIHOST_BACKEND"] == "ray" == env(c["worker"])["TPU_MULTIHOST_BACKEND"]
    assert "TPU_MULTIHOST_BACKEND" not in env(containers(workload(serve("s"), fine_tune_preset="gemma4-31b"))["server"])


def run_as_kubelet(container: dict, env_vars: dict[str, str]) -> subprocess.CompletedProcess:
    """The container's command in a real shell, after the kubelet's `$(VAR)` expansion."""
    command = [re.sub(r"\$\((\w+)\)", lambda m: env_vars[m.group(1)], part) for part in container["command"]]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def test_a_missing_ray_launcher_fails_the_pod_with_a_message(tmp_path):
    settings = OperatorSettings(images=Images(serving_tpu_ray_script=str(tmp_path / "examples/ray_serving/absent.sh")))
    c = containers(workload(serve("s").tpu("v6e", "4x4"), settings, fine_tune_preset="gemma4-31b"))
    for role in ("leader", "worker"):
        result = run_as_kubelet(c[role], {"LWS_GROUP_SIZE": "4", "LWS_LEADER_ADDRESS": "s-vllm-0.s-vllm"})
        assert result.returncode == 1 and "images.serving_tpu_ray_script" in result.stderr, result
        assert "absent.sh is not in this image" in result.stderr
        assert c[role]["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_the_ray_launcher_waits_for_the_slice_as_long_as_the_startup_probe(tmp_path):
    """vLLM's multi-node-serving.sh gives up after ray_init_timeout, 300 s unless told otherwise
    (vllm examples/online_serving/ and examples/ray_serving/multi-node-serving.sh): the leader
    exits while workers still pull the image or wait for their nodes, and the group restarts
    forever. Each role passes the startup budget as --ray_init_timeout."""
    script, calls = tmp_path / "multi-node-serving.sh", tmp_path / "calls"
    script.write_text(f'echo "$@" >> {calls}\n')
    settings = OperatorSettings(images=Images(serving_tpu_ray_script=str(script)))
    c = containers(workload(serve("s").tpu("v6e", "4x4"), settings, fine_tune_preset="gemma4-31b"))
    probe = c["leader"]["startupProbe"]
    budget = probe["periodSeconds"] * probe["failureThreshold"]
    run_as_kubelet(c["worker"], {"LWS_LEADER_ADDRESS": "s-vllm-0.s-vllm"})
    (worker_args,) = calls.read_text().splitlines()
    timeout = re.fullmatch(r"worker --ray_address=s-vllm-0\.s-vllm --ray_init_timeout=(\d+)", worker_args)
    assert timeout and int(timeout.group(1)) >= budget > 300


@pytest.mark.parametrize("launcher_exit", [0, 3])
def test_the_leader_starts_vllm_only_once_ray_is_up(tmp_path, launcher_exit):
    script, calls = tmp_path / "multi-node-serving.sh", tmp_path / "calls"
    script.write_text(f'echo "$@" >> {calls}\nexit {launcher_exit}\n')
    settings = OperatorSettings(images=Images(serving_tpu_ray_script=str(script)))
    c = containers(workload(serve("s").tpu("v6e", "4x4"), settings, fine_tune_preset="gemma4-31b"))
    leader = dict(
        c["leader"],
        command=[
            *c["leader"]["command"][:2],
            c["leader"]["command"][2].replace("exec python3 -m", "exec echo STARTED"),
        ],
    )
    result = run_as_kubelet(leader, {"LWS_GROUP_SIZE": "4"})
    assert calls.read_text() == "leader --ray_cluster_size=4 --ray_init_timeout=914\n"
    if launcher_exit:
        assert result.returncode == 1 and "STARTED" not in result.stdout and "did not form" in result.stderr
    else:
        assert result.returncode == 0 and result.stdout.startswith("STARTED vllm.entrypoints.openai.api_server --model")
