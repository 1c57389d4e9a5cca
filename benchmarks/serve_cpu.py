"""Time to ready and request latency of vLLM on CPU, started as the operator renders it.

    .venv/bin/python benchmarks/serve_cpu.py [--requests 20] [--max-tokens 16] [--extra-arg=--no-enforce-eager]

A tiny random Gemma 4 model: this measures the serving stack's overhead (start-up, HTTP, the
scheduler), not model speed. Every request generates exactly --max-tokens tokens (EOS ignored).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from gemma_devcluster import local_vllm, tiny
from gemma_operator.children.vllm import VllmLaunch

REPO = Path(__file__).resolve().parents[1]
SERVED_NAME = "tiny-gemma"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: with ~20 samples, interpolating would invent precision."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def measure(server: local_vllm.VllmProcess, requests: int, max_tokens: int) -> tuple[list[float], int]:
    body = {
        "model": SERVED_NAME,
        "prompt": "<bos>Q: What is the capital of Peru?\nA:",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    local_vllm.request(f"{server.base_url}/v1/completions", body)  # the first request pays one-off costs
    latencies, tokens = [], 0
    for _ in range(requests):
        start = time.perf_counter()
        status, reply = local_vllm.request(f"{server.base_url}/v1/completions", body)
        latencies.append(time.perf_counter() - start)
        assert status == 200, reply
        tokens += reply["usage"]["completion_tokens"]
    return latencies, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--vllm-python", type=Path, default=Path(os.environ.get("GEMMA_VLLM_PYTHON", REPO / ".venv-vllm/bin/python"))
    )
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--extra-arg", action="append", default=[], help="appended to the vLLM args")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        model = tiny.write_checkpoint(Path(work) / "model", dtype=opts.dtype).path
        launch = VllmLaunch(
            model=str(model),
            served_name=SERVED_NAME,
            device="cpu",
            dtype=opts.dtype,
            max_model_len=512,
            max_num_seqs=4,
            port=local_vllm.free_port(),
            extra_args=tuple(opts.extra_arg),
        )
        server = local_vllm.start_rendered(launch, bin_dir=opts.vllm_python.parent, log_path=Path(work) / "log")
        try:
            ready = server.wait_ready(SERVED_NAME)
            latencies, tokens = measure(server, opts.requests, opts.max_tokens)
        finally:
            server.stop()
    ms = [1000 * s for s in latencies]
    print(f"time to ready (start -> /v1/models lists the model): {ready:.1f} s")
    print(
        f"latency over {len(ms)} completions of {opts.max_tokens} tokens: "
        f"p50 {percentile(ms, 50):.0f} ms, p95 {percentile(ms, 95):.0f} ms"
    )
    print(f"decode throughput, one request at a time: {tokens / sum(latencies):.0f} tokens/s")


if __name__ == "__main__":
    main()
