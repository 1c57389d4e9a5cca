"""Greedy decoding with a KV cache: one prefill of the prompts, then one forward token per step.

Tunix's sampler (`tunix.generate.Sampler`) is not used: it takes strings and tokenises them again
with its own adapter, where the evaluation must continue the exact token ids training used (the
chat template's rendering included), and it pads prompts to the next power of two per call, so
prompts of varied length compile several programs. What it builds on is used as it does: the
model's own cache (`Gemma4.init_cache`: a full-length cache for global layers, a ring of the
window for sliding ones, shared layers reading their origin's) and the model's cached forward.

Prompts are left-padded to the longest prompt of the run, so every row of a batch writes the same
cache slot at each step (Gemma 4's decode step uses one end index for the batch), with positions
counted from each row's first real token and padding masked out. The shapes are fixed for the run:
one program for the prefill and the decode loop, compiled once, reused for the base model.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def generate(
    model: nnx.Module, prompts: list[np.ndarray], *, max_new_tokens: int, stop_ids: set[int], batch_size: int
) -> list[list[int]]:
    """The greedy continuation of each prompt: up to `max_new_tokens` ids, ending at the first stop
    id (included)."""
    width = max(len(p) for p in prompts)
    stops = jnp.asarray(sorted(stop_ids), jnp.int32)
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        tokens = np.zeros((batch_size, width), np.int32)
        real = np.zeros((batch_size, width), bool)
        for i, prompt in enumerate(chunk + [chunk[0]] * (batch_size - len(chunk))):  # filler rows are dropped
            tokens[i, width - len(prompt) :] = prompt
            real[i, width - len(prompt) :] = True
        # Tunix's Gemma has a KV cache and a config; nnx.Module declares neither.
        cache = model.init_cache(batch_size, width + max_new_tokens, model.config.dtype)  # type: ignore[attr-defined]
        ids = np.asarray(_decode(model, jnp.asarray(tokens), jnp.asarray(real), cache, stops, max_new_tokens))  # type: ignore[call-arg]  # nnx.jit's wrapper hides the signature
        for row in ids[: len(chunk)]:
            ended = np.flatnonzero(np.isin(row, list(stop_ids)))
            out.append(row[: ended[0] + 1 if len(ended) else max_new_tokens].tolist())
    return out


@functools.partial(nnx.jit, static_argnums=(5,))  # the loop updates its cache in place: no donation needed
def _decode(model, tokens, real, cache, stops, max_new_tokens):
    graph, state = nnx.split(model)  # the loop's body merges its own copy (as Tunix's sampler does)
    batch, width = tokens.shape
    positions = jnp.maximum(jnp.cumsum(real, axis=1) - 1, 0)
    causal = jnp.tril(jnp.ones((width, width), bool))[None] & real[:, None, :]
    mask = jnp.pad(causal, ((0, 0), (0, 0), (0, max_new_tokens)))
    logits, cache = model(tokens, positions, cache, mask, decode_only_last_token=True)
    first = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    slots = jnp.pad(real, ((0, 0), (0, max_new_tokens)))
    lengths = real.sum(axis=1).astype(jnp.int32)
    out = jnp.zeros((batch, max_new_tokens), jnp.int32).at[:, 0].set(first)
    done = jnp.isin(first, stops)

    def more(carry):
        step, _, _, _, _, done = carry
        return (step < max_new_tokens) & ~jnp.all(done)

    def step_fn(carry):
        step, token, cache, slots, out, done = carry  # `token` was generated at step - 1
        model = nnx.merge(graph, state)
        slots = slots.at[:, width + step - 1].set(True)
        logits, cache = model(token[:, None], (lengths + step - 1)[:, None], cache, slots[:, None, :])
        token = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
        return step + 1, token, cache, slots, out.at[:, step].set(token), done | jnp.isin(token, stops)

    *_, out, _ = jax.lax.while_loop(more, step_fn, (jnp.int32(1), first, cache, slots, out, done))
    return out
