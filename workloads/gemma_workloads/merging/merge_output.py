"""The merged model's folder: built in `<output>.partial`, published by one rename.

Each finished shard is renamed from `<name>.tmp` and then recorded (size, sha256) in `.done/`, so
a re-run after a crash keeps what is recorded and redoes the rest; `.merge-inputs` says which
inputs the records belong to, and different inputs start the folder over. The index and then
the manifest are written last and the folder renamed into place: a reader never sees a
half-merged model. Nothing outside the two folders is ever written or deleted.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from etils import epath

from gemma_workloads.safetensors_io import INDEX

MANIFEST = "merge-manifest.json"
_INPUTS = ".merge-inputs"  # what the finished shards were made from
_DONE = ".done"  # one record per finished shard
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".gguf", ".ckpt", ".index.json")

log = logging.getLogger("gemma_workloads.merge")


class OutputError(ValueError):
    """An output folder the merge must not touch, or an incomplete base; the message says which."""


def staging_dir(output: Path) -> Path:
    return output.with_name(output.name + ".partial")


def shard_tmp(staging: Path, name: str) -> Path:
    return staging / f"{name}.tmp"


def record_shard(staging: Path, name: str, nbytes: int, sha256: str) -> dict:
    """A whole shard: renamed into place, then recorded."""
    os.replace(shard_tmp(staging, name), staging / name)
    record = {"bytes": nbytes, "sha256": sha256}
    _write_json(staging / _DONE / f"{name}.json", record)
    return record


def finished(staging: Path, name: str, planned_bytes: int) -> dict | None:
    """The record of a shard a previous run finished, if its file is whole."""
    path = staging / _DONE / f"{name}.json"
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    done = staging / name
    if record["bytes"] != planned_bytes or not done.exists() or done.stat().st_size != record["bytes"]:
        return None
    return record


def _write_json(path: Path, data: dict) -> None:
    """Whole or absent, even after a power cut: written aside, synced, renamed."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.write(json.dumps(data, indent=2))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def prepare_staging(staging: Path, inputs: str) -> None:
    """Ready `<output>.partial` for these inputs, emptied first if it holds work from other inputs
    (only ever files a merge made: anything else there is refused)."""
    marker = staging / _INPUTS
    if staging.exists() and not marker.exists() and read_manifest(staging) is None and any(staging.iterdir()):
        raise OutputError(f"{staging} exists and was not made by a merge: move it away")
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
        raise OutputError(f"{base_path}: config.json is missing")
    for p in root.iterdir():
        if p.is_file() and not p.name.startswith(".") and not p.name.endswith(_WEIGHT_SUFFIXES):
            p.copy(epath.Path(staging / p.name), overwrite=True)
            names.append(p.name)
    return sorted(names)


def publish(
    staging: Path, output: Path, weight_map: dict[str, str], total_size: int, records: dict[str, dict], manifest: dict
) -> None:
    """Index, then manifest, then one rename: the output appears whole or not at all."""
    _write_json(staging / INDEX, {"metadata": {"total_size": total_size}, "weight_map": weight_map})
    _write_json(staging / MANIFEST, {**manifest, "files": records})
    finish(staging, output)


def finish(staging: Path, output: Path) -> None:
    """Drop the bookkeeping and rename; safe to repeat after a crash at any point in it."""
    shutil.rmtree(staging / _DONE, ignore_errors=True)
    (staging / _INPUTS).unlink(missing_ok=True)
    if output.exists():
        output.rmdir()  # only an empty folder (one made in advance) is replaced
    os.rename(staging, output)
    parent = os.open(output.parent, os.O_RDONLY)
    try:
        os.fsync(parent)  # the rename itself survives a power cut
    finally:
        os.close(parent)


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
        raise OutputError(
            f"{output} already holds something other than a merge of these inputs: refusing to overwrite it"
        )
    for name, record in manifest["files"].items():
        if not (output / name).exists() or (output / name).stat().st_size != record["bytes"]:
            raise OutputError(f"{output}: {name} is missing or has the wrong size; delete the output to merge again")
    return manifest
