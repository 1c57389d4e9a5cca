"""The chunked cross-entropy is the reference loss (same value and LoRA gradients, the token
weighting and the final softcap included) and never holds the whole float32 logits."""

import functools

import jax
import jax.extend
import numpy as np
import pytest
from flax import nnx

from gemma_workloads.training import batches, loss
from tests.workloads.training.tiny_lora import LENGTH, assert_close, lora_grads, packed_batch, random_lora_model


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_chunked_loss_equals_the_reference_loss_and_gradient(dtype):
    model = random_lora_model(dtype)
    assert model.config.final_logit_softcap is not None, "the softcap must be part of what is compared"
    batch = packed_batch()
    ref_loss, ref_grads = lora_grads(model, loss.token_weighted_nll, batch)
    # 100 does not divide the 2 x 127 predicted positions: the last chunk is padded
    chunked_loss, chunked_grads = lora_grads(model, functools.partial(loss.token_weighted_nll, chunk_tokens=100), batch)
    assert chunked_loss == pytest.approx(ref_loss, rel=1e-6 if dtype == "float32" else 1e-2)
    for got, want in zip(chunked_grads, ref_grads, strict=True):
        assert_close(got, want, dtype)
    # without loss_scale: the micro-batch's own mean, as before
    no_scale = {k: v for k, v in batch.items() if k != "loss_scale"}
    mean_ref, _ = lora_grads(model, loss.token_weighted_nll, no_scale)
    mean_chunked, _ = lora_grads(model, functools.partial(loss.token_weighted_nll, chunk_tokens=64), no_scale)
    assert mean_chunked == pytest.approx(mean_ref, rel=1e-6 if dtype == "float32" else 1e-2)


def largest_logits(jaxpr, vocab: int) -> int:
    """The most elements of any float32 value ending in the vocabulary axis, nested jaxprs included."""
    sizes = [0]
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            aval = var.aval
            if getattr(aval, "shape", ()) and aval.shape[-1] == vocab and aval.dtype == np.float32:
                sizes.append(int(np.prod(aval.shape)))
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            sizes.append(largest_logits(sub, vocab))
    return max(sizes)


def test_chunked_loss_never_materialises_the_logits():
    model = random_lora_model("float32")
    inputs = batches.model_inputs(packed_batch())
    vocab = model.config.num_embed

    def biggest(chunk_tokens):
        grad = nnx.value_and_grad(
            lambda m: loss.token_weighted_nll(m, **inputs, chunk_tokens=chunk_tokens),
            argnums=nnx.DiffState(0, nnx.LoRAParam),
        )
        return largest_logits(jax.make_jaxpr(grad)(model).jaxpr, vocab)

    assert biggest(None) >= 2 * (LENGTH - 1) * vocab  # the reference holds them whole (the test can fail)
    # one chunk's logits, or the unembedding itself ([D, V]): nothing that grows with the tokens
    assert biggest(32) <= max(32, model.config.embed_dim) * vocab < 2 * (LENGTH - 1) * vocab
