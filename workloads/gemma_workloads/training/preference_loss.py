"""The DPO and ORPO losses over a micro-batch of preference pairs (pairs.py lays them out).

The formulas are Tunix's (`dpo_loss_fn` in `tunix/sft/dpo/dpo_trainer.py`), with label smoothing
as there; what differs is where the log-probabilities come from:

- The DPO reference is the base model itself: the same model with every LoRA B factor zeroed
  (lora.adapter_off), traced inside the step with its gradient stopped. No second copy of the
  model sits in HBM (Tunix's trainer takes a separate reference model); the cost is one forward
  pass without activations kept, over both sequences of every pair.
- Sequence log-probabilities are sums over the answer tokens of loss.row_nll, so the chunked
  cross-entropy keeps the float32 logits of a 262k vocabulary out of HBM as it does for SFT.
- ORPO's odds use the mean log-probability per answer token (the ORPO paper, eq. 4, arXiv
  2403.07691; TRL's ORPOTrainer; Tunix after 0.1.7), so the odds of a long answer do not vanish.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from gemma_workloads.config import PreferenceConfig
from gemma_workloads.training import lora, loss


def dpo_losses(
    chosen: jax.Array,
    rejected: jax.Array,
    ref_chosen: jax.Array,
    ref_rejected: jax.Array,
    *,
    beta: float,
    label_smoothing: float,
) -> jax.Array:
    """-log sigmoid(beta * ((chosen - ref_chosen) - (rejected - ref_rejected))), label-smoothed;
    the inputs are summed answer log-probabilities, one per pair."""
    delta = beta * ((chosen - ref_chosen) - (rejected - ref_rejected))
    return -(jax.nn.log_sigmoid(delta) * (1 - label_smoothing) + jax.nn.log_sigmoid(-delta) * label_smoothing)


def orpo_losses(
    chosen: jax.Array,
    rejected: jax.Array,
    chosen_tokens: jax.Array,
    rejected_tokens: jax.Array,
    *,
    orpo_lambda: float,
    label_smoothing: float,
) -> jax.Array:
    """The chosen answer's mean negative log-likelihood plus lambda times the odds-ratio loss
    -log sigmoid(log odds(chosen) - log odds(rejected)), odds(y) = p / (1 - p) of the mean
    per-token log-probability p; the inputs are summed answer log-probabilities and token counts."""
    mean_chosen = chosen / jnp.maximum(chosen_tokens, 1)
    mean_rejected = rejected / jnp.maximum(rejected_tokens, 1)
    log_odds = (mean_chosen - mean_rejected) - (jnp.log1p(-jnp.exp(mean_chosen)) - jnp.log1p(-jnp.exp(mean_rejected)))
    odds_ratio = -(
        jax.nn.log_sigmoid(log_odds) * (1 - label_smoothing) + jax.nn.log_sigmoid(-log_odds) * label_smoothing
    )
    return -mean_chosen + orpo_lambda * odds_ratio


def answer_logps(model: nnx.Module, inputs: dict, chunk_tokens: int | None) -> jax.Array:
    """Each row's summed log-probability of its answer tokens, `[2P]`."""
    return -loss.row_nll(
        model, inputs["input_tokens"], inputs["input_mask"], inputs["positions"], inputs["attention_mask"], chunk_tokens
    )


def reference_logps(model: nnx.Module, inputs: dict, chunk_tokens: int | None) -> jax.Array:
    """answer_logps of the base model: the adapter off, no gradient."""
    with lora.adapter_off(model):
        return jax.lax.stop_gradient(answer_logps(model, inputs, chunk_tokens))


def per_pair(
    model: nnx.Module, inputs: dict, method: str, settings: PreferenceConfig, chunk_tokens: int | None
) -> jax.Array:
    """The method's loss of each pair of the micro-batch, `[P]`."""
    pairs = inputs["input_tokens"].shape[0] // 2

    def halves(rows: jax.Array) -> tuple[jax.Array, jax.Array]:  # (chosen rows, rejected rows)
        return rows[:pairs], rows[pairs:]

    ref = reference_logps(model, inputs, chunk_tokens) if method == "dpo" else None
    logps = halves(answer_logps(model, inputs, chunk_tokens))
    if ref is not None:
        return dpo_losses(*logps, *halves(ref), beta=settings.beta, label_smoothing=settings.label_smoothing)
    tokens = halves(inputs["input_mask"][:, 1:].sum(axis=1))
    return orpo_losses(*logps, *tokens, orpo_lambda=settings.orpo_lambda, label_smoothing=settings.label_smoothing)


def trainer_loss(method: str, settings: PreferenceConfig, chunk_tokens: int | None):
    """The loss for Tunix's trainer: the pairs' losses weighed by `loss_scale` (pairs.py)."""

    def preference_loss(
        model: nnx.Module,
        input_tokens: jax.Array,
        input_mask: jax.Array,
        positions: jax.Array,
        attention_mask: jax.Array,
        loss_scale: jax.Array,
    ) -> jax.Array:
        inputs = {
            "input_tokens": input_tokens,
            "input_mask": input_mask,
            "positions": positions,
            "attention_mask": attention_mask,
        }
        return jnp.sum(per_pair(model, inputs, method, settings, chunk_tokens) * loss_scale)

    return preference_loss
