"""`python -m gemma_workloads.merge --config FILE`: the LoRA adapter merged into HF safetensors.

Runs on a CPU node after training. It streams: output shards are written in parallel, each a
tensor and a block of rows at a time, so memory holds the LoRA state and a few blocks whatever
the model's size, and tensors without LoRA are copied as raw bytes. Work happens in
`<output>.partial/`; each finished shard is recorded there, so a re-run after a crash redoes only
unfinished shards; the index and the manifest are written last and the folder is renamed into
place, so a reader never sees a half-merged model. An output already holding a merge of the same
inputs is left as it is. Nothing is ever written to the base model or the checkpoints.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import time
import traceback
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from queue import Empty, Full, Queue

from etils import epath
from pydantic import ValidationError
from threadpoolctl import threadpool_limits

from gemma_workloads import lora_checkpoint, lora_mapping
from gemma_workloads.config import (
    EXIT_FAILED,
    EXIT_INVALID_INPUT,
    EXIT_OK,
    LORA_MODULES,
    TERMINATION_LOG,
    MergeConfig,
    MergeResult,
    write_termination_message,
)
from gemma_workloads.safetensors_stream import (
    DTYPE_NAMES,
    FLOAT_DTYPES,
    INDEX,
    ITEMSIZE,
    BaseCheckpoint,
    CheckpointError,
    Block,
    Buffers,
    Chunk,
    Reader,
    ShardWriter,
    TensorInfo,
    copy_blocks,
    header_bytes,
    merge_blocks,
    open_checkpoint,
)

MANIFEST = "merge-manifest.json"
_INPUTS = ".merge-inputs"  # in the staging folder: what its finished shards were made from
_DONE = ".done"  # in the staging folder: one record per finished shard
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".gguf", ".ckpt", ".index.json")
_HEADER_METADATA = {"format": "pt"}  # transformers refuses safetensors without it

log = logging.getLogger("gemma_workloads.merge")


class MergeError(ValueError):
    """Inputs that cannot be merged as asked; the message names the tensor, file or setting."""


INPUT_ERRORS = (MergeError, CheckpointError, lora_mapping.LoraMappingError, lora_checkpoint.LoraCheckpointError)


@dataclass(frozen=True)
class Item:
    """One output tensor: a base tensor, copied or with a delta added and cast to `dtype`."""

    info: TensorInfo
    dtype: str
    delta: lora_mapping.Delta | None

    @property
    def nbytes(self) -> int:
        return math.prod(self.info.shape) * ITEMSIZE[self.dtype]


@dataclass(frozen=True)
class OutShard:
    name: str
    items: list[Item]

    def header(self) -> bytes:
        return header_bytes([(i.info.name, i.dtype, i.info.shape) for i in self.items], _HEADER_METADATA)

    @property
    def file_bytes(self) -> int:
        return len(self.header()) + sum(i.nbytes for i in self.items)


# ---------------------------------------------------------------------------- plan


def merge_targets(base: BaseCheckpoint, deltas: dict[str, lora_mapping.Delta]) -> dict[str, lora_mapping.Delta]:
    """Base key -> delta, every LoRA target checked against the base's tensors."""
    keys = lora_mapping.decoder_names([t.name for t in base.tensors])
    infos = {t.name: t for t in base.tensors}
    out = {}
    for rel, delta in deltas.items():
        key = keys.get(rel)
        if key is None:
            raise MergeError(f"LoRA {delta.source} adapts {rel}, which the base checkpoint {base.path} does not have")
        info = infos[key]
        if info.shape != delta.shape:
            raise MergeError(f"{key}: base shape {list(info.shape)} but LoRA {delta.source} gives {list(delta.shape)}")
        if info.dtype not in FLOAT_DTYPES:
            raise MergeError(f"{key}: dtype {info.dtype} cannot take a LoRA delta (supported: {sorted(FLOAT_DTYPES)})")
        out[key] = delta
    return out


def check_targets(deltas: dict[str, lora_mapping.Delta], targets: list[str]) -> None:
    """The adapter holds the modules its settings name, no more and no fewer."""
    expected = {m for t in targets for m in LORA_MODULES[t]}
    found = {d.source.split("/")[-1] for d in deltas.values()}
    if extra := sorted(found - expected):
        raise MergeError(f"the LoRA checkpoint adapts {extra}, outside target_modules {targets}")
    # k_proj names both kv_einsum and k_einsum: a model needs only one of them.
    missing = [t for t in targets if not found & set(LORA_MODULES[t])]
    if missing:
        raise MergeError(f"target_modules {missing} have no LoRA parameters in the checkpoint")


def plan(base: BaseCheckpoint, targets: dict[str, lora_mapping.Delta], dtype: str, shard_size: int) -> list[OutShard]:
    """Output shards in base storage order, split the HF way: a shard closes before it would pass
    `shard_size` bytes, and a tensor larger than that gets a shard of its own."""
    out_dtype = DTYPE_NAMES[dtype]
    groups: list[list[Item]] = []
    size = 0
    for info in base.tensors:
        delta = targets.get(info.name)
        item = Item(info, out_dtype if delta else info.dtype, delta)
        if groups and size + item.nbytes <= shard_size:
            groups[-1].append(item)
            size += item.nbytes
        else:
            groups.append([item])
            size = item.nbytes
    n = len(groups)
    return [OutShard(f"model-{i:05d}-of-{n:05d}.safetensors", g) for i, g in enumerate(groups, start=1)]


def fingerprint(config: MergeConfig, base: BaseCheckpoint, ckpt: lora_checkpoint.LoraCheckpoint) -> str:
    """What the output depends on: the base's tensor table, the checkpoint step's commit record and
    the settings. Cheap (no weights are hashed) yet changes when either input is replaced."""
    table = [(t.name, t.dtype, t.shape, Path(t.file).name, t.offset, t.nbytes) for t in base.tensors]
    inputs = {
        "base": [config.base_model_path, table],
        "lora": [ckpt.path, ckpt.commit, ckpt.lora.model_dump(exclude={"dropout"})],
        "output": [config.dtype, config.shard_size_bytes],
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------------------- write


def shard_blocks(reader: Reader, shard: OutShard, buffers: Buffers) -> Iterator[Block]:
    for item in shard.items:
        if item.delta is None:
            yield from copy_blocks(reader, item.info)
        else:
            yield from merge_blocks(reader, item.info, item.delta.factors(), item.dtype, buffers)


@dataclass(frozen=True)
class Stages:
    """What the shards being written share: the open base files, output buffers, the maths threads."""

    reader: Reader
    buffers: Buffers
    pool: ThreadPoolExecutor
    ahead: int  # blocks queued per shard between reading and writing
    stop: threading.Event  # set when a shard fails, so the others stop too


def write_shard(staging: Path, shard: OutShard, stages: Stages) -> dict:
    """Write one shard as `<name>.tmp`, then rename it and record it as finished. Three stages
    overlap: this thread reads blocks in order, the pool does their maths, and a writer thread
    hashes and writes them in order."""
    tmp = staging / f"{shard.name}.tmp"
    writer = ShardWriter(tmp, shard.header(), sum(i.nbytes for i in shard.items))
    queue: Queue[Future | None] = Queue(maxsize=stages.ahead)

    def drain() -> None:
        while (future := queue.get()) is not None:
            data, buf = future.result()
            writer.write(data)
            if buf is not None:
                stages.buffers.give(buf)

    with ThreadPoolExecutor(1) as io:
        drained = io.submit(drain)
        try:
            for block in shard_blocks(stages.reader, shard, stages.buffers):
                _put(queue, stages.pool.submit(block) if callable(block) else _done(block), drained, stages.stop)
            _put(queue, None, drained, stages.stop)
            drained.result()
            sha256 = writer.close()
        except BaseException:
            stages.stop.set()
            while not drained.done():  # unblock the writer thread, then let it end
                with contextlib.suppress(Empty):
                    queue.get_nowait()
                queue.put(None)
            writer.abort()
            raise
    os.replace(tmp, staging / shard.name)
    record = {"bytes": writer.written, "sha256": sha256}
    _write_json(staging / _DONE / f"{shard.name}.json", record)
    return record


def _put(queue: Queue, item: Future | None, drained: Future, stop: threading.Event) -> None:
    """Queue an item, waking up to notice a failed writer or another shard's failure."""
    while True:
        if drained.done():
            drained.result()  # raises the writer's error
            raise RuntimeError("the writer stopped early")
        if stop.is_set():
            raise InterruptedError("stopped: another shard failed")
        with contextlib.suppress(Full):
            return queue.put(item, timeout=0.1)


def _done(value: Chunk) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


def finished(staging: Path, shard: OutShard) -> dict | None:
    """The record of a shard a previous run finished, if its file is whole."""
    path = staging / _DONE / f"{shard.name}.json"
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    done = staging / shard.name
    if record["bytes"] != shard.file_bytes or not done.exists() or done.stat().st_size != record["bytes"]:
        return None
    return record


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def prepare_staging(staging: Path, inputs: str) -> None:
    """Ready `<output>.partial` for these inputs, emptied first if it holds work from other inputs
    (only ever files a merge made: anything else there is refused)."""
    marker = staging / _INPUTS
    if staging.exists() and not marker.exists() and read_manifest(staging) is None and any(staging.iterdir()):
        raise MergeError(f"{staging} exists and was not made by a merge: move it away")
    if staging.exists() and (not marker.exists() or marker.read_text() != inputs):
        log.info("merge: %s holds a merge of other inputs: starting over", staging)
        shutil.rmtree(staging)
    (staging / _DONE).mkdir(parents=True, exist_ok=True)
    marker.write_text(inputs)


def copy_model_files(base_path: str, staging: Path) -> list[str]:
    """Everything in the base directory but its weights: config, tokenizer, chat template,
    processor config, licence."""
    root, names = epath.Path(base_path), []
    if not (root / "config.json").exists():
        raise MergeError(f"{base_path}: config.json is missing")
    for p in root.iterdir():
        if p.is_file() and not p.name.startswith(".") and not p.name.endswith(_WEIGHT_SUFFIXES):
            p.copy(epath.Path(staging / p.name), overwrite=True)
            names.append(p.name)
    return sorted(names)


def publish(staging: Path, output: Path, shards: list[OutShard], records: dict[str, dict], manifest: dict) -> None:
    """Index, then manifest, then one rename: the output appears whole or not at all."""
    index = {
        "metadata": {"total_size": sum(i.nbytes for s in shards for i in s.items)},
        "weight_map": {i.info.name: s.name for s in shards for i in s.items},
    }
    _write_json(staging / INDEX, index)
    _write_json(staging / MANIFEST, {**manifest, "files": records})
    finish(staging, output)


def finish(staging: Path, output: Path) -> None:
    """Drop the bookkeeping and rename; safe to repeat after a crash at any point in it."""
    shutil.rmtree(staging / _DONE, ignore_errors=True)
    (staging / _INPUTS).unlink(missing_ok=True)
    if output.exists():
        output.rmdir()  # only an empty folder (a mount point, a pre-made directory) is replaced
    os.rename(staging, output)


def read_manifest(folder: Path) -> dict | None:
    path = folder / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


def complete_merge(output: Path, inputs: str) -> dict | None:
    """The manifest of a finished merge of these inputs at `output`, or None if there is none.
    Anything else there is refused rather than overwritten."""
    if not output.exists() or not any(output.iterdir()):
        return None
    manifest = read_manifest(output)
    if manifest is None or manifest.get("inputs") != inputs:
        raise MergeError(f"{output} already holds something other than a merge of these inputs: refusing to overwrite it")
    for name, record in manifest["files"].items():
        if not (output / name).exists() or (output / name).stat().st_size != record["bytes"]:
            raise MergeError(f"{output}: {name} is missing or has the wrong size; delete the output to merge again")
    return manifest


# ---------------------------------------------------------------------------- run


def merge(config: MergeConfig) -> MergeResult:
    """Merge as configured; the result is what the termination message carries."""
    started = time.monotonic()
    output = Path(config.output_dir).absolute()
    staging = output.with_name(output.name + ".partial")
    _check_paths(config, output)
    base = open_checkpoint(config.base_model_path)
    ckpt = lora_checkpoint.locate(config.checkpoint_dir, config.step, config.lora)
    inputs = fingerprint(config, base, ckpt)
    if done := complete_merge(output, inputs):
        log.info("merge: %s already holds this merge (step %d): nothing to do", output, done["step"])
        return _result(output, done, 0, started)
    if (staged := read_manifest(staging)) and staged["inputs"] == inputs:
        finish(staging, output)  # a previous run stopped between its manifest and its rename
        return _result(output, staged, 0, started)

    deltas = lora_mapping.deltas(lora_checkpoint.restore_params(ckpt), ckpt.lora.rank, ckpt.lora.alpha)
    check_targets(deltas, ckpt.lora.target_modules)
    shards = plan(base, merge_targets(base, deltas), config.dtype, config.shard_size_bytes)
    prepare_staging(staging, inputs)
    records = {s.name: r for s in shards if (r := finished(staging, s))}
    todo = [s for s in shards if s.name not in records]
    log.info("merge: step %d of %s into %s: %d shards, %d to write", ckpt.step, ckpt.checkpoint_dir, output, len(shards), len(todo))
    # Blocks' maths on `workers` threads; two shards are written at a time, so one shard's final
    # sync overlaps the next one's work. One BLAS thread each: OpenBLAS's own would spin against ours.
    with threadpool_limits(1, "blas"), ThreadPoolExecutor(config.workers) as pool, ThreadPoolExecutor(2) as writers:
        stop = threading.Event()
        stages = Stages(Reader(), Buffers(4 * config.workers + 2, stop), pool, 2 * config.workers, stop)
        futures = {writers.submit(write_shard, staging, s, stages): s for s in todo}
        try:
            for future in as_completed(futures):
                records[futures[future].name] = future.result()
                log.info("merge: %s done (%d/%d shards)", futures[future].name, len(records), len(shards))
        except BaseException:
            stages.stop.set()
            writers.shutdown(cancel_futures=True)
            raise
        finally:
            stages.reader.close()
    manifest = {
        "inputs": inputs,
        "base_model_path": config.base_model_path,
        "checkpoint_dir": ckpt.checkpoint_dir,
        "step": ckpt.step,
        "lora": ckpt.lora.model_dump(),
        "dtype": config.dtype,
        "merged": sorted(i.info.name for s in shards for i in s.items if i.delta),
        "copied_files": copy_model_files(config.base_model_path, staging),
    }
    publish(staging, output, shards, {n: records[n] for n in sorted(records)}, manifest)
    return _result(output, manifest, sum(records[s.name]["bytes"] for s in todo), started)


def _result(output: Path, manifest: dict, written: int, started: float) -> MergeResult:
    return MergeResult(status="succeeded", output=str(output), tensors_merged=len(manifest["merged"]),
                       bytes_written=written, seconds=round(time.monotonic() - started, 3))  # fmt: skip


def _check_paths(config: MergeConfig, output: Path) -> None:
    if "://" in config.output_dir:
        raise MergeError(f"output_dir {config.output_dir}: must be a local path (mount a bucket with Cloud Storage FUSE)")
    for name in ("base_model_path", "checkpoint_dir"):
        source = getattr(config, name)
        if "://" not in source:
            src = Path(source).absolute()
            if output == src or src in output.parents or output in src.parents:
                raise MergeError(f"output_dir {output} overlaps {name} {src}: the merge never writes into its inputs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Merge a LoRA checkpoint into Hugging Face safetensors.")
    parser.add_argument("--config", required=True, help="MergeConfig file (JSON or YAML)")
    args = parser.parse_args(argv)
    if not log.handlers:  # absl owns the root logger once orbax is imported
        log.addHandler(logging.StreamHandler(sys.stdout))
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        config = MergeConfig.load(args.config)
    except (OSError, ValidationError, ValueError) as e:
        return _fail(f"config {args.config}: {e}", EXIT_INVALID_INPUT, TERMINATION_LOG)
    try:
        result = merge(config)
    except INPUT_ERRORS as e:
        return _fail(str(e), EXIT_INVALID_INPUT, config.termination_log)
    except Exception as e:  # noqa: BLE001 (reported in the termination message)
        traceback.print_exc()
        return _fail(f"{type(e).__name__}: {e}", EXIT_FAILED, config.termination_log)
    write_termination_message(result, config.termination_log)
    print(result.model_dump_json(exclude_none=True), flush=True)
    return EXIT_OK


def _fail(error: str, code: int, termination_log: str) -> int:
    result = MergeResult(status="failed", error=error)
    write_termination_message(result, termination_log)
    print(result.model_dump_json(exclude_none=True), file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
