"""Time to the first training step through the CLI contract, with JAX's persistent compilation
cache cold and then warm: what a restarted pod (a Spot preemption, a retried attempt, a resumed
run) saves.

    python benchmarks/compilation_cache.py                 # the tiny model, CPU-sized
    python benchmarks/compilation_cache.py --model DIR --dataset FILE --seq 3072 --dtype bfloat16

It runs `python -m gemma_workloads train --config FILE` twice with one fresh
`compilation_cache_dir` (each run its own output folder, so the second starts from scratch rather
than resuming) and prints, per run, the seconds from the process's start until its first progress
line (step 1 done: imports, data, model load, LoRA, compilation and the step itself) and what the
run's summary says it read from the cache and wrote to it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gemma_devcluster import tiny
from gemma_workloads.compilation_cache import CacheUse
from gemma_workloads.config import Progress, TrainConfig


def first_step(config_path: Path, log_path: Path) -> tuple[float, float, CacheUse | None]:
    """Seconds to the first progress line and to the end, and the run's cache summary."""
    began = time.monotonic()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gemma_workloads", "train", "--config", str(config_path)],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        assert proc.stdout is not None
        first = None
        for line in proc.stdout:
            if first is None and Progress.last_in(line):
                first = time.monotonic() - began
        code = proc.wait()
    if code != 0 or first is None:
        raise RuntimeError(f"the run failed (exit {code}): {log_path.read_text()[-3000:]}")
    return first, time.monotonic() - began, CacheUse.from_log(log_path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a Gemma 4 checkpoint folder (default: the tiny model, written here)")
    parser.add_argument("--dataset", help="a chat JSONL (default: the tiny model's)")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--cache", help="the cache folder or gs:// prefix (default: a fresh temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="compilation-cache-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        model = args.model or str(tiny.write_checkpoint(tmp / "model", shards=1).path)
        dataset = args.dataset or str(tmp / "chat.jsonl")
        if not args.dataset:
            tiny.write_dataset(Path(dataset), "chat", n=32)
        rows = []
        for run in ("cold", "warm"):
            config = TrainConfig.model_validate(
                {
                    "model_path": model,
                    "model_dtype": args.dtype,
                    "dataset": {"path": dataset, "format": "chat", "max_seq_len": args.seq},
                    "steps": args.steps,
                    "batch_size": args.micro_batch,
                    "micro_batch_size": args.micro_batch,
                    "log_every": 1,
                    "output_dir": str(tmp / run),
                    "termination_log": str(tmp / f"{run}.termination-log"),
                    "compilation_cache_dir": args.cache or str(tmp / "jax-cache"),
                }
            )
            path = tmp / f"{run}.json"
            path.write_text(config.dumps())
            rows.append((run, *first_step(path, tmp / f"{run}.log")))
    print(f"model {model}, {args.micro_batch} x {args.seq} tokens a step, {args.dtype}")
    print(
        f"\n{'cache':6} {'first step s':>13} {'whole run s':>12} {'programs read':>14} {'compile s saved':>16} {'written':>8}"
    )
    for run, first, whole, use in rows:
        read = f"{use.read} of {use.looked_up}" if use else "n/a"
        saved, written = (f"{use.seconds_saved:.1f}", str(use.written)) if use else ("n/a", "n/a")
        print(f"{run:6} {first:13.1f} {whole:12.1f} {read:>14} {saved:>16} {written:>8}")
    print(f"\nwarm / cold, to the first step: {rows[1][1] / rows[0][1]:.2f}x")


if __name__ == "__main__":
    main()
