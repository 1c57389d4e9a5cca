"""Preference pairs as training rows, for the methods dpo and orpo.

A pair is two sequences after the same prompt: prompt + chosen answer and prompt + rejected
answer, each a row of `max_seq_len` tokens (never packed), laid out as `[pairs, 2, max_seq_len]`
so that the two halves of a pair always travel together: the data order, the data position and
resumption are those of batches.py, counted in pairs. Inside the jitted step a micro-batch of P
pairs becomes 2P rows, every chosen row first, then every rejected row, the order of Tunix's DPO
trainer (`tunix/sft/dpo/dpo_trainer.py`: chosen logps are the first half of the batch).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from gemma_workloads.config import DatasetConfig
from gemma_workloads.data import Example, invalid, no_usable_examples
from gemma_workloads.training import batches as batching

log = logging.getLogger(__name__)

KEYS = ("tokens", "loss_mask", "segment_ids", "positions")


@dataclass(frozen=True)
class Pair:
    chosen: Example
    rejected: Example

    @property
    def line(self) -> int:
        return self.chosen.line

    def __len__(self) -> int:
        return max(len(self.chosen), len(self.rejected))


def pairs_of(examples: list[Example]) -> list[Pair]:
    """The pairs of the preference format's examples (data.FORMATS: chosen, then rejected, per line)."""
    return [Pair(c, r) for c, r in zip(examples[::2], examples[1::2], strict=True)]


def fitting(pairs: list[Pair], dataset: DatasetConfig) -> list[Pair]:
    """The pairs that fit in `max_seq_len`. A longer one is refused, naming its line, or with
    `skip_invalid` left out and counted: cutting an answer would change which one is preferred."""
    skipped: list[str] = []
    kept = []
    for pair in pairs:
        if len(pair) <= dataset.max_seq_len:
            kept.append(pair)
            continue
        side = "chosen" if len(pair.chosen) >= len(pair.rejected) else "rejected"
        invalid(
            dataset,
            skipped,
            pair.line,
            f"the prompt with its {side} answer is {len(pair)} tokens, over dataset.max_seq_len "
            f"{dataset.max_seq_len}: raise max_seq_len or shorten the pair (skip_invalid leaves it out)",
        )
    if skipped:
        log.warning("left out %d of %d pairs longer than max_seq_len: %s", len(skipped), len(pairs), skipped[0])
    if not kept:
        raise no_usable_examples(dataset, skipped)
    return kept


def split(pairs: list[Pair], eval_fraction: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """batches.split over the pairs' lines: both answers of a line stay on the same side."""
    train, held_out = batching.split([e for p in pairs for e in (p.chosen, p.rejected)], eval_fraction, seed)
    return pairs_of(train), pairs_of(held_out)


def layout(pairs: list[Pair], length: int) -> batching.Rows:
    """Rows `[pairs, 2, length]`: each pair's chosen row, then its rejected row."""
    flat = batching.layout([e for p in pairs for e in (p.chosen, p.rejected)], length, packing=False)
    return batching.Rows(*(getattr(flat, k).reshape(len(pairs), 2, length) for k in KEYS))


class PairBatches(batching.Batches):
    """Micro-batches of pairs. Every pair of an optimizer step weighs the same: each micro-batch's
    loss is the mean over its pairs, and Tunix averages the step's micro-batches."""

    def micro_batch(self, index: int) -> dict[str, np.ndarray]:
        batch = self.rows.take(self._stream(index * self.micro, self.micro))
        batch["loss_scale"] = np.full(self.micro, 1 / self.micro, np.float32)
        return batch


def eval_batches(rows: batching.Rows, micro_batch_size: int) -> list[dict[str, np.ndarray]]:
    """Every held-out pair once; the last batch filled with pairs that weigh nothing, the others
    scaled so that Tunix's mean over batches is the mean over pairs."""
    batches = []
    starts = range(0, len(rows), micro_batch_size)
    for start in starts:
        index = np.arange(start, start + micro_batch_size)
        batch = rows.take(np.minimum(index, len(rows) - 1))
        batch["loss_scale"] = np.where(index < len(rows), len(starts) / len(rows), 0.0).astype(np.float32)
        batches.append(batch)
    return batches


def model_inputs(batch: dict) -> dict:
    """batches.model_inputs over the 2P rows of P pairs (chosen rows first), with one `loss_scale`
    per pair. Runs inside the jitted step."""
    flat = {k: jnp.concatenate([batch[k][:, 0], batch[k][:, 1]]) for k in KEYS}
    return batching.model_inputs(flat) | {"loss_scale": batch["loss_scale"]}
