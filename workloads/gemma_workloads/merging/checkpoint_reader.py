"""Read the LoRA adapter that training checkpointed, without building the model.

Training writes Orbax checkpoints through Tunix's checkpoint manager: one folder per step under
`checkpoint_dir`, holding the items `model_params` (the LoRA parameters only) and
`optimizer_state`, plus `lora.json` (rank, alpha, targets) beside the steps. The merge restores
`model_params` alone, as host numpy arrays: the arrays' saved shardings name TPU devices a CPU
node does not have, and the base model is never needed to give the tree its structure. JAX and
Orbax are imported where arrays are read, so the pre-flight check can use the rest before them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pydantic
from etils import epath

from gemma_workloads.config import CHECKPOINT_FOLDER, LORA_METADATA, LoraConfig, LoraMetadata
from gemma_workloads.input_files import InputError, read_json

if TYPE_CHECKING:
    import orbax.checkpoint as ocp

ITEM = "model_params"
STEP_METADATA = "_CHECKPOINT_METADATA"  # Orbax writes its commit timestamp when the step is final
# Orbax's OCDBT layout of an item (orbax/checkpoint/_src/serialization/ocdbt_utils.py): each
# process writes `ocdbt.process_<i>/` (manifest.ocdbt + d/, the array data); the item's own
# manifest.ocdbt and d/ merge them. `_METADATA` is the tree's structure.
OCDBT_MANIFEST, OCDBT_DATA, OCDBT_PROCESS = "manifest.ocdbt", "d", "ocdbt.process_"
COPY_STEP = "copy the whole step folder again"


class LoraCheckpointError(InputError):
    """No usable LoRA checkpoint; the message says what is missing where."""


@dataclass(frozen=True)
class LoraCheckpoint:
    checkpoint_dir: str
    path: str  # the step folder
    step: int
    lora: LoraConfig
    commit: str  # the step's Orbax metadata: identifies this save of this step


def _manager(checkpoint_dir: str) -> ocp.CheckpointManager:
    import orbax.checkpoint as ocp

    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)  # read-only mode warns about itself; only here, not for the whole process
    try:
        return ocp.CheckpointManager(
            checkpoint_dir,
            item_handlers={ITEM: ocp.PyTreeCheckpointHandler()},
            options=ocp.CheckpointManagerOptions(read_only=True, lightweight_initialize=True),  # steps read on demand
        )
    finally:
        absl.setLevel(level)


def complete_steps(checkpoint_dir: str) -> dict[int, str]:
    """Steps Orbax lists as final (it skips its temporary folders) whose commit is recorded and
    whose `model_params` exist, with that Orbax metadata: a folder copied in part, or from an
    aborted save, is skipped."""
    root = epath.Path(checkpoint_dir)
    steps = {step: committed(root / str(step)) for step in _manager(checkpoint_dir).all_steps()}
    return {step: metadata for step, metadata in sorted(steps.items()) if metadata}


def committed(folder: epath.Path) -> str | None:
    """The Orbax metadata of a step folder whose save was committed and holds `model_params`."""
    metadata, lacks = _inspect(folder)
    return None if lacks else metadata


def _inspect(folder: epath.Path) -> tuple[str, str]:
    """(the step's Orbax metadata, what the step lacks to be merged, naming the path expected): the
    second is empty when the step is complete."""
    record = folder / STEP_METADATA
    try:
        metadata = record.read_text()
        done = "commit_timestamp_nsecs" in json.loads(metadata)
    except (OSError, ValueError):
        return "", f"the record of a committed save, {record} (an aborted save, or a copy in part)"
    if not done:
        return "", f"a committed save: {record} records no commit_timestamp_nsecs"
    if not (folder / ITEM).exists():
        return "", f"its LoRA parameters, the folder {folder / ITEM}"
    return metadata, ""


def step_folders(checkpoint_dir: str) -> dict[int, epath.Path]:
    """The folders named by a step number, by step (Orbax's temporary folders have a suffix)."""
    found = {int(p.name): p for p in epath.Path(checkpoint_dir).iterdir() if p.name.isdigit()}
    return dict(sorted(found.items()))


def no_step(checkpoint_dir: str, step: int | None, complete: list[int]) -> LoraCheckpointError:
    """Why the step asked for (None: any step) cannot be merged: the step and what it lacks, with
    the path expected; or, where there is no step folder at all, the folder expected."""
    folders = step_folders(checkpoint_dir)
    if step is not None:
        folder = epath.Path(checkpoint_dir) / str(step)
        lacks = _lacks(folder) if step in folders else f"its folder, {folder}"
        return LoraCheckpointError(
            f"{checkpoint_dir}: step {step} is not a complete checkpoint: it lacks {lacks}; {COPY_STEP}, "
            f"or merge a complete step (complete: {complete})"
        )
    if not folders:
        return LoraCheckpointError(
            f"{checkpoint_dir}: no checkpoint step: training saves each step in a folder named by its number, "
            f"such as {epath.Path(checkpoint_dir) / '100'}, beside {LORA_METADATA}"
        )
    each = "; ".join(f"step {n} lacks {_lacks(folder)}" for n, folder in folders.items())
    return LoraCheckpointError(f"{checkpoint_dir}: no complete checkpoint step: {each}: {COPY_STEP}")


def _lacks(folder: epath.Path) -> str:
    """What a step lacks; a step complete by its own files that Orbax does not list has not been
    marked finished (config.LoraMetadata says how Orbax marks it)."""
    return _inspect(folder)[1] or f"Orbax's mark of a finished save (on gs://, {folder / 'commit_success.txt'})"


def refuse_run_folder(checkpoint_dir: str) -> None:
    """A run's folder given for its checkpoint folder is named as such, with the folder to give,
    rather than reported as a missing lora.json or step."""
    root = epath.Path(checkpoint_dir)
    inner = root / CHECKPOINT_FOLDER
    if inner.is_dir() and not (root / LORA_METADATA).exists() and not step_folders(checkpoint_dir):
        raise LoraCheckpointError(
            f"checkpoint_dir {checkpoint_dir} looks like a run folder: it holds {CHECKPOINT_FOLDER}/ and neither "
            f"{LORA_METADATA} nor a step folder; set checkpoint_dir to its {CHECKPOINT_FOLDER}/ folder, {inner}"
        )


def check_array_data(folder: epath.Path) -> None:
    """The step's `model_params` has its tree structure and every OCDBT data folder, non-empty:
    a step copied without its arrays is named here rather than failing mid-restore."""
    item = folder / ITEM
    read_json(item / "_METADATA", fix=COPY_STEP, error=LoraCheckpointError)
    if not (item / OCDBT_MANIFEST).exists():
        return  # not the OCDBT layout: Orbax reads each array's own folder
    processes = list(item.glob(f"{OCDBT_PROCESS}*"))
    if not processes:
        raise LoraCheckpointError(f"{item}: no array data (no {OCDBT_PROCESS}*/ folder): {COPY_STEP}")
    for part in processes:
        if not (part / OCDBT_MANIFEST).exists():
            raise LoraCheckpointError(f"{part / OCDBT_MANIFEST} is missing: {COPY_STEP}")
    data_folders = [p / OCDBT_DATA for p in processes]
    if (item / OCDBT_DATA).exists():
        data_folders.append(item / OCDBT_DATA)
    for data in data_folders:
        files = list(data.iterdir()) if data.exists() else []
        if not files or any(f.stat().length == 0 for f in files):
            raise LoraCheckpointError(f"{data}: array data missing or empty: {COPY_STEP}")


def resolve_lora(checkpoint_dir: str, override: LoraConfig | None) -> LoraConfig:
    """The config's LoRA settings, else the checkpoint's `lora.json`."""
    if override is not None:
        return override
    path = epath.Path(checkpoint_dir) / LORA_METADATA
    if not path.exists():
        raise LoraCheckpointError(f"{path} not found: set lora (rank, alpha, target_modules) in the merge config")
    meta = read_lora_metadata(path, "set lora (rank, alpha, target_modules) in the merge config instead")
    return LoraConfig(rank=meta.rank, alpha=meta.alpha, target_modules=meta.target_modules)  # type: ignore[call-arg]  # dropout's defaults are in its Annotated Field, which the checker does not read


def read_lora_metadata(path: epath.Path, fix: str) -> LoraMetadata:
    """`lora.json`, or an error naming it and its broken field."""
    try:
        return LoraMetadata.model_validate(read_json(path, fix=fix, error=LoraCheckpointError))
    except pydantic.ValidationError as e:
        fields = "; ".join(f"field {'.'.join(map(str, x['loc'])) or '(top level)'}: {x['msg']}" for x in e.errors())
        raise LoraCheckpointError(f"{path}: {fields}; {fix}") from None


def locate(checkpoint_dir: str, step: int | None, override: LoraConfig | None) -> LoraCheckpoint:
    """The step to merge (None: the latest complete one) and its LoRA settings; reads no arrays."""
    if not epath.Path(checkpoint_dir).exists():
        raise LoraCheckpointError(f"checkpoint directory {checkpoint_dir} does not exist")
    refuse_run_folder(checkpoint_dir)
    steps = complete_steps(checkpoint_dir)
    chosen = max(steps, default=None) if step is None else step
    if chosen is None or chosen not in steps:
        raise no_step(checkpoint_dir, step, list(steps))
    folder = epath.Path(checkpoint_dir) / str(chosen)
    return LoraCheckpoint(checkpoint_dir, str(folder), chosen, resolve_lora(checkpoint_dir, override), steps[chosen])


def restore_params(ckpt: LoraCheckpoint) -> dict[str, Any]:
    """`model_params` of the step as a nested dict of numpy arrays, as saved."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    manager = _manager(ckpt.checkpoint_dir)
    metadata = manager.item_metadata(ckpt.step)[ITEM]
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata.tree)
    restored = manager.restore(
        ckpt.step, args=ocp.args.Composite(**{ITEM: ocp.args.PyTreeRestore(restore_args=as_numpy)})
    )
    return restored[ITEM]


def require_finite(params: dict[str, Any], ckpt: LoraCheckpoint) -> None:
    """Refuse an adapter holding NaN or inf: merged, it would make every output of the model NaN."""
    import jax
    import numpy as np

    for path, value in jax.tree_util.tree_leaves_with_path(params):
        bad = int(np.size(value) - np.count_nonzero(np.isfinite(value)))
        if bad:
            name = "/".join(str(getattr(k, "key", k)) for k in path)
            raise LoraCheckpointError(
                f"{ckpt.path}: LoRA tensor {name} holds {bad} non-finite value(s) (NaN or inf) of {np.size(value)}; "
                f"a diverged adapter is never merged: merge an earlier step (complete: {list(complete_steps(ckpt.checkpoint_dir))})"
            )
