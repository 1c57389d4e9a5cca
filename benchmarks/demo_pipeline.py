"""The local pipeline's wall time: apply -> served answer, per phase, as `make demo` runs it, on the
in-process API or on a real control plane (`make demo-real`), or both one after the other.

    python benchmarks/demo_pipeline.py [--vllm-python .venv-vllm/bin/python] [--backend in-process|real|both]
                                       [--runs 2]

Runs `gemma-tpu dev` in a fresh folder (so nothing is reused from an earlier run; with --runs N,
N times in it, as `make demo` run again: the later runs read the compilation caches the first one
wrote, the training's JAX programs and vLLM's cache root) and prints the
time each resource spent in each phase, the total from apply to the served answers, how many
of the fine-tuned model's answers are right, and what the serving benchmark (spec.benchmark of
the quick start) adds to the rollout: the time from Ready until its figures are in the status
(the service is Ready and answers meanwhile), and the figures. Each run starts with the machine's
load average (1 and 5 minutes), since on a shared machine that decides much of the time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import tempfile
from pathlib import Path

from gemma_devcluster import dev
from gemma_operator import benchmark_results

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = {"in-process": False, "real": True}  # name -> `gemma-tpu dev --real`


def measure(vllm_python: str, real: bool, workdir: str) -> dev.Outcome:
    args = argparse.Namespace(
        workdir=workdir,
        examples=str(ROOT / "examples" / "quickstart"),
        vllm_python=vllm_python,
        port=0,
        kubeconfig=None,
        real=real,
        timeout=900,
        keep_running=False,
    )
    with contextlib.redirect_stdout(io.StringIO()):
        return asyncio.run(dev.run(args, asyncio.Event()))


def report(name: str, out: dev.Outcome) -> None:
    print(f"{'resource':<34} {'phase':<16} {'seconds':>8}   ({name})")
    for resource, phase, seconds in out.phases:
        if phase != "-":
            print(f"{resource:<34} {phase:<16} {seconds:8.1f}")
    print(f"{'apply -> served answers':<51} {out.total_seconds:8.1f}")
    right = sum(a.correct for a in out.answers)
    print(f"answers of the fine-tuned model right: {right}/{len(out.answers)}")
    if out.benchmark:
        b = out.benchmark
        print(f"{'Ready -> benchmark figures in status':<51} {out.benchmark_seconds:8.1f}")
        print(f"{'  of which the benchmark itself (vllm bench serve)':<51} {b.get('durationSeconds', 0):8.1f}")
        print(f"benchmark: {b['state']}: {benchmark_results.describe(b) or b.get('message')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--backend", choices=[*BACKENDS, "both"], default="in-process")
    parser.add_argument("--runs", type=int, default=1, help="runs in the same folder, the first from nothing")
    opts = parser.parse_args()
    for name in BACKENDS if opts.backend == "both" else [opts.backend]:
        with tempfile.TemporaryDirectory() as workdir:
            for run in range(1, opts.runs + 1):
                one, five, _ = os.getloadavg()
                print(
                    f"\n{name}, run {run} of {opts.runs}: load average {one:.1f} (1 min), {five:.1f} (5 min) "
                    f"on {os.cpu_count()} CPUs before the run"
                )
                report(name, measure(opts.vllm_python, BACKENDS[name], workdir))


if __name__ == "__main__":
    main()
