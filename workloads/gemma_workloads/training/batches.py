"""Fixed-length rows and the deterministic order in which training sees them.

Examples become rows of `max_seq_len` tokens, one per row (padded) or several per row (packed,
each example a segment that attends only to itself, with its own positions). Training reads an
endless stream of rows: epoch `e` visits every row once in a permutation seeded by `(seed, e)`,
and micro-batch `i` is stream rows `[i * micro, (i + 1) * micro)`. The data position is therefore
one integer, the number of micro-batches consumed, and a resumed run sees exactly the rows an
uninterrupted run would have seen.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass
from functools import cached_property

import jax.numpy as jnp
import numpy as np

from gemma_workloads.data import DataError, Example

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rows:
    """Rows of `length` tokens. Segment id 0 marks padding; positions restart in every segment."""

    tokens: np.ndarray  # int32 [R, L]
    loss_mask: np.ndarray  # bool [R, L]
    segment_ids: np.ndarray  # int32 [R, L]
    positions: np.ndarray  # int32 [R, L]

    def __len__(self) -> int:
        return len(self.tokens)

    def take(self, index: np.ndarray) -> dict[str, np.ndarray]:
        return {
            "tokens": self.tokens[index],
            "loss_mask": self.loss_mask[index],
            "segment_ids": self.segment_ids[index],
            "positions": self.positions[index],
        }

    @cached_property
    def targets(self) -> np.ndarray:
        """Tokens each row is trained on (its first token is never a target)."""
        return self.loss_mask[:, 1:].sum(axis=1)

    @cached_property
    def fingerprint(self) -> str:
        """Identifies the data and its layout, so a resume can tell that the dataset changed."""
        digest = hashlib.sha256()
        for array in (self.tokens, self.loss_mask, self.segment_ids):
            digest.update(np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()[:16]


def layout(examples: list[Example], length: int, *, packing: bool) -> Rows:
    """Rows in the order of `examples`: packed greedily (the next example starts a new row when
    it does not fit) or one example per row."""
    groups: list[list[Example]] = []
    used = length
    for example in examples:
        if packing and used + len(example) <= length:
            groups[-1].append(example)
            used += len(example)
        else:
            groups.append([example])
            used = len(example)
    shape = (len(groups), length)
    rows = Rows(np.zeros(shape, np.int32), np.zeros(shape, bool), np.zeros(shape, np.int32), np.zeros(shape, np.int32))
    for r, group in enumerate(groups):
        start = 0
        for s, example in enumerate(group, start=1):
            end = start + len(example)
            rows.tokens[r, start:end] = example.tokens
            rows.loss_mask[r, start:end] = example.loss_mask
            rows.loss_mask[r, start] = False  # never predicted from the previous segment
            rows.segment_ids[r, start:end] = s
            rows.positions[r, start:end] = np.arange(len(example))
            start = end
    return rows


def fitting(examples: list[Example], length: int) -> list[Example]:
    """The examples that fit in `length` tokens (the others are dropped, and said so)."""
    kept = [e for e in examples if len(e) <= length]
    if not kept:
        shortest = min(len(e) for e in examples)
        raise DataError(f"max_seq_len {length} is shorter than every example (the shortest has {shortest} tokens)")
    if len(kept) < len(examples):
        log.warning(
            "left out %d of %d examples longer than max_seq_len %d", len(examples) - len(kept), len(examples), length
        )
    return kept


def split(examples: list[Example], eval_fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """A seeded shuffle of the dataset's lines, then the first `eval_fraction` of them held out for
    evaluation: the turns of one conversation stay on the same side."""
    lines: dict[int, list[Example]] = {}
    for i, example in enumerate(examples):
        lines.setdefault(example.line or -1 - i, []).append(example)
    groups = list(lines.values())
    order = np.random.default_rng(seed).permutation(len(groups))
    n_eval = math.ceil(eval_fraction * len(groups)) if eval_fraction else 0
    if n_eval and n_eval >= len(groups):
        raise DataError(f"eval_fraction {eval_fraction} leaves no training examples out of {len(groups)} lines")
    shuffled = [groups[i] for i in order]
    return [e for g in shuffled[n_eval:] for e in g], [e for g in shuffled[:n_eval] for e in g]


class Batches:
    """Micro-batches of a fixed row order; `position` is the number already handed out.

    Each carries `loss_scale` for loss.token_weighted_nll: `accumulation` over the trained tokens
    of its optimizer step (`accumulation` micro-batches), so each token of the step weighs the same.
    """

    def __init__(self, rows: Rows, micro_batch_size: int, seed: int, position: int = 0, accumulation: int = 1):
        self.rows, self.micro, self.seed, self.position = rows, micro_batch_size, seed, position
        self.accumulation = accumulation
        self._epoch, self._order = -1, np.empty(0, np.int64)

    def _stream(self, start: int, count: int) -> np.ndarray:
        out = []
        for s in range(start, start + count):
            epoch, offset = divmod(s, len(self.rows))
            if epoch != self._epoch:
                self._epoch, self._order = epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))
            out.append(self._order[offset])
        return np.asarray(out)

    def micro_batch(self, index: int) -> dict[str, np.ndarray]:
        step_rows = self.accumulation * self.micro
        targets = self.rows.targets[self._stream(index // self.accumulation * step_rows, step_rows)].sum()
        batch = self.rows.take(self._stream(index * self.micro, self.micro))
        batch["loss_scale"] = np.full(self.micro, self.accumulation / max(targets, 1), np.float32)
        return batch

    def next(self) -> dict[str, np.ndarray]:
        batch = self.micro_batch(self.position)
        self.position += 1
        return batch

    def state(self) -> dict[str, int | str]:
        """The data position as stored in a checkpoint."""
        epoch, row = divmod(self.position * self.micro, len(self.rows))
        return {
            "micro_batches": self.position,
            "micro_batch_size": self.micro,
            "epoch": epoch,
            "row_in_epoch": row,
            "fingerprint": self.rows.fingerprint,
        }

    def steps_for(self, epochs: int, batch_size: int) -> int:
        """Optimizer steps that cover `epochs` passes over the rows."""
        return max(1, math.ceil(epochs * len(self.rows) / batch_size))


def eval_batches(rows: Rows, micro_batch_size: int) -> list[dict[str, np.ndarray]]:
    """Every eval row once, in order; the last batch is filled with empty rows (no loss). Tunix
    averages their losses, so each is scaled to make that the mean over every eval token."""
    batches = []
    starts = range(0, len(rows), micro_batch_size)
    scale = len(starts) / max(rows.targets.sum(), 1)
    for start in starts:
        index = np.arange(start, start + micro_batch_size)
        batch = rows.take(np.minimum(index, len(rows) - 1))
        for key in ("loss_mask", "segment_ids"):
            batch[key][index >= len(rows)] = 0
        batch["loss_scale"] = np.full(micro_batch_size, scale, np.float32)
        batches.append(batch)
    return batches


def model_inputs(batch: dict) -> dict:
    """What the loss takes: `input_mask` is the loss mask (it weighs the targets), the attention
    mask is causal within each segment, `loss_scale` is passed on where the batch has one. Runs
    inside the jitted train step."""
    segments = batch["segment_ids"]
    same = segments[:, :, None] == segments[:, None, :]
    length = segments.shape[1]
    causal = jnp.tril(jnp.ones((length, length), dtype=bool))
    scale = {"loss_scale": batch["loss_scale"]} if "loss_scale" in batch else {}
    return {
        "input_tokens": batch["tokens"],
        "input_mask": batch["loss_mask"],
        "positions": batch["positions"],
        "attention_mask": same & causal[None] & (segments[:, None, :] > 0),
    } | scale
