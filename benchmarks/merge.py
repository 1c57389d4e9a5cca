"""Merge throughput and memory on a Gemma-4-31B-shaped checkpoint, against two references.

Generates a synthetic bf16 checkpoint with the 31B model's full-width layers (hidden 5376, MLP
21504, 32 heads x 256, 16 KV heads; global layers 4 KV heads x 512 with K=V) but fewer layers,
and a rank-64 LoRA checkpoint for it, at two depths. For each it measures, each in a fresh
process and with the files evicted from the page cache first:
- copy: the base's files copied and synced (what the disk can do),
- merge: what `python -m gemma_workloads merge` runs (streaming), merged model and PEFT adapter,
- merged-only and adapter-only: the same with `output: merged` and `output: adapter`, so that
  what the adapter adds to a merge is measured in the same run, with the adapter's size,
- in-memory: the whole base loaded into RAM, merged and saved, as tunix's generic saver does.
It prints seconds, GB/s, CPU seconds and peak RSS (VmHWM) of each and the ratios to the copy,
then deletes everything it wrote. A shared disk's speed varies from minute to minute: with
`--repeat N` the copy and the merge run N times, alternating, and the medians are compared.

    python benchmarks/merge.py [--layers 2 6] [--vocab 65536] [--workers 2] [--repeat 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from gemma_devcluster import tiny
from gemma_workloads.config import MergeConfig

GEMMA4_31B_WIDTHS = dict(
    hidden_size=5376,
    intermediate_size=21504,
    num_attention_heads=32,
    head_dim=256,
    num_key_value_heads=16,
    global_head_dim=512,
    num_global_key_value_heads=4,
)
RANK, ALPHA = 64, 64.0
SHARD_BYTES = 2 * 10**9


def config_31b(layers: int, vocab: int) -> tiny.TinyConfig:
    """5 sliding : 1 global like the 31B model, the last layer global (transformers forces it)."""
    types = ["full_attention" if i % 6 == 5 or i == layers - 1 else "sliding_attention" for i in range(layers)]
    return tiny.TinyConfig(vocab_size=vocab, layer_types=tuple(types), **GEMMA4_31B_WIDTHS)


def write_base(root: Path, config: tiny.TinyConfig) -> int:
    """HF-layout bf16 shards of about SHARD_BYTES, one shard in memory at a time. Values repeat a
    random pool: generating GBs of fresh random numbers would take longer than the benchmark."""
    import torch
    from safetensors.torch import save_file

    root.mkdir(parents=True)
    pool = torch.from_numpy(
        (0.02 * np.random.default_rng(0).standard_normal(1 << 25)).astype(ml_dtypes.bfloat16).view(np.uint16)
    )
    shapes = config.tensor_shapes(prefix="model.language_model.")
    groups, size = [[]], 0
    for name, shape in shapes.items():
        nbytes = 2 * int(np.prod(shape))
        if groups[-1] and size + nbytes > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    weight_map, total = {}, 0
    for i, names in enumerate(groups, start=1):
        fname = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        part = {}
        for n in names:
            count = int(np.prod(shapes[n]))
            part[n] = (
                pool.repeat((count + pool.numel() - 1) // pool.numel())[:count].view(torch.bfloat16).reshape(shapes[n])
            )
        save_file(part, root / fname, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, fname))
        total += sum(2 * t.numel() for t in part.values())
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    (root / "config.json").write_text(json.dumps(config.hf_config("bfloat16")))
    return sum(p.stat().st_size for p in root.glob("*.safetensors"))


def evict(*dirs: Path) -> None:
    """Drop these files from the page cache, so every run reads from the disk."""
    for d in dirs:
        for p in d.rglob("*"):
            if p.is_file():
                fd = os.open(p, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)


# ---------------------------------------------------------------------------- measured runs


def run_copy(base: Path, out: Path) -> None:
    out.mkdir()
    for src in sorted(base.iterdir()):
        shutil.copyfile(src, out / src.name)
        fd = os.open(out / src.name, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def run_merge(base: Path, ckpt: Path, out: Path, output: str = "both") -> None:
    from gemma_workloads.merging import merger as merge

    config = MergeConfig(
        base_model_path=str(base),
        checkpoint_dir=str(ckpt),
        output_dir=str(out),
        adapter_dir=str(adapter_dir(out)),
        output=output,
        dtype="bfloat16",
        workers=int(os.environ.get("MERGE_WORKERS", "2")),
        termination_log=os.devnull,
    )
    merge.merge(config)


def adapter_dir(out: Path) -> Path:
    return out.with_name(out.name + "-adapter")


def run_in_memory(base: Path, ckpt: Path, out: Path) -> None:
    """Load every tensor, add the deltas to whole tensors, save: memory holds the whole model."""
    import torch
    from safetensors.torch import load_file, save_file

    from gemma_workloads.merging import checkpoint_reader as lora_checkpoint
    from gemma_workloads.merging import lora_mapping

    index = json.loads((base / "model.safetensors.index.json").read_text())
    state = {}
    for name in sorted(set(index["weight_map"].values())):
        state.update(load_file(base / name))
    lora = lora_checkpoint.locate(str(ckpt), None, None)
    deltas = lora_mapping.deltas(lora_checkpoint.restore_params(lora), lora.lora)
    keys = lora_mapping.decoder_names(list(state))
    for rel, delta in deltas.items():
        full = np.empty(delta.shape, np.float32)
        delta.factors().rows(0, delta.shape[0], full)
        state[keys[rel]] = (state[keys[rel]].float() + torch.from_numpy(full)).to(torch.bfloat16)
    out.mkdir()
    for fname in sorted(set(index["weight_map"].values())):
        save_file(
            {k: state[k] for k, f in index["weight_map"].items() if f == fname}, out / fname, metadata={"format": "pt"}
        )
        fd = os.open(out / fname, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


RUNS = {
    "copy": run_copy,
    "merged-only": lambda base, ckpt, out: run_merge(base, ckpt, out, "merged"),
    "merge": run_merge,
    "adapter-only": lambda base, ckpt, out: run_merge(base, ckpt, out, "adapter"),
    "in-memory": run_in_memory,
}


def measure(kind: str, *paths: Path) -> dict:
    """One run in a fresh process: seconds and CPU seconds (imports included), and peak RSS."""
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    proc = subprocess.run([sys.executable, __file__, "--run", kind, *map(str, paths)], capture_output=True, text=True)
    seconds, after = time.monotonic() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise RuntimeError(f"{kind} failed:\n{proc.stderr[-3000:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_rss": int(proc.stdout.split("VmHWM")[-1].split()[0]) * 1024}


def child(kind: str, paths: list[str]) -> None:
    RUNS[kind](*map(Path, paths))
    hwm = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)
    print("VmHWM", hwm)


# ---------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 6])
    parser.add_argument("--vocab", type=int, default=65536, help="262144 in the real model; reduced to save disk")
    parser.add_argument("--dir", default=None, help="scratch folder (default: a new temporary folder)")
    parser.add_argument("--workers", type=int, default=2, help="the merge's worker threads")
    parser.add_argument("--repeat", type=int, default=3, help="runs of the copy and the merge (medians compared)")
    parser.add_argument("--run", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        return child(args.run[0], args.run[1:])

    os.environ["MERGE_WORKERS"] = str(args.workers)
    scratch = Path(tempfile.mkdtemp(prefix="merge-bench-", dir=args.dir))
    try:
        largest = sum(int(np.prod(s)) * 2 for s in config_31b(max(args.layers), args.vocab).tensor_shapes().values())
        free = shutil.disk_usage(scratch).free
        print(
            f"scratch {scratch}: {free / 1e9:.1f} GB free; the largest model is {largest / 1e9:.1f} GB, peak use about 2x that"
        )
        if free < 2.2 * largest:
            sys.exit("not enough free disk")
        rows = []
        for layers in args.layers:
            config = config_31b(layers, args.vocab)
            base, ckpt = scratch / f"base-{layers}", scratch / f"ckpt-{layers}"
            size = write_base(base, config)
            tiny.write_lora_checkpoint(ckpt, config, rank=RANK, alpha=ALPHA)
            lora_bytes = 4 * sum(math.prod(s) for m in tiny.lora_shapes(config, RANK).values() for s in m.values())
            print(f"{layers} layers: LoRA state {lora_bytes / 2**30:.2f} GiB (float32)", flush=True)
            runs: dict[str, list[dict]] = {kind: [] for kind in RUNS}
            for kind in ["copy", "merged-only", "merge"] * args.repeat + ["adapter-only", "in-memory"]:
                out = scratch / f"out-{layers}-{kind}"
                evict(base, ckpt)
                result = measure(kind, base, out) if kind == "copy" else measure(kind, base, ckpt, out)
                result["adapter_bytes"] = _folder_bytes(adapter_dir(out))
                runs[kind].append(result)
                for folder in (out, adapter_dir(out)):
                    shutil.rmtree(folder, ignore_errors=True)
                if args.repeat > 1 and kind in ("copy", "merged-only", "merge"):
                    print(f"  {kind:12s} run {len(runs[kind])}: {result['seconds']:6.1f} s", flush=True)
            for kind, results in runs.items():
                rows.append({"layers": layers, "bytes": size, "kind": kind, **_median(results)})
                print(_row(rows[-1], rows), flush=True)
            print(_adapter_row([r for r in rows if r["layers"] == layers]), flush=True)
            shutil.rmtree(base)
            shutil.rmtree(ckpt)
        print(json.dumps(rows))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir()) if folder.exists() else 0


def _adapter_row(rows: list[dict]) -> str:
    """What the PEFT adapter costs next to the merge itself, measured in the same run."""
    by = {r["kind"]: r for r in rows}
    merged, both, alone = by["merged-only"], by["merge"], by["adapter-only"]
    added = both["seconds"] - merged["seconds"]
    return (
        f"{rows[0]['layers']} layers: adapter {both['adapter_bytes'] / 1e6:.1f} MB "
        f"({both['adapter_bytes'] / rows[0]['bytes']:.2%} of the merged model); it adds {added:+.1f} s "
        f"({added / merged['seconds']:+.1%}) to the merge (CPU {both['cpu_seconds'] - merged['cpu_seconds']:+.1f} s); "
        f"adapter-only {alone['seconds']:.1f} s ({alone['seconds'] / merged['seconds']:.2f}x the merged-only), "
        "a bound on what it adds: that includes the start, imports and checkpoint restore a merge has anyway"
    )


def _median(results: list[dict]) -> dict:
    """The run with the median wall time (all of its figures), so that they belong together."""
    return sorted(results, key=lambda r: r["seconds"])[len(results) // 2]


def _row(row: dict, rows: list[dict]) -> str:
    copy = next(r for r in rows if r["layers"] == row["layers"] and r["kind"] == "copy")
    rate = row["bytes"] / row["seconds"] / 1e9
    return (
        f"{row['layers']} layers {row['bytes'] / 1e9:5.2f} GB  {row['kind']:12s} {row['seconds']:6.1f} s "
        f"{rate:5.2f} GB/s ({copy['seconds'] / row['seconds']:.2f}x copy)  CPU {row['cpu_seconds']:5.1f} s  "
        f"peak RSS {row['peak_rss'] / 2**30:5.2f} GiB"
    )


if __name__ == "__main__":
    main()
