"""Next-token cross-entropy over Gemma's 262,144-entry vocabulary without its float32 logits.

Tunix's forward ends with `logits = embedder.decode(final_norm(x))` in float32 (then the final
softcap): 4 bytes x 262,144 per token, 3.2 GB for one 3,072-token row, and as much again for their
gradient. Here the tokens are cut into chunks; each chunk's logits are made, reduced to
logsumexp - target logit, and dropped, and `jax.checkpoint` makes the backward pass remake them
chunk by chunk instead of keeping them. The numbers are those of the unchunked loss: same matmul
in the model's dtype, float32 from there, same softcap.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax
import jax.numpy as jnp
from tunix.models.gemma4 import model as gemma4


@contextlib.contextmanager
def _without_logits(model: gemma4.Gemma4) -> Iterator[None]:
    """Makes `model(...)` return its final hidden states: the unembedding becomes the identity and
    the softcap is skipped (tunix 0.1.7 `Gemma4.__call__`: `decode(final_norm(x)).astype(float32)`,
    then the softcap), for the length of one call."""
    embedder, config = model.embedder, model.config
    softcap = config.final_logit_softcap
    object.__setattr__(embedder, "decode", lambda x: x)  # an instance attribute shadowing the method
    config.final_logit_softcap = None
    try:
        yield
    finally:
        object.__delattr__(embedder, "decode")
        config.final_logit_softcap = softcap


def hidden_states(
    model: gemma4.Gemma4, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array
) -> jax.Array:
    """The final-normed hidden states `[B, T, D]` in the model's dtype."""
    with _without_logits(model):
        hidden, _ = model(tokens, positions, None, attention_mask)
    return hidden.astype(model.config.dtype)  # Tunix casts to float32 on the way out: exact back


def token_nll(
    hidden: jax.Array, embedding: jax.Array, targets: jax.Array, *, softcap: float | None, chunk_tokens: int
) -> jax.Array:
    """-log p(target) for each position, `[B, T]` float32, `chunk_tokens` positions at a time."""
    batch, length, dim = hidden.shape
    count = batch * length
    chunks = -(-count // chunk_tokens)
    pad = chunks * chunk_tokens - count
    flat_hidden = jnp.pad(hidden.reshape(count, dim), ((0, pad), (0, 0))).reshape(chunks, chunk_tokens, dim)
    flat_targets = jnp.pad(targets.reshape(count), (0, pad)).reshape(chunks, chunk_tokens)
    weights = embedding.astype(hidden.dtype)

    @jax.checkpoint
    def chunk_nll(args: tuple[jax.Array, jax.Array]) -> jax.Array:
        h, t = args
        # contracting both on their last axis: `h @ weights.T` would make XLA hoist a transposed
        # copy of the whole embedding out of the loop (5.25 GiB for the 31B model in float32)
        logits = jax.lax.dot_general(h, weights, (((1,), (1,)), ((), ()))).astype(jnp.float32)
        if softcap is not None:
            logits = jnp.tanh(logits / softcap) * softcap
        target = jnp.take_along_axis(logits, t[:, None], axis=-1)[:, 0]
        return jax.nn.logsumexp(logits, axis=-1) - target

    nll = jax.lax.map(chunk_nll, (flat_hidden, flat_targets))
    return nll.reshape(-1)[:count].reshape(batch, length)


def next_token_nll(
    model: gemma4.Gemma4, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array, *, chunk_tokens: int
) -> jax.Array:
    """-log p(token t+1 | tokens <= t), `[B, T - 1]` float32, never holding more than one chunk's logits."""
    hidden = hidden_states(model, tokens, positions, attention_mask)[:, :-1]
    return token_nll(
        hidden,
        model.embedder.input_embedding[...],
        tokens[:, 1:],
        softcap=model.config.final_logit_softcap,
        chunk_tokens=chunk_tokens,
    )
