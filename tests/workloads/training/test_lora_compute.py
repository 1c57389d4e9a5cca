"""The loss runs the float32 LoRA factors in the model's compute dtype, and their gradients stay float32."""

from __future__ import annotations

import contextlib

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gemma_workloads.training import batches, lora, loss

from .tiny_lora import packed_batch, random_lora_model


def float32_matmuls(model, batch) -> list[str]:
    """The float32 matrix products in the traced loss and its gradient."""
    inputs = batches.model_inputs(batch)
    graph, params, rest = nnx.split(model, nnx.LoRAParam, ...)

    def loss_of(p):
        return loss.token_weighted_nll(nnx.merge(graph, p, rest), **inputs)

    jaxpr = jax.make_jaxpr(jax.grad(loss_of))(params)
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general" and any(v.aval.dtype == jnp.float32 for v in eqn.invars):
                found.append(str([v.aval for v in eqn.invars]))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jaxpr.jaxpr)
    return found


def lora_gradients(model, batch) -> list[np.ndarray]:
    inputs = batches.model_inputs(batch)
    grads = nnx.grad(lambda m: loss.token_weighted_nll(m, **inputs), argnums=nnx.DiffState(0, nnx.LoRAParam))(model)
    return [np.asarray(g) for g in jax.tree.leaves(grads)]


def test_a_bf16_models_loss_has_no_float32_matmul():
    model, batch = random_lora_model("bfloat16"), packed_batch()
    assert float32_matmuls(model, batch) == []


def test_without_the_cast_the_adapter_would_run_in_float32(monkeypatch):
    # the check above can fail: Qwix promotes bf16 activations against float32 factors
    monkeypatch.setattr(lora, "computing_in", lambda model, dtype: contextlib.nullcontext())
    assert float32_matmuls(random_lora_model("bfloat16"), packed_batch())


def test_the_gradients_are_float32_and_follow_float32_compute_to_bf16_rounding(monkeypatch):
    model, batch = random_lora_model("bfloat16"), packed_batch()
    cast = lora_gradients(model, batch)
    assert all(g.dtype == np.float32 and np.isfinite(g).all() for g in cast)
    assert all(var.dtype == jnp.float32 for _, var in nnx.iter_graph(model) if isinstance(var, nnx.LoRAParam))
    monkeypatch.setattr(lora, "computing_in", lambda model, dtype: contextlib.nullcontext())
    full = lora_gradients(model, batch)
    error = np.linalg.norm(np.concatenate([(c - f).ravel() for c, f in zip(cast, full, strict=True)]))
    scale = np.linalg.norm(np.concatenate([f.ravel() for f in full]))
    assert 0 < error / scale < 2e-2  # bf16 products (8 bits of mantissa) against float32 ones


def test_the_context_puts_the_float32_factors_back():
    model = random_lora_model("bfloat16")
    before = [var.get_value() for _, var in nnx.iter_graph(model) if isinstance(var, nnx.LoRAParam)]
    with lora.computing_in(model, jnp.bfloat16):
        inside = [var.dtype for _, var in nnx.iter_graph(model) if isinstance(var, nnx.LoRAParam)]
    after = [var.get_value() for _, var in nnx.iter_graph(model) if isinstance(var, nnx.LoRAParam)]
    assert set(inside) == {jnp.dtype(jnp.bfloat16)}
    assert all(a is b for a, b in zip(before, after, strict=True))
