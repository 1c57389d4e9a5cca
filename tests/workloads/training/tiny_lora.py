"""A tiny random Gemma 4 with a non-zero LoRA adapter, and a batch of packed and unpacked rows, for
comparing the training fast paths with the reference (Tunix's own code)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.models.gemma4 import model as gemma4

from gemma_devcluster import tiny
from gemma_workloads.config import LoraConfig
from gemma_workloads.training import batches, lora
from gemma_workloads.training import model_loader as model

LENGTH = 128  # splash attention's blocks are multiples of 128; the sliding window is 16
# Row 0 packs two examples then padding; row 1 holds one example then padding.
SEGMENTS = ((0, 40, 1), (40, 100, 2), (0, 90, 1))


def random_lora_model(dtype: str = "float32", sizes: tiny.TinyConfig | None = None) -> gemma4.Gemma4:
    """Every weight random (Tunix builds some at zero), then LoRA with random B, so every
    projection and every adapter factor shapes the output."""
    config = model.tunix_config((sizes or tiny.TinyConfig()).hf_config(), dtype=dtype)
    base = gemma4.Gemma4(config, rngs=nnx.Rngs(0))
    graph, state = nnx.split(base)
    keys = iter(jax.random.split(jax.random.key(1), 256))
    state = jax.tree.map(lambda a: (0.1 * jax.random.normal(next(keys), a.shape, jnp.float32)).astype(a.dtype), state)
    adapted = lora.apply_lora(nnx.merge(graph, state), LoraConfig(rank=4, alpha=8.0), seed=0)
    for _, var in nnx.iter_graph(adapted):
        if isinstance(var, nnx.LoRAParam):
            var[...] = 0.1 * jax.random.normal(next(keys), var.shape, var.dtype)
    return adapted


def packed_batch(seed: int = 0) -> dict[str, np.ndarray]:
    """A micro-batch as batches.Batches hands it out: row 0 packed, row 1 not."""
    rng = np.random.default_rng(seed)
    shape = (2, LENGTH)
    tokens = rng.integers(6, tiny.TinyConfig().vocab_size, shape).astype(np.int32)
    segment_ids, positions = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
    for row, (start, end, segment) in zip((0, 0, 1), SEGMENTS, strict=True):
        segment_ids[row, start:end] = segment
        positions[row, start:end] = np.arange(end - start)
    loss_mask = segment_ids > 0
    loss_mask[:, 0] = loss_mask[0, 40] = False  # a segment's first token is never a target
    return {
        "tokens": tokens,
        "loss_mask": loss_mask,
        "segment_ids": segment_ids,
        "positions": positions,
        "loss_scale": np.full(2, 1 / loss_mask[:, 1:].sum(), np.float32),
    }


@nnx.jit
def _forward(lora_model: gemma4.Gemma4, inputs: dict) -> jax.Array:
    out, _ = lora_model(inputs["input_tokens"], inputs["positions"], None, inputs["attention_mask"])
    return out


def logits(lora_model: gemma4.Gemma4, batch: dict[str, np.ndarray]) -> np.ndarray:
    """The model's logits; the batch is an argument of one jitted function, not a constant of a new
    one, so a second batch of the same shapes runs the same compiled program."""
    return np.asarray(_forward(lora_model, batches.model_inputs(batch)), np.float32)


def lora_grads(lora_model: gemma4.Gemma4, loss_fn, batch: dict[str, np.ndarray]) -> tuple[float, list[np.ndarray]]:
    """The loss and its gradient with respect to every LoRA factor."""
    value, grads = lora_grad_state(lora_model, loss_fn, batch)
    return value, [np.asarray(g, np.float32) for g in jax.tree.leaves(grads)]


def lora_grad_state(lora_model: gemma4.Gemma4, loss_fn, batch: dict[str, np.ndarray]) -> tuple[float, nnx.State]:
    """The loss and its gradient with respect to the LoRA factors, as the model's state."""
    value, grads = _value_and_lora_grads(loss_fn)(lora_model, batches.model_inputs(batch))
    return float(value), grads


@functools.cache
def _value_and_lora_grads(loss_fn):
    """One jitted gradient function per loss, the batch an argument (see `logits`)."""
    return nnx.jit(nnx.value_and_grad(lambda m, inputs: loss_fn(m, **inputs), argnums=nnx.DiffState(0, nnx.LoRAParam)))


def assert_close(actual: np.ndarray, expected: np.ndarray, dtype: str) -> None:
    """Tight in float32; in bf16 within a few bf16 roundings of the largest value."""
    scale = float(np.abs(expected).max())
    tolerance = 1e-5 * scale if dtype == "float32" else 3e-2 * scale
    np.testing.assert_allclose(actual, expected, rtol=0, atol=tolerance)
