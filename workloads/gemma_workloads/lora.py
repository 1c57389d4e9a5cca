"""Qwix LoRA on Gemma 4's projections, named the Hugging Face way.

Users name targets as in HF (`q_proj`, `k_proj`, ...); Tunix's modules are einsums
(`q_einsum`, the fused `kv_einsum` of sliding layers, `k_einsum` of the global K=V layers,
`attn_vec_einsum`) and the MLP's `gate_proj`/`up_proj`/`down_proj`. `k_proj` maps to both
`kv_einsum` and `k_einsum`, so the global layers' keys are adapted too (the seed paper's regex
missed them).
"""

from __future__ import annotations

import re

import jax
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


def apply_lora(model: nnx.Module, lora: LoraConfig, *, seed: int = 0) -> nnx.Module:
    """Wrap the target projections with LoRA (A random, B zero: the output is unchanged)."""
    provider = qwix.LoraProvider(
        module_path=module_regex(lora.target_modules), rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout
    )
    inputs = model.get_model_input()
    return qwix.apply_lora_to_model(model, provider, rngs=nnx.Rngs(params=seed, dropout=seed + 1), **inputs)


def lora_state(model: nnx.Module) -> nnx.State:
    """Only the LoRA parameters: what is trained and checkpointed."""
    return nnx.state(model, nnx.LoRAParam)


def lora_parameter_count(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(lora_state(model)))
