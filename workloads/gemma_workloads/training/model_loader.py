"""Gemma 4 from a Hugging Face checkpoint into Tunix's nnx model.

The architecture always comes from the checkpoint's `config.json` (a released multimodal config
nests it under `text_config`), so any Gemma 4 size loads, the tiny test models included. Tunix's
safetensors loader accepts the `model.language_model.` key prefix of released checkpoints; the
text-only export (`Gemma4ForCausalLM`) uses `model.`, which its mapping silently skips, so the
mapping is widened here to take both. The release's vision tower (and the smaller models' audio
tower) is left on disk: training adapts the text decoder only, and the merge copies the towers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
from etils import epath
from flax import nnx
from tunix.models import safetensors_loader
from tunix.models.gemma4 import model as gemma4
from tunix.models.gemma4 import params_safetensors

from gemma_workloads.training import remat
from gemma_workloads.training.mesh import fit_to_mesh

log = logging.getLogger(__name__)

DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}

# Towers beside the text decoder in the multimodal checkpoints: never loaded.
TOWER_PREFIXES = ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio.")
_TUNIX_PREFIX = r"(?:model\.language_model\.)?"
_ANY_PREFIX = r"(?:model\.(?:language_model\.)?)?"


def read_hf_config(path: str) -> dict[str, Any]:
    """The text decoder's config.json (local path or gs://)."""
    config = json.loads((epath.Path(path) / "config.json").read_text())
    return config.get("text_config", config)


def _attention_pattern(layer_types: list[str]) -> tuple[gemma4.AttentionType, ...]:
    kinds = {"sliding_attention": gemma4.AttentionType.LOCAL_SLIDING, "full_attention": gemma4.AttentionType.GLOBAL}
    try:
        return tuple(kinds[t] for t in layer_types)
    except KeyError as e:
        raise ValueError(f"config.json: unknown layer type {e.args[0]!r}; expected {sorted(kinds)}") from None


def tunix_config(hf: dict[str, Any], *, dtype: str = "float32") -> gemma4.ModelConfig:
    """Tunix's ModelConfig for a Hugging Face Gemma 4 text config."""
    rope = hf.get("rope_parameters") or {}
    full_rope, local_rope = rope.get("full_attention", {}), rope.get("sliding_attention", {})
    layers = hf["num_hidden_layers"]
    moe = bool(hf.get("enable_moe_block"))
    jdtype = DTYPES[dtype]
    return gemma4.ModelConfig(
        num_layers=layers,
        num_embed=hf["vocab_size"],
        embed_dim=hf["hidden_size"],
        hidden_dim=hf["intermediate_size"],
        num_heads=hf["num_attention_heads"],
        head_dim=hf["head_dim"],
        num_kv_heads=hf["num_key_value_heads"],
        num_global_kv_heads=hf.get("num_global_key_value_heads"),
        global_key_size=hf.get("global_head_dim") or hf["head_dim"],
        final_logit_softcap=hf.get("final_logit_softcapping"),
        sliding_window_size=hf.get("sliding_window"),
        per_layer_input_dim=hf.get("hidden_size_per_layer_input") or 0,
        attention_pattern=_attention_pattern(hf["layer_types"]),
        frac_shared_layers=(hf.get("num_kv_shared_layers") or 0) / layers,
        override_kv_shared_ffw_hidden=hf["intermediate_size"] * 2 if hf.get("use_double_wide_mlp") else None,
        k_eq_v_global=bool(hf.get("attention_k_eq_v")),
        local_base_frequency=int(local_rope.get("rope_theta", 10_000)),
        global_base_frequency=int(full_rope.get("rope_theta", 1_000_000)),
        local_rope_proportion=local_rope.get("partial_rotary_factor", 1.0),
        global_rope_proportion=full_rope.get("partial_rotary_factor", 0.25),
        enable_moe=moe,
        num_experts=hf.get("num_experts") if moe else None,
        num_experts_per_tok=hf.get("top_k_experts") if moe else None,
        expert_dim=hf.get("moe_intermediate_size") if moe else None,
        moe_dense_hidden_dim=hf["intermediate_size"] if moe else None,
        param_dtype=jdtype,
        dtype=jdtype,
    )


def _key_mapping(cfg: gemma4.ModelConfig) -> dict:
    """Tunix's HF-name -> nnx-path mapping, widened to the text-only `model.` prefix."""
    mapping = params_safetensors._get_key_and_transform_mapping(cfg)  # noqa: SLF001 (pinned tunix)
    return {
        re.sub(re.escape(_TUNIX_PREFIX), lambda _: _ANY_PREFIX, pattern): target for pattern, target in mapping.items()
    }


def load_model(
    path: str,
    *,
    dtype: str = "float32",
    mesh: jax.sharding.Mesh | None = None,
    hf_config: dict | None = None,
) -> tuple[gemma4.Gemma4, gemma4.ModelConfig]:
    """Build Tunix's Gemma 4 from an HF checkpoint directory (sharded or single file).

    With a mesh, every weight is placed on it as Tunix annotates it, except for axes that do not
    divide the mesh: those are replicated (see `mesh.fit_to_mesh`).
    """
    config = tunix_config(hf_config or read_hf_config(path), dtype=dtype)

    def build(cfg: gemma4.ModelConfig, *, rngs: nnx.Rngs) -> gemma4.Gemma4:
        model = gemma4.Gemma4(cfg, rngs=rngs)
        if mesh is not None:
            fit_to_mesh(model, mesh, place=False)
        return model

    try:
        with _towers_skipped_quietly(path):
            model = safetensors_loader.load_and_create_model(
                file_dir=path,
                model_class=build,
                config=config,
                key_mapping=_key_mapping,
                mesh=mesh,
                preprocess_fn=params_safetensors._make_preprocess_fn(config),  # noqa: SLF001
                dtype=DTYPES[dtype],
            )
    except Exception as e:  # the loader's own errors do not say which checkpoint
        raise RuntimeError(f"cannot load the safetensors of {path}: {type(e).__name__}: {e}") from e
    return model, config


class _TowerSkips(logging.Filter):
    """Drops Tunix's warning about unmapped keys when they are all tower tensors, counting them."""

    def __init__(self) -> None:
        super().__init__()
        self.towers: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Skipped loading") or len(record.args or ()) != 2:
            return True
        keys = set(str(record.args[1]).split(", "))  # type: ignore[index]  # two positional args: checked above
        if not all(k.startswith(TOWER_PREFIXES) for k in keys):
            return True  # anything else unmapped is worth the warning
        self.towers |= keys
        return False


@contextlib.contextmanager
def _towers_skipped_quietly(path: str) -> Iterator[None]:
    """Tunix warns once per file, naming every skipped key so far (356 vision tensors for the
    31B release): one line says it instead."""
    absl = logging.getLogger("absl")
    skips = _TowerSkips()
    absl.addFilter(skips)
    try:
        yield
    finally:
        absl.removeFilter(skips)
    if skips.towers:
        log.info(
            "%s: left %d vision/audio tower tensors unloaded (training adapts the text decoder)",
            path,
            len(skips.towers),
        )


def set_remat(model: gemma4.Gemma4, on: bool) -> None:
    """Rematerialise each decoder layer in the backward pass (the seed paper's memory saving).

    Switch it on only after LoRA is applied: Qwix creates its parameters in a first forward pass,
    and parameters created inside `nnx.remat` are silently lost.
    """
    remat.use_remat(model, "full" if on else "none")
