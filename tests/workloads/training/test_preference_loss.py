"""The DPO and ORPO losses against Tunix's own DPO/ORPO code and the ORPO paper's formula, on a tiny
Gemma 4 whose adapter is not zero (so the fine-tune and its reference differ)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.sft.dpo import dpo_trainer

from gemma_workloads.config import LoraConfig, PreferenceConfig
from gemma_workloads.data import TextCodec
from gemma_workloads.training import lora, pairs, preference_loss
from gemma_workloads.training.model_loader import load_model

LENGTH = 48


@pytest.fixture(scope="module")
def model_and_inputs(tiny_sharded):
    """The tiny model with random non-zero LoRA factors, and a micro-batch of three pairs whose
    answers differ in length."""
    model, _ = load_model(str(tiny_sharded.path))
    model = lora.apply_lora(model, LoraConfig(rank=4, alpha=8.0))
    leaves, treedef = jax.tree.flatten(lora.lora_state(model))
    rng = np.random.default_rng(0)
    nnx.update(model, jax.tree.unflatten(treedef, [jnp.asarray(rng.normal(0, 0.2, x.shape), x.dtype) for x in leaves]))
    codec = TextCodec(str(tiny_sharded.path))
    answers = [("The capital of Peru is Lima.", "Rome."), ("Tokyo.", "The capital is Cairo, I think."), ("Yes.", "No.")]
    found = [
        pairs.Pair(*(codec.answer([{"role": "user", "content": f"Question {i}?"}], a, "field") for a in pair))
        for i, pair in enumerate(answers)
    ]
    batch = pairs.PairBatches(pairs.layout(found, LENGTH), micro_batch_size=3, seed=0).micro_batch(0)
    return model, {k: v for k, v in pairs.model_inputs(batch).items() if k != "loss_scale"}


def tunix_example(model, inputs) -> dpo_trainer.TrainExample:
    """Tunix's DPO input for the same rows, its reference log-probabilities from Tunix's own
    `compute_logps` on the model with its adapter off."""
    mask = inputs["input_mask"][:, 1:].astype(jnp.float32)
    args = (inputs["input_tokens"], inputs["positions"], inputs["attention_mask"], LENGTH - 1, mask)
    with lora.adapter_off(model):
        ref_chosen, ref_rejected = dpo_trainer.compute_logps(model, *args)
    return dpo_trainer.TrainExample(
        input_ids=inputs["input_tokens"],
        positions=inputs["positions"],
        attention_mask=inputs["attention_mask"],
        ref_chosen_logps=ref_chosen,
        ref_rejected_logps=ref_rejected,
        completion_mask=mask,
        logits_to_keep=LENGTH - 1,
    )


@pytest.mark.parametrize("chunk_tokens", [None, 16])
def test_the_dpo_loss_is_tunix_s_with_the_base_as_reference(model_and_inputs, chunk_tokens):
    model, inputs = model_and_inputs
    settings = PreferenceConfig(beta=0.3, label_smoothing=0.1)
    ours = np.asarray(preference_loss.per_pair(model, inputs, "dpo", settings, chunk_tokens))
    theirs, aux = dpo_trainer.dpo_loss_fn(
        model, tunix_example(model, inputs), algorithm="dpo", beta=0.3, label_smoothing=0.1
    )
    assert ours.shape == (3,) and np.isclose(ours.mean(), float(theirs), rtol=1e-5, atol=1e-6)
    assert abs(float(aux["rewards/margin"])) > 1e-3, "the adapter moves the fine-tune away from its reference"


def test_the_orpo_loss_is_the_paper_s_on_mean_token_log_probabilities(model_and_inputs):
    """ORPO paper (arXiv 2403.07691) eq. 2-7: L = -mean log p(chosen) + lambda * -log sigmoid(log
    odds(chosen) - log odds(rejected)), odds(y) = P/(1-P) with P the mean per-token probability
    exp(mean log p); the log-probabilities here are Tunix's `compute_logps`."""
    model, inputs = model_and_inputs
    settings = PreferenceConfig(orpo_lambda=0.5)
    ours = np.asarray(preference_loss.per_pair(model, inputs, "orpo", settings, None))
    mask = inputs["input_mask"][:, 1:].astype(jnp.float32)
    chosen, rejected = dpo_trainer.compute_logps(
        model, inputs["input_tokens"], inputs["positions"], inputs["attention_mask"], LENGTH - 1, mask
    )
    counts = np.asarray(mask.sum(axis=1))
    mean_c, mean_r = np.asarray(chosen, np.float64) / counts[:3], np.asarray(rejected, np.float64) / counts[3:]
    log_odds = (mean_c - np.log1p(-np.exp(mean_c))) - (mean_r - np.log1p(-np.exp(mean_r)))
    expected = -mean_c + 0.5 * np.log1p(np.exp(-log_odds))
    np.testing.assert_allclose(ours, expected, rtol=1e-5)


def test_only_the_adapter_gets_gradients_and_the_reference_none(model_and_inputs):
    """The reference is the same weights with the adapter off: the loss's gradient flows through the
    fine-tune's log-probabilities only. With a zero adapter (B = 0, as training starts) the DPO
    loss of every pair is log 2 and its gradient is that of -beta/2 * the log-probability margin."""
    model, inputs = model_and_inputs
    settings = PreferenceConfig(beta=0.2)
    saved = jax.tree.map(lambda x: x, lora.lora_state(model))
    with lora.adapter_off(model):
        zero_b = jax.tree.map(lambda x: x, lora.lora_state(model))
    try:
        nnx.update(model, zero_b)
        losses = np.asarray(preference_loss.per_pair(model, inputs, "dpo", settings, None))
        np.testing.assert_allclose(losses, np.log(2), rtol=1e-6)

        def dpo(m):
            return preference_loss.per_pair(m, inputs, "dpo", settings, None).mean()

        def margin(m):
            logps = preference_loss.answer_logps(m, inputs, None)
            return -0.2 / 2 * (logps[:3] - logps[3:]).mean()

        wrt = nnx.DiffState(0, nnx.LoRAParam)
        ours = jax.tree.leaves(nnx.grad(dpo, argnums=wrt)(model))
        expected = jax.tree.leaves(nnx.grad(margin, argnums=wrt)(model))
        assert any(np.abs(np.asarray(g)).max() > 0 for g in ours)
        for g, e in zip(ours, expected, strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-4, atol=1e-7)
    finally:
        nnx.update(model, saved)
