"""Tunix LoRA parameters -> deltas of the Hugging Face Gemma 4 tensors they adapt.

Qwix factors an adapted einsum weight into A, holding the weight's axes shared with the input,
and B, holding the rest: q_einsum `NDH` gives A (D, r), B (r, N, H); attn_vec_einsum `NHD` gives
A (N, H, r), B (r, D); an nnx.Linear kernel (in, out) gives A (in, r), B (r, out). HF stores the
same weights as [out, in] with heads flattened head-major (row `n * H + h`), so, flattened, A is
(in, r) and B is (r, out) for every module, and every delta is `(alpha / rank) * B.T @ A.T`.
The one exception: kv_einsum's B (r, 2, K, H) carries keys and values, split into k_proj and v_proj.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from gemma_workloads.config import LoraConfig

# Tunix module -> (HF tensor under `layers.<i>.`, index on kv_einsum's K/V axis or None).
HF_TENSORS: dict[str, tuple[tuple[str, int | None], ...]] = {
    "q_einsum": (("self_attn.q_proj.weight", None),),
    "kv_einsum": (("self_attn.k_proj.weight", 0), ("self_attn.v_proj.weight", 1)),
    "k_einsum": (("self_attn.k_proj.weight", None),),
    "attn_vec_einsum": (("self_attn.o_proj.weight", None),),
    "gate_proj": (("mlp.gate_proj.weight", None),),
    "up_proj": (("mlp.up_proj.weight", None),),
    "down_proj": (("mlp.down_proj.weight", None),),
}
_PARAM = re.compile(r"layers/(\d+)/(attn|mlp)/(\w+)/(?:w|kernel)_lora_([ab])")
# The text decoder's keys: `model.language_model.layers...` (released) or `model.layers...` (text-only).
_DECODER_KEY = re.compile(r"(model\.(?:language_model\.)?)(layers\.\d+\..+)")


class LoraMappingError(ValueError):
    """A LoRA parameter or shape the merge cannot map; the message names it."""


@dataclass(frozen=True)
class Delta:
    """`scale * b.T @ a.T` ([out, in]), kept factored: rows are computed on demand."""

    a: np.ndarray  # (in, r)
    b: np.ndarray  # (r, out)
    scale: float
    source: str  # the Tunix module path, for messages

    @property
    def shape(self) -> tuple[int, int]:
        return self.b.shape[1], self.a.shape[0]

    def factors(self) -> LoadedDelta:
        """float32, contiguous, the scale folded into B: what `rows` multiplies, made once per tensor."""
        bt = np.ascontiguousarray(self.b.T, dtype=np.float32) * np.float32(self.scale)
        return LoadedDelta(bt, np.ascontiguousarray(self.a.T, dtype=np.float32))


@dataclass(frozen=True)
class LoadedDelta:
    bt: np.ndarray  # (out, r), scaled
    at: np.ndarray  # (r, in)

    def rows(self, start: int, stop: int, out: np.ndarray) -> None:
        np.matmul(self.bt[start:stop], self.at, out=out)


def lora_modules(tree: dict[str, Any]) -> dict[tuple[int, str], dict[str, np.ndarray]]:
    """(layer, Tunix module) -> {"a": A, "b": B} from a LoRA state tree: the pure dict, or the
    nnx.State that Tunix's checkpoint manager saves (each leaf under an extra `value` key)."""
    modules: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for path, leaf in _leaves(tree):
        key = "/".join(p for p in path if p != "value")
        m = _PARAM.fullmatch(key)
        if not m or m.group(3) not in HF_TENSORS:
            raise LoraMappingError(
                f"LoRA parameter {key}: not a Gemma 4 decoder projection the merge knows ({sorted(HF_TENSORS)})"
            )
        modules.setdefault((int(m.group(1)), m.group(3)), {})[m.group(4)] = np.asarray(leaf)
    for (layer, module), ab in modules.items():
        if set(ab) != {"a", "b"}:
            raise LoraMappingError(f"LoRA module layers/{layer}/{module}: has {sorted(ab)} of its A and B")
    return modules


def _leaves(tree: Any, path: tuple[str, ...] = ()):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, (*path, str(k)))
    else:
        yield path, tree


def deltas(tree: dict[str, Any], lora: LoraConfig) -> dict[str, Delta]:
    """Decoder-relative HF tensor name (`layers.3.self_attn.q_proj.weight`) -> its delta."""
    rank = lora.rank
    out: dict[str, Delta] = {}
    for (layer, module), ab in sorted(lora_modules(tree).items()):
        source = f"layers/{layer}/{module}"
        a, b = ab["a"], ab["b"]
        if a.shape[-1] != rank or b.shape[0] != rank:
            raise LoraMappingError(f"LoRA {source}: A {a.shape} and B {b.shape} do not have rank {rank}")
        a2 = a.reshape(-1, rank)
        for suffix, kv in HF_TENSORS[module]:
            if kv is not None and (b.ndim != 4 or b.shape[1] != 2):
                raise LoraMappingError(f"LoRA {source}: B {b.shape} is not (rank, 2, heads, head_dim)")
            b2 = (b if kv is None else b[:, kv]).reshape(rank, -1)
            out[f"layers.{layer}.{suffix}"] = Delta(a2, b2, lora.scale, source)
    return out


def decoder_names(base_names: list[str]) -> dict[str, str]:
    """Decoder-relative name -> the base checkpoint's key, for either key layout."""
    out: dict[str, str] = {}
    for name in base_names:
        m = _DECODER_KEY.fullmatch(name)
        if m:
            if m.group(2) in out:
                raise LoraMappingError(
                    f"base checkpoint has both {out[m.group(2)]} and {name}: which one to merge into?"
                )
            out[m.group(2)] = name
    return out
