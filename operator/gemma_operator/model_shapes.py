"""Gemma 4 model shapes, for planning only (HBM fit, merge memory, cost).

Sizes are data, as in Tunix's `ModelConfig.gemma4_*` presets (the source of these numbers); the
parameter counts are those measured with `nnx.eval_shape` on the text models. The operator never
reads a checkpoint: the workloads take the real architecture from `config.json`.
"""

from __future__ import annotations

import collections
import functools
import re
from dataclasses import dataclass

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class ModelShape:
    preset: str
    params: float  # text decoder parameters
    layers: int
    embed_dim: int
    mlp_dim: int
    heads: int
    head_dim: int
    kv_heads: int
    global_kv_heads: int
    global_head_dim: int
    vocab: int
    sliding_window: int
    local_per_global: int = 5  # the 5 sliding : 1 global pattern
    k_eq_v_global: bool = True
    moe: bool = False
    # Parameters beside the text decoder in the released checkpoint (the vision tower and its
    # embedder): staged and read with it, though training ignores them. 0 where unknown.
    vision_params: float = 0.0

    @property
    def global_layers(self) -> int:
        return self.layers // (self.local_per_global + 1)

    @property
    def sliding_layers(self) -> int:
        return self.layers - self.global_layers

    def projection_shapes(self) -> dict[str, list[tuple[int, int]]]:
        """(in, out) of every adaptable projection, per HF target name, over all layers."""
        d, s, g = self.embed_dim, self.sliding_layers, self.global_layers
        q_s, q_g = self.heads * self.head_dim, self.heads * self.global_head_dim
        kv_s, kv_g = self.kv_heads * self.head_dim, self.global_kv_heads * self.global_head_dim
        return {
            "q_proj": [(d, q_s)] * s + [(d, q_g)] * g,
            "k_proj": [(d, kv_s)] * s + [(d, kv_g)] * g,
            "v_proj": [(d, kv_s)] * s + ([] if self.k_eq_v_global else [(d, kv_g)] * g),
            "o_proj": [(q_s, d)] * s + [(q_g, d)] * g,
            "gate_proj": [(d, self.mlp_dim)] * self.layers,
            "up_proj": [(d, self.mlp_dim)] * self.layers,
            "down_proj": [(self.mlp_dim, d)] * self.layers,
        }

    @functools.cached_property
    def _distinct_shapes(self) -> dict[str, collections.Counter[tuple[int, int]]]:
        """projection_shapes() as how many layers have each shape: a few entries, not one per layer."""
        return {target: collections.Counter(shapes) for target, shapes in self.projection_shapes().items()}

    def lora_params(self, rank: int, targets: list[str]) -> int:
        shapes = self._distinct_shapes
        return sum(rank * (i + o) * n for t in targets for (i, o), n in shapes[t].items())

    def largest_target_elements(self, targets: list[str]) -> int:
        shapes = self._distinct_shapes
        return max((i * o for t in targets for i, o in shapes[t]), default=0)

    def largest_tensor_elements(self) -> int:
        return max(self.vocab * self.embed_dim, self.largest_target_elements(list(self.projection_shapes())))

    def checkpoint_bytes(self, dtype_bytes: int = 2) -> float:
        """Size of the released safetensors (bf16 by default), vision tower included."""
        return (self.params + self.vision_params) * dtype_bytes

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6N for the matmuls (LoRA adds little)."""
        return 6.0 * self.params

    def forward_flops_per_token(self) -> float:
        """FLOPs per token of a forward pass alone: 2N, one multiply-add per parameter."""
        return 2.0 * self.params


PRESETS: dict[str, ModelShape] = {
    "gemma4-31b": ModelShape(
        "gemma4-31b",
        30.70e9,
        layers=60,
        embed_dim=5376,
        mlp_dim=21504,
        heads=32,
        head_dim=256,
        kv_heads=16,
        global_kv_heads=4,
        global_head_dim=512,
        vocab=262144,
        sliding_window=1024,
        vision_params=0.55e9,  # the release's 62.5 GB of bf16 (seed paper) less the text decoder
    ),
    "gemma4-26b-a4b": ModelShape(
        "gemma4-26b-a4b",
        25.23e9,
        layers=30,
        embed_dim=2816,
        mlp_dim=2112,
        heads=16,
        head_dim=256,
        kv_heads=8,
        global_kv_heads=2,
        global_head_dim=512,
        vocab=262144,
        sliding_window=1024,
        moe=True,
    ),
    "gemma4-e4b": ModelShape(
        "gemma4-e4b",
        7.52e9,
        layers=42,
        embed_dim=2560,
        mlp_dim=10240,
        heads=8,
        head_dim=256,
        kv_heads=2,
        global_kv_heads=2,
        global_head_dim=512,
        vocab=262144,
        sliding_window=512,
        k_eq_v_global=False,
    ),
    "gemma4-e2b": ModelShape(
        "gemma4-e2b",
        4.65e9,
        layers=35,
        embed_dim=1536,
        mlp_dim=6144,
        heads=8,
        head_dim=256,
        kv_heads=1,
        global_kv_heads=1,
        global_head_dim=512,
        vocab=262144,
        sliding_window=512,
        local_per_global=4,
        k_eq_v_global=False,
    ),
    # The test model built by gemma_devcluster.tiny (2 layers: one sliding, one global).
    "tiny": ModelShape(
        "tiny",
        0.3e6,
        layers=2,
        embed_dim=96,
        mlp_dim=192,
        heads=4,
        head_dim=32,
        kv_heads=2,
        global_kv_heads=1,
        global_head_dim=64,
        vocab=512,
        sliding_window=16,
        local_per_global=1,
    ),
}

_REPO_PRESETS = [
    (re.compile(r"gemma-?4-31b", re.I), "gemma4-31b"),
    (re.compile(r"gemma-?4-26b-a4b", re.I), "gemma4-26b-a4b"),
    (re.compile(r"gemma-?4-e4b", re.I), "gemma4-e4b"),
    (re.compile(r"gemma-?4-e2b", re.I), "gemma4-e2b"),
]


# The repository names infer_preset knows, as a user would write them.
KNOWN_REPO_NAMES = ("gemma-4-31B", "gemma-4-26B-A4B", "gemma-4-E4B", "gemma-4-E2B")
# Hugging Face owners whose Gemma repositories are gated: a download needs the token of an account
# that accepted the licence on the model's page.
GATED_HF_OWNERS = frozenset({"google"})


def infer_preset(hf_repo: str | None) -> str | None:
    """The preset of a known Hugging Face repo id (google/gemma-4-31B-it -> gemma4-31b)."""
    if not hf_repo:
        return None
    for pattern, preset in _REPO_PRESETS:
        if pattern.search(hf_repo):
            return preset
    return None
