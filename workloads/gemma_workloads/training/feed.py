"""How the trainer gets its batches, and how a preempted run stops.

A Tunix data hook rather than an iterator: the trainer then starts reading at the restored data
position instead of re-reading and skipping what earlier runs consumed, and the hook is the one
place that sees every micro-batch boundary, which is where a stop request is acted on.
"""

from __future__ import annotations

import time
from collections import defaultdict

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from tunix.sft import hooks, peft_trainer, sharding_utils

from gemma_workloads.training.batches import Batches
from gemma_workloads.training.preemption import Preempted, Preemption


class DataFeed(hooks.DataHooks):
    """Micro-batches from the data position; eval batches in order; stops on SIGTERM.

    Each micro-batch also re-seeds LoRA dropout from (seed, position), so that a resumed run
    draws the same dropout masks as an uninterrupted one (the RNG state is not checkpointed).
    """

    def __init__(
        self,
        batches: Batches,
        evals: list[dict],
        *,
        total_steps: int,
        accumulation: int,
        seed: int,
        preemption: Preemption,
        dropout: nnx.Rngs | None,
        device_mesh: jax.sharding.Mesh,
    ):
        self.batches, self.evals, self.total_steps, self.accumulation = batches, evals, total_steps, accumulation
        self.seed, self.preemption, self.dropout, self.mesh = seed, preemption, dropout, device_mesh
        self._replicated = NamedSharding(device_mesh, PartitionSpec())  # as the jitted step returns them
        self.tokens_in_step: dict[int, int] = defaultdict(int)  # real (not padding) tokens per optimizer step
        self.micro_seconds = 0.0  # slowest interval between two micro-batches (saves and evals included)
        self._calls, self._last, self._eval_index = 0, 0.0, 0
        self._seed_dropout()

    def load_next_train_batch(self, trainer: peft_trainer.PeftTrainer) -> dict | None:
        now, self._calls = time.monotonic(), self._calls + 1
        if self._calls > 2:  # the first interval includes compilation
            self.micro_seconds = max(self.micro_seconds, now - self._last)
        self._last = now
        if trainer.train_steps >= self.total_steps or self._stop(trainer):
            return None
        self._seed_dropout()
        batch = self.batches.next()
        self.tokens_in_step[trainer.train_steps + 1] += int((batch["segment_ids"] > 0).sum())
        return self._local(batch)

    def load_next_eval_batch(self, trainer: peft_trainer.PeftTrainer) -> dict | None:
        if self._eval_index == len(self.evals):
            self._eval_index = 0
            return None
        self._eval_index += 1
        return self._local(self.evals[self._eval_index - 1])

    def _stop(self, trainer: peft_trainer.PeftTrainer) -> bool:
        """On a stop request: finish the optimizer step and checkpoint it if that fits in the grace
        period, then end the loop; otherwise leave at once (Preempted)."""
        done = trainer.iter_steps % self.accumulation  # micro-batches into the current optimizer step
        if (done and self.preemption.multi_host) or not self.preemption.requested(trainer.train_steps):
            return False
        left = (self.accumulation - done) % self.accumulation
        times = getattr(trainer, "save_times", None)  # saves are written in the background: add their time
        save = times.longest if times else 0.0
        if not self.preemption.fits((left + 1) * self.micro_seconds + save):
            raise Preempted(f"no time left in the grace period to checkpoint step {trainer.train_steps + bool(left)}")
        if left:
            return False
        if trainer.train_steps == 0:
            raise Preempted("stopped before the first step")
        if trainer.train_steps > (trainer.checkpoint_manager.latest_step() or 0):
            trainer.checkpoint_manager.save(
                trainer.train_steps,
                trainer.model,
                trainer.optimizer,
                save_only_lora_params=True,
                force=True,
                custom_metadata=trainer.custom_checkpoint_metadata(),
            )
        return True

    def _seed_dropout(self) -> None:
        if self.dropout is not None:
            key = jax.random.fold_in(jax.random.key(self.seed), self.batches.position)
            self.dropout.dropout.key[...] = jax.device_put(key, self._replicated)
            self.dropout.dropout.count[...] = jax.device_put(np.uint32(0), self._replicated)

    def _local(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """This host's part of a global batch: the rows its devices hold under the trainer's batch
        sharding (all of them on a single host)."""
        if jax.process_count() == 1:
            return batch
        sharding = sharding_utils.get_sharding(batch["tokens"], self.mesh, PartitionSpec("fsdp"))
        rows = [index[0] for index in sharding.addressable_devices_indices_map(batch["tokens"].shape).values()]
        start, stop = min(r.start or 0 for r in rows), max(r.stop or len(batch["tokens"]) for r in rows)
        return {k: v[start:stop] for k, v in batch.items()}
