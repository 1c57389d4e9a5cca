"""Checkpoints are written in the background, and each save is timed to its commit: a Spot
reclaim leaves 15 s (GKE docs, "Spot VMs"), so a preempted run must know what a save costs."""

from __future__ import annotations

import time

from flax import nnx
from tunix.sft.checkpoint_manager import CheckpointManager

from gemma_workloads.config import TrainConfig
from gemma_workloads.training import checkpoint_writer as checkpoints


def test_saves_are_asynchronous_and_timed_to_their_commit(tmp_path):
    config = TrainConfig(
        model_path=str(tmp_path),
        dataset={"path": str(tmp_path / "d.jsonl")},
        steps=10,
        checkpoint_every=5,
        output_dir=str(tmp_path / "out"),
    )
    times = checkpoints.SaveTimes()
    options = checkpoints.options(config, 10, times)
    assert options.enable_async_checkpointing
    manager = CheckpointManager(config.checkpoint_dir, options)
    checkpoints.time_saves(manager, times)
    model = nnx.Linear(512, 512, rngs=nnx.Rngs(0))
    assert not manager.save(4, model) and times.longest == 0.0, "no save, no clock"
    called = time.monotonic()
    assert manager.save(5, model)
    returned = time.monotonic() - called
    manager.close()  # waits for the background write
    assert times.longest >= returned > 0, "the clock runs until the commit, not until save returns"
    assert manager.latest_step() == 5 and (tmp_path / "out" / "checkpoints" / "5" / "model_params").is_dir()
