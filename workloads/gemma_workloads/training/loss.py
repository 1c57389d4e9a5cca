"""The training loss: every trained token of an optimizer step weighs the same.

Tunix's default loss is the mean over one micro-batch, and optax.MultiSteps averages the
micro-batches' gradients (`use_grad_mean=True`, its default), so with gradient accumulation a row
with 3 answer tokens would weigh as much as one with 3,000. Here each micro-batch's summed loss is
scaled by `loss_scale` = accumulation steps / trained tokens in the whole step (batches.py knows
them in advance, the order being fixed), so the averaged gradient is that of the step's mean over
its tokens, whatever the micro-batch size, and so is the reported loss.

With `chunk_tokens` the per-token losses come from cross_entropy.py, which never holds the whole
float32 logits; the weighting is the same.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from gemma_workloads.training import cross_entropy


def token_weighted_nll(
    model: nnx.Module,
    input_tokens: jax.Array,
    input_mask: jax.Array,
    positions: jax.Array,
    attention_mask: jax.Array,
    loss_scale: jax.Array | None = None,
    chunk_tokens: int | None = None,
) -> jax.Array:
    """Next-token negative log-likelihood on the trained tokens, summed and scaled by `loss_scale`
    (one value per row, all equal); without it, the micro-batch's own mean."""
    mask = input_mask[:, 1:]
    per_row = row_nll(model, input_tokens, input_mask, positions, attention_mask, chunk_tokens)
    if loss_scale is None:
        return per_row.sum() / jnp.maximum(mask.sum(), 1)
    return jnp.sum(per_row * loss_scale)


def row_nll(
    model: nnx.Module,
    input_tokens: jax.Array,
    input_mask: jax.Array,
    positions: jax.Array,
    attention_mask: jax.Array,
    chunk_tokens: int | None = None,
) -> jax.Array:
    """Each row's summed negative log-likelihood of its trained tokens, float32 `[B]`."""
    if chunk_tokens:
        nll = cross_entropy.next_token_nll(model, input_tokens, positions, attention_mask, chunk_tokens=chunk_tokens)
    else:
        logits, _ = model(input_tokens, positions, None, attention_mask)
        logits = logits[:, :-1].astype(jnp.float32)  # the last position predicts nothing here
        targets = input_tokens[:, 1:]
        nll = jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.sum(jnp.where(input_mask[:, 1:], nll, 0.0), axis=1)


def trainer_loss(chunk_tokens: int | None):
    """The loss for Tunix's trainer, with the cross-entropy in chunks of `chunk_tokens` (None: whole
    logits). A plain function, not a partial: nnx's transforms bind its keyword inputs by name."""
    if not chunk_tokens:
        return token_weighted_nll

    def chunked_token_weighted_nll(
        model: nnx.Module,
        input_tokens: jax.Array,
        input_mask: jax.Array,
        positions: jax.Array,
        attention_mask: jax.Array,
        loss_scale: jax.Array | None = None,
    ) -> jax.Array:
        return token_weighted_nll(model, input_tokens, input_mask, positions, attention_mask, loss_scale, chunk_tokens)

    return chunked_token_weighted_nll
