"""The LoRA adapter merged into HF safetensors (`python -m gemma_workloads merge --config FILE`).

Runs on a CPU node after training. It plans the output shards from the base's headers, then
streams them (`shard_pipeline`): a block of rows at a time, so memory holds the LoRA state and
a fixed number of blocks whatever the model's size, and tensors without LoRA go through as raw
bytes. The output folder is built aside and published whole (`merge_output`): a killed merge
resumes with the shards it had not finished, and an output already holding a merge of the same
inputs is left as it is. Beside it goes the same adapter as a Hugging Face PEFT folder
(`peft_export`), or only that (`output: adapter`). Nothing is ever written to the base model or
the checkpoints. Every input is checked first (preflight.py; as a program, before JAX is imported).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from threadpoolctl import threadpool_limits

from gemma_workloads import compilation_cache, preflight
from gemma_workloads.config import LORA_MODULES, MERGE_SHARD_WRITERS, MergeConfig, MergeResult
from gemma_workloads.input_files import InputError
from gemma_workloads.merging import checkpoint_reader as lora_checkpoint
from gemma_workloads.merging import lora_mapping, merge_output, peft_export
from gemma_workloads.merging.shard_pipeline import (
    Block,
    Pipeline,
    copy_blocks,
    merge_blocks,
    write_shard_file,
)
from gemma_workloads.model_folder import check_model_folder
from gemma_workloads.safetensors_io import (
    DTYPE_NAMES,
    FLOAT_DTYPES,
    ITEMSIZE,
    BaseCheckpoint,
    TensorInfo,
    header_bytes,
    open_checkpoint,
)
from gemma_workloads.sources import HF_PREFIX, resolve_model

_HEADER_METADATA = {"format": "pt"}  # transformers refuses safetensors without it

log = logging.getLogger("gemma_workloads.merge")


class MergeError(ValueError):
    """Inputs that cannot be merged as asked; the message names the tensor, file or setting."""


INPUT_ERRORS = (
    MergeError,
    InputError,
    merge_output.OutputError,
    lora_mapping.LoraMappingError,
    peft_export.PeftExportError,
)


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

    @functools.cached_property
    def header(self) -> bytes:
        return header_bytes([(i.info.name, i.dtype, i.info.shape) for i in self.items], _HEADER_METADATA)

    @property
    def data_bytes(self) -> int:
        return sum(i.nbytes for i in self.items)

    @property
    def file_bytes(self) -> int:
        return len(self.header) + self.data_bytes


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


def plan(
    base: BaseCheckpoint, targets: dict[str, lora_mapping.Delta], dtype: str | None, shard_size: int
) -> list[OutShard]:
    """Output shards in base storage order, split the HF way: a shard closes before it would pass
    `shard_size` bytes, and a tensor larger than that gets a shard of its own. A merged tensor
    keeps its base dtype unless `dtype` is given; the others always keep theirs."""
    groups: list[list[Item]] = []
    size = 0
    for info in base.tensors:
        delta = targets.get(info.name)
        item = Item(info, DTYPE_NAMES[dtype] if delta and dtype else info.dtype, delta)
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


def write_shard(staging: Path, shard: OutShard, pipeline: Pipeline) -> dict:
    """Write one shard in the staging folder and record it as finished."""

    def blocks() -> Iterator[Block]:
        for item in shard.items:
            if item.delta is None:
                yield from copy_blocks(pipeline.reader, item.info)
            else:
                yield from merge_blocks(pipeline.reader, item.info, item.delta.factors(), item.dtype, pipeline.buffers)

    sha256 = write_shard_file(
        merge_output.shard_tmp(staging, shard.name), shard.header, blocks(), shard.data_bytes, pipeline
    )
    return merge_output.record_shard(staging, shard.name, shard.file_bytes, sha256)


# ---------------------------------------------------------------------------- run


def merge(config: MergeConfig) -> MergeResult:
    """Merge as configured; the result is what the termination message carries. The PEFT adapter is
    written first (it is small): one it cannot express is reported and the merged model still written,
    unless the adapter is all that was asked for."""
    with compilation_cache.persistent(config.compilation_cache_dir):
        return _merge(config)


def _merge(config: MergeConfig) -> MergeResult:
    started = time.monotonic()
    preflight.check_merge_output(config)
    source = config.base_model_path
    config = config.model_copy(update={"base_model_path": resolve_model(source)})
    output = Path(config.output_dir).absolute()
    adapter_dir = Path(config.adapter_folder).absolute()
    want_merged, want_adapter = config.output != "adapter", config.output != "merged"
    if config.base_model_path != source:  # downloaded (hf://): checked now that it is here
        check_model_folder(config.base_model_path)
    base = open_checkpoint(config.base_model_path)
    ckpt = lora_checkpoint.locate(config.checkpoint_dir, config.step, config.lora)
    inputs = fingerprint(config, base, ckpt)
    done = published_merge(output, inputs) if want_merged else None
    adapter = _AdapterOutcome(adapter_dir if want_adapter else None)
    if want_adapter:
        adapter.attempt(lambda: 0 if peft_export.complete(adapter_dir, inputs) else None, config.output)
    if (done or not want_merged) and (not want_adapter or adapter.bytes is not None or adapter.error):
        log.info("merge: the outputs of step %d are already there: nothing to do", ckpt.step)
        return _result(output if want_merged else None, done, 0, adapter, started)

    params = lora_checkpoint.restore_params(ckpt)
    lora_checkpoint.require_finite(params, ckpt)
    deltas = lora_mapping.deltas(params, ckpt.lora)
    check_targets(deltas, ckpt.lora.target_modules)
    targets = merge_targets(base, deltas)
    if want_adapter and adapter.bytes is None and not adapter.error:
        dtype = config.dtype or adapter_dtype(base, targets)
        base_model = source.removeprefix(HF_PREFIX)  # a Hub id, as PEFT and vLLM expect, or the path
        adapter.attempt(
            lambda: peft_export.export(adapter_dir, targets, ckpt.lora, base_model, dtype, inputs), config.output
        )
    if not want_merged:
        return _result(None, None, 0, adapter, started)
    if done:
        return _result(output, done, 0, adapter, started)
    manifest, written = write_merged(config, output, inputs, base, ckpt, targets)
    return _result(output, manifest, written, adapter, started)


class _AdapterOutcome:
    """The adapter's folder and bytes written, or why it was not written."""

    def __init__(self, folder: Path | None):
        self.folder = folder
        self.bytes: int | None = None
        self.error: str | None = None

    def attempt(self, step, output: str) -> None:
        """Run an export step; a refusal fails an adapter-only merge and is reported otherwise."""
        try:
            self.bytes = step()
        except peft_export.PeftExportError as e:
            if output == "adapter":
                raise
            log.error("merge: no PEFT adapter: %s", e)
            self.error = str(e)


def adapter_dtype(base: BaseCheckpoint, targets: dict[str, lora_mapping.Delta]) -> str:
    """The adapted tensors' dtype when they share one, float32 otherwise."""
    infos = {t.name: t for t in base.tensors}
    (dtype, *others) = {infos[k].dtype for k in targets}
    return next((name for name, code in DTYPE_NAMES.items() if code == dtype and not others), "float32")


def published_merge(output: Path, inputs: str) -> dict | None:
    """The manifest of this merge if it is already published (or staged whole, then published now)."""
    if done := merge_output.complete_merge(output, inputs):
        return done
    staging = merge_output.staging_dir(output)
    if (staged := merge_output.read_manifest(staging)) and staged["inputs"] == inputs:
        merge_output.finish(staging, output)  # a previous run stopped between its manifest and its rename
        return staged
    return None


def write_merged(
    config: MergeConfig,
    output: Path,
    inputs: str,
    base: BaseCheckpoint,
    ckpt: lora_checkpoint.LoraCheckpoint,
    targets: dict[str, lora_mapping.Delta],
) -> tuple[dict, int]:
    """Stream the merged shards, then publish the folder; returns its manifest and the bytes written."""
    staging = merge_output.staging_dir(output)
    shards = plan(base, targets, config.dtype, config.shard_size_bytes)
    merge_output.prepare_staging(staging, inputs)
    records = {s.name: r for s in shards if (r := merge_output.finished(staging, s.name, s.file_bytes))}
    todo = [s for s in shards if s.name not in records]
    log.info(
        "merge: step %d of %s into %s: %d shards, %d to write",
        ckpt.step,
        ckpt.checkpoint_dir,
        output,
        len(shards),
        len(todo),
    )
    # Two shards at a time, so one's final sync overlaps the next one's work. One BLAS thread per
    # worker: OpenBLAS's own threads would spin against ours.
    with (
        threadpool_limits(1, "blas"),
        ThreadPoolExecutor(config.workers) as pool,
        ThreadPoolExecutor(MERGE_SHARD_WRITERS) as writers,
    ):
        pipeline = Pipeline.create(pool, config.workers)
        futures = {writers.submit(write_shard, staging, s, pipeline): s for s in todo}
        try:
            for future in as_completed(futures):
                records[futures[future].name] = future.result()
                log.info("merge: %s done (%d/%d shards)", futures[future].name, len(records), len(shards))
        except BaseException:
            pipeline.stop.set()
            writers.shutdown(cancel_futures=True)
            raise
        finally:
            pipeline.reader.close()
    manifest = {
        "inputs": inputs,
        "base_model_path": config.base_model_path,
        "checkpoint_dir": ckpt.checkpoint_dir,
        "step": ckpt.step,
        "lora": ckpt.lora.model_dump(),
        "dtype": config.dtype,
        "merged": sorted(i.info.name for s in shards for i in s.items if i.delta),
        "copied_files": merge_output.copy_model_files(config.base_model_path, staging),
    }
    weight_map = {i.info.name: s.name for s in shards for i in s.items}
    total_size = sum(s.data_bytes for s in shards)
    merge_output.publish(staging, output, weight_map, total_size, {n: records[n] for n in sorted(records)}, manifest)
    return manifest, sum(records[s.name]["bytes"] for s in todo)


def _result(
    output: Path | None, manifest: dict | None, written: int, adapter: _AdapterOutcome, started: float
) -> MergeResult:
    return MergeResult(
        status="succeeded",
        output=str(output) if output else None,
        tensors_merged=len(manifest["merged"]) if manifest else None,
        bytes_written=written,
        adapter=str(adapter.folder) if adapter.folder and not adapter.error else None,
        adapter_bytes=adapter.bytes,
        adapter_error=adapter.error,
        seconds=round(time.monotonic() - started, 3),
    )
