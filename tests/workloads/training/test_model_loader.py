"""Tunix's Gemma 4, loaded from HF safetensors, computes what transformers computes."""

import logging

import jax.numpy as jnp
import numpy as np
import pytest

from gemma_devcluster import tiny
from gemma_workloads.config import LoraConfig
from gemma_workloads.training import lora
from gemma_workloads.training import model_loader as model


def tunix_logits(m, ids: np.ndarray) -> np.ndarray:
    t = ids.shape[1]
    positions = jnp.tile(jnp.arange(t)[None], (ids.shape[0], 1))
    mask = jnp.tril(jnp.ones((ids.shape[0], t, t), dtype=bool))
    logits, _ = m(jnp.asarray(ids), positions, None, mask)
    return np.asarray(logits)


def hf_logits(path, ids: np.ndarray) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    hf, info = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        return hf(torch.tensor(ids)).logits.numpy()


@pytest.mark.parametrize("checkpoint", ["tiny_sharded", "tiny_single"])
def test_logits_match_transformers(request, checkpoint, token_ids, caplog):
    """Both layouts: text-only (`model.`), and the release's Gemma4ForConditionalGeneration with
    a vision tower, which transformers loads whole and Tunix's loader leaves on disk, quietly."""
    ckpt = request.getfixturevalue(checkpoint)
    with caplog.at_level(logging.INFO):
        m, _ = model.load_model(str(ckpt.path), dtype="float32")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "loading must not warn"
    towers = [k for k in _tensor_names(ckpt.path) if k.startswith(tiny.VISION_PREFIXES)]
    assert bool(towers) == (checkpoint == "tiny_single")
    if towers:
        assert f"left {len(towers)} vision/audio tower tensors unloaded" in caplog.text
    ours, ref = tunix_logits(m, token_ids), hf_logits(ckpt.path, token_ids)
    assert np.abs(ours - ref).max() <= 1e-5
    assert np.abs(ref).max() > 0.1, "logits too small for the comparison to mean anything"


def _tensor_names(path) -> list[str]:
    from safetensors import safe_open

    names = []
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), "numpy") as st:
            names += list(st.keys())
    return names


def test_config_comes_from_config_json(tiny_sharded):
    cfg = model.tunix_config(model.read_hf_config(str(tiny_sharded.path)))
    assert (cfg.num_layers, cfg.embed_dim, cfg.num_heads, cfg.global_key_size) == (2, 96, 4, 64)
    assert cfg.k_eq_v_global and cfg.num_global_kv_heads == 1 and cfg.final_logit_softcap == 30.0
    assert [t.name for t in cfg.attention_pattern] == ["LOCAL_SLIDING", "GLOBAL"]


def test_unknown_layer_type_is_named():
    with pytest.raises(ValueError, match="unknown layer type 'chunked_attention'"):
        model._attention_pattern(["sliding_attention", "chunked_attention"])


def test_lora_regex_targets_decoder_projections_only():
    regex = lora.module_regex(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    import re

    for path in [
        "layers/0/attn/q_einsum",
        "layers/5/attn/k_einsum",
        "layers/0/attn/kv_einsum",
        "layers/1/attn/attn_vec_einsum",
        "layers/3/mlp/down_proj",
    ]:
        assert re.fullmatch(regex, path), path
    for path in ["vision_encoder/layers/0/mlp/up_proj_x", "embedder/input_embedding", "layers/0/attn/q_einsum_2"]:
        assert not re.fullmatch(regex, path), path
    assert lora.tunix_modules(["q_proj"]) == ["q_einsum"]
    assert lora.tunix_modules(["k_proj", "v_proj"]) == ["k_einsum", "kv_einsum"]
    with pytest.raises(ValueError, match="unknown LoRA target"):
        lora.tunix_modules(["qkv"])


def test_lora_adapts_every_target_and_starts_as_identity(tiny_sharded, token_ids):
    m, _ = model.load_model(str(tiny_sharded.path))
    base = tunix_logits(m, token_ids)
    m = lora.apply_lora(m, LoraConfig(rank=4, alpha=8.0))
    np.testing.assert_array_equal(tunix_logits(m, token_ids), base)
    state = lora.lora_state(m).to_pure_dict()
    adapted = {
        (layer, part, mod) for layer, parts in state["layers"].items() for part, mods in parts.items() for mod in mods
    }
    assert (1, "attn", "k_einsum") in adapted, "the global layer's keys must be adapted"
    assert (0, "attn", "kv_einsum") in adapted
    assert len(adapted) == 12  # 6 modules x 2 layers
    assert lora.lora_parameter_count(m) == 13056
