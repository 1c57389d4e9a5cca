"""Where and when the LoRA adapter is checkpointed (Orbax, through Tunix's checkpoint manager).

Layout under `TrainConfig.checkpoint_dir` (documented for the merge on `config.LoraMetadata`):
`lora.json`, then one folder per optimizer step, `<step>/model_params` (LoRA parameters only),
`<step>/optimizer_state`, and `<step>/_CHECKPOINT_METADATA` whose `custom_metadata` holds the
data position. Orbax writes a step under a temporary name (locally) or without its
`commit_success.txt` (on gs://) until it is complete, so a save cut short is never listed as a
step; `cleanup_tmp_directories` removes such leftovers when the next run starts.
"""

from __future__ import annotations

import time

import orbax.checkpoint as ocp
from etils import epath
from flax import nnx
from tunix.sft import checkpoint_manager

from gemma_workloads.config import LORA_METADATA, LoraMetadata, TrainConfig, join
from gemma_workloads.training import scan

DATA_POSITION = "data_position"  # key of the data position in a step's custom metadata


class CheckpointMismatch(ValueError):
    """The checkpoint directory holds an adapter this config cannot continue."""


class SaveTimes:
    """How long a save takes from the call to its commit. Saves are asynchronous (training goes on
    while Orbax writes), so the step times no longer include them: a preempted run adds this to
    decide whether a final save fits in what is left of its grace period (15 s on a GKE Spot
    reclaim)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._started: float | None = None

    def started(self) -> None:
        self._started = time.monotonic()

    def committed(self) -> None:  # Orbax's post-finalization callback, on its writer thread
        if self._started is not None:
            self.longest = max(self.longest, time.monotonic() - self._started)
            self._started = None


def options(config: TrainConfig, total_steps: int, times: SaveTimes) -> ocp.CheckpointManagerOptions:
    """Every `checkpoint_every` steps and at the last step, keeping the latest `keep_checkpoints`,
    written in the background: a reclaim then loses at most `checkpoint_every` steps without each
    save stalling training (Orbax copies the arrays to host memory before `save` returns, so the
    donated buffers of the next step are free to be reused)."""
    policies = [
        ocp.checkpoint_managers.FixedIntervalPolicy(config.checkpoint_every),
        ocp.checkpoint_managers.SpecificStepsPolicy([total_steps]),
    ]
    return ocp.CheckpointManagerOptions(
        save_decision_policy=ocp.checkpoint_managers.AnySavePolicy(policies),
        max_to_keep=config.keep_checkpoints,
        enable_async_checkpointing=True,
        async_options=ocp.AsyncOptions(post_finalization_callback=times.committed),
        cleanup_tmp_directories=True,
    )


class LayerOrderCheckpoints(checkpoint_manager.CheckpointManager):
    """Tunix's checkpoint manager, which writes and reads a model whose layers are scanned in the
    unrolled layout (`layers/<i>/...`), its LoRA parameters and optimizer state alike (scan.py)."""

    def save(
        self,
        step: int,
        model: nnx.Module,
        optimizer: nnx.Optimizer | None = None,
        save_only_lora_params: bool = False,
        force: bool = False,
        custom_metadata: dict | None = None,
    ) -> bool:
        manager = self._checkpoint_manager
        if manager is None or not (force or manager.should_save(step)):  # Tunix asks after every step
            return False
        model_view, optimizer_view = _unrolled_views(model, optimizer)
        return super().save(step, model_view, optimizer_view, save_only_lora_params, force, custom_metadata)

    def maybe_restore(
        self,
        model: nnx.Module,
        optimizer: nnx.Optimizer | None = None,
        step: int | None = None,
        restore_only_lora_params: bool = False,
    ) -> tuple[int, dict]:
        if step is None and self.latest_step() is None:
            return 0, {}
        model_view, optimizer_view = _unrolled_views(model, optimizer)
        restored, metadata = super().maybe_restore(model_view, optimizer_view, step, restore_only_lora_params)
        scanned = scan.decoder(model)
        if restored and scanned is not None:
            nnx.update(model, scan.restacked(nnx.state(model, nnx.LoRAParam), model_view, scanned))
            if optimizer is not None:
                state = nnx.state(optimizer, nnx.optimizer.OptState)
                nnx.update(optimizer, scan.restacked(state, optimizer_view, scanned))
        return restored, metadata


def _unrolled_views(model: nnx.Module, optimizer: nnx.Optimizer | None) -> tuple:
    """The LoRA parameters and the optimizer state as the unrolled model has them: the model and
    optimizer themselves if its layers are not scanned."""
    scanned = scan.decoder(model)
    if scanned is None:
        return model, optimizer
    optimizer_view = optimizer and scan.unrolled(nnx.state(optimizer, nnx.optimizer.OptState), scanned)
    return scan.unrolled(nnx.state(model, nnx.LoRAParam), scanned), optimizer_view


def time_saves(manager, times: SaveTimes) -> None:
    """Start the clock of `times` whenever Tunix's checkpoint manager starts a save (Tunix calls
    `save` after every step and lets its Orbax manager's policy decide)."""
    save, orbax_manager = manager.save, manager._checkpoint_manager  # noqa: SLF001 (Tunix exposes no accessor)

    def timed(step: int, *args, force: bool = False, **kwargs):
        if force or orbax_manager.should_save(step):
            times.started()
        return save(step, *args, force=force, **kwargs)

    manager.save = timed


def lora_metadata(config: TrainConfig) -> LoraMetadata:
    lora = config.lora
    return LoraMetadata(
        rank=lora.rank,
        alpha=lora.alpha,
        target_modules=lora.target_modules,
        base_model_path=config.model_path,
        model_dtype=config.model_dtype,
    )


def write_lora_metadata(config: TrainConfig) -> None:
    """Write `lora.json` before the first checkpoint; refuse to mix two adapters in one folder."""
    path = epath.Path(config.checkpoint_dir) / LORA_METADATA
    new = lora_metadata(config)
    if path.exists():
        old = LoraMetadata.model_validate_json(path.read_text())
        if (old.rank, old.alpha, sorted(old.target_modules)) != (new.rank, new.alpha, sorted(new.target_modules)):
            raise CheckpointMismatch(
                f"{path} describes a rank-{old.rank} adapter (alpha {old.alpha}, targets {old.target_modules}); "
                f"this config trains rank {new.rank} (alpha {new.alpha}, targets {new.target_modules}): "
                "use another output_dir"
            )
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new.model_dump_json(indent=2))


def step_dir(config: TrainConfig, step: int) -> str:
    return join(config.checkpoint_dir, str(step))
