"""Qwix LoRA on Gemma 4's projections, named the Hugging Face way.

Users name targets as in HF (`q_proj`, `k_proj`, ...); Tunix's modules are einsums
(`q_einsum`, the fused `kv_einsum` of sliding layers, `k_einsum` of the global K=V layers,
`attn_vec_einsum`) and the MLP's `gate_proj`/`up_proj`/`down_proj`. `k_proj` maps to both
`kv_einsum` and `k_einsum`, so the global layers' keys are adapted too (the seed paper's regex
missed them).

The adapter is kept in float32 whatever the base's dtype (Qwix would make it in the base's):
with |A| about 0.02, bf16 rounds away every update below ~1e-4, which is most of a 1e-4 cosine
schedule, and weight decay with it. Optimizer state follows the parameters' dtype, so Adam's
moments are float32 too. Each projection's output keeps the base's compute dtype.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import weakref
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import qwix
from flax import nnx

from gemma_workloads.config import LORA_MODULES, LoraConfig

# Qwix matches "/"-joined module paths (`layers/3/attn/q_einsum`) with re.fullmatch. Anchoring
# on the decoder layers keeps vision-tower modules of a multimodal model out.
_DECODER = r"(?:.*/)?layers/\d+/(?:attn|mlp)/"


def tunix_modules(targets: list[str]) -> list[str]:
    """Tunix module names for HF target names, in a stable order."""
    unknown = [t for t in targets if t not in LORA_MODULES]
    if unknown:
        raise ValueError(f"unknown LoRA target module(s) {unknown}; allowed: {sorted(LORA_MODULES)}")
    modules = {m for t in targets for m in LORA_MODULES[t]}
    return sorted(modules)


def module_regex(targets: list[str]) -> str:
    """The Qwix `module_path` regex adapting exactly these targets."""
    return _DECODER + "(?:" + "|".join(re.escape(m) for m in tunix_modules(targets)) + ")$"


ADAPTER_DTYPE = jnp.float32


class _Float32LoraProvider(qwix.LoraProvider):
    """Qwix LoRA whose float32 factors do not promote the projection's output: it stays in the
    dtype the base operation gives (bf16 when the base computes in bf16). The rank-r LoRA path
    itself runs in float32, a small cost next to the base projection."""

    def einsum(self, einsum_str: str, *operands: jax.Array, **kwargs) -> jax.Array:
        dtype = kwargs.get("preferred_element_type") or jnp.result_type(*operands)
        return super().einsum(einsum_str, *operands, **kwargs).astype(dtype)

    def dot_general(
        self,
        lhs: jax.Array,
        rhs: jax.Array,
        dimension_numbers,
        precision=None,
        preferred_element_type=None,
        out_sharding=None,
    ) -> jax.Array:
        dtype = preferred_element_type or jnp.result_type(lhs, rhs)
        return (
            super()
            .dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type, out_sharding=out_sharding)
            .astype(dtype)
        )


def apply_lora(model: nnx.Module, lora: LoraConfig, *, seed: int = 0) -> nnx.Module:
    """Wrap the target projections with LoRA (A random, B zero: the output is unchanged), the
    factors in float32."""
    provider = _Float32LoraProvider(
        module_path=module_regex(lora.target_modules), rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout
    )
    inputs = model.get_model_input()  # type: ignore[attr-defined]  # Tunix's models have it; nnx.Module does not declare it
    rngs = nnx.Rngs(params=seed, dropout=seed + 1)
    model = qwix.apply_lora_to_model(model, provider, rngs=rngs, skip_nnx_init=True, **inputs)
    _create_adapter(model, rngs, inputs)
    _PROVIDERS[model] = provider
    for _, var in nnx.iter_graph(model):
        if isinstance(var, nnx.LoRAParam):
            var.set_value(var.get_value().astype(ADAPTER_DTYPE))
    return model


def _create_adapter(model: nnx.Module, rngs: nnx.Rngs, inputs: dict) -> None:
    """Run the model once, compiled, so that Qwix creates the LoRA factors.

    Qwix creates them during a first call of the model; its own first call runs eagerly, which
    compiles each operation on its own (about 200 XLA programs for Gemma 4: 9 s of a 27 s tiny
    run on CPU, against 2 s for one compiled call). The factors come out the same: the same
    initialisers draw from the same `rngs` in the same order.
    """
    model.set_attributes(qwix_rngs=rngs, disable_quant_stats_update=True)
    nnx.jit(lambda m, kwargs: m(**kwargs))(model, inputs)
    model.set_attributes(qwix_rngs=None, disable_quant_stats_update=False)  # as Qwix leaves it


def lora_state(model: nnx.Module) -> nnx.State:
    """Only the LoRA parameters: what is trained and checkpointed."""
    return nnx.state(model, nnx.LoRAParam)


def lora_parameter_count(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(lora_state(model)))


_PROVIDERS: weakref.WeakKeyDictionary[nnx.Module, _Float32LoraProvider] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def dropout_off(model: nnx.Module) -> Iterator[None]:
    """Trace the model without LoRA dropout: Qwix applies it on every call whose rule has a rate
    (it has no deterministic mode), which would make an evaluation random. Programs traced inside
    keep it off; the training step, traced before, keeps it on."""
    provider = _PROVIDERS.get(model)
    if provider is None or not any(r.dropout for r in provider._rules):  # noqa: SLF001 (pinned qwix)
        yield
        return
    rules = provider._rules  # noqa: SLF001
    provider._rules = [dataclasses.replace(r, dropout=0.0) for r in rules]  # noqa: SLF001
    try:
        yield
    finally:
        provider._rules = rules  # noqa: SLF001


@contextlib.contextmanager
def adapter_off(model: nnx.Module) -> Iterator[None]:
    """The base model: every LoRA B factor zeroed, so each adapted projection adds exactly 0 to the
    base's output, then restored. Same shapes, so a program compiled for the model is reused."""
    state = lora_state(model)
    saved = jax.tree.map(lambda x: x, state)
    zeroed = jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.zeros_like(x) if "lora_b" in jax.tree_util.keystr(path) else x, state
    )
    nnx.update(model, zeroed)
    try:
        yield
    finally:
        nnx.update(model, saved)
