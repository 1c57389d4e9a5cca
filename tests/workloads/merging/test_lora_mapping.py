"""Tunix LoRA -> HF deltas, checked against the einsums Qwix computes, module by module."""

import numpy as np
import pytest

from gemma_devcluster import tiny
from gemma_workloads.config import LoraConfig
from gemma_workloads.merging import lora_mapping

N, K, H, D, F, R = 4, 2, 8, 24, 40, 3  # heads, kv heads, head dim, embed, mlp, rank
SCALE = 2.0
rng = np.random.default_rng(0)


def ab(a_shape, b_shape):
    return rng.standard_normal(a_shape).astype(np.float32), rng.standard_normal(b_shape).astype(np.float32)


def hf_delta(tree, name) -> np.ndarray:
    delta = lora_mapping.deltas(tree, LoraConfig(rank=R, alpha=R * SCALE))[name]
    out = np.empty(delta.shape, np.float32)
    delta.factors().rows(0, delta.shape[0], out)
    return out


def close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def lora(module, part, a, b, layer=0):
    w = "w" if part == "attn" else "kernel"
    return {"layers": {layer: {part: {module: {f"{w}_lora_a": a, f"{w}_lora_b": b}}}}}


def test_q_einsum_rows_are_head_major():
    a, b = ab((D, R), (R, N, H))
    weight_delta = np.einsum("dr,rnh->ndh", a, b) * SCALE  # the `NDH` einsum weight's delta
    hf = weight_delta.transpose(0, 2, 1).reshape(N * H, D)  # HF q_proj row n*H+h, column d
    close(hf_delta(lora("q_einsum", "attn", a, b), "layers.0.self_attn.q_proj.weight"), hf)


def test_kv_einsum_splits_into_k_and_v():
    a, b = ab((D, R), (R, 2, K, H))
    weight_delta = np.einsum("dr,rckh->ckdh", a, b) * SCALE  # `CKDH`
    tree = lora("kv_einsum", "attn", a, b)
    for c, name in enumerate(["k_proj", "v_proj"]):
        hf = weight_delta[c].transpose(0, 2, 1).reshape(K * H, D)
        close(hf_delta(tree, f"layers.0.self_attn.{name}.weight"), hf)


def test_k_einsum_of_global_layers_is_k_proj_only():
    a, b = ab((D, R), (R, K, H))
    hf = (np.einsum("dr,rkh->kdh", a, b) * SCALE).transpose(0, 2, 1).reshape(K * H, D)
    deltas = lora_mapping.deltas(lora("k_einsum", "attn", a, b, layer=5), LoraConfig(rank=R, alpha=R * SCALE))
    assert list(deltas) == ["layers.5.self_attn.k_proj.weight"]
    close(hf_delta(lora("k_einsum", "attn", a, b, 5), "layers.5.self_attn.k_proj.weight"), hf)


def test_attn_vec_einsum_is_o_proj():
    a, b = ab((N, H, R), (R, D))
    weight_delta = np.einsum("nhr,rd->nhd", a, b) * SCALE  # `NHD`
    hf = weight_delta.reshape(N * H, D).T  # HF o_proj [D, N*H]
    close(hf_delta(lora("attn_vec_einsum", "attn", a, b), "layers.0.self_attn.o_proj.weight"), hf)


@pytest.mark.parametrize("module,din,dout", [("gate_proj", D, F), ("up_proj", D, F), ("down_proj", F, D)])
def test_mlp_kernels_are_transposed(module, din, dout):
    a, b = ab((din, R), (R, dout))
    hf = (a @ b * SCALE).T  # nnx.Linear kernel (in, out) -> HF [out, in]
    close(hf_delta(lora(module, "mlp", a, b), f"layers.0.mlp.{module}.weight"), hf)


def test_ranks_beyond_the_small_int_cache_map():
    """LoraRank allows up to 1024; CPython shares int objects only up to 256, so the rank check must
    compare values, not identities."""
    rank = 512
    a, b = ab((D, rank), (rank, F))
    delta = lora_mapping.deltas(lora("up_proj", "mlp", a, b), LoraConfig(rank=rank, alpha=rank * SCALE))
    out = np.empty((F, D), np.float32)
    delta["layers.0.mlp.up_proj.weight"].factors().rows(0, F, out)
    np.testing.assert_allclose(out, (a @ b * SCALE).T, rtol=1e-4, atol=1e-3)


def test_rows_in_blocks_equal_the_whole():
    a, b = ab((D, R), (R, F))
    factors = lora_mapping.deltas(lora("up_proj", "mlp", a, b), LoraConfig(rank=R, alpha=R * SCALE))[
        "layers.0.mlp.up_proj.weight"
    ].factors()
    whole, part = np.empty((F, D), np.float32), np.empty((7, D), np.float32)
    factors.rows(0, F, whole)
    factors.rows(10, 17, part)
    np.testing.assert_array_equal(part, whole[10:17])


def test_tunix_checkpoint_layout_with_value_leaves_and_string_layers():
    """Tunix's checkpoint manager saves nnx.State: layers keyed by strings, each leaf under `value`
    (a key read from the checkpoint's metadata: equal to "value", not the same object)."""
    a, b = ab((D, R), (R, F))
    value = "".join(["val", "ue"])
    saved = {"layers": {"3": {"mlp": {"up_proj": {"kernel_lora_a": {value: a}, "kernel_lora_b": {value: b}}}}}}
    np.testing.assert_array_equal(
        hf_delta(saved, "layers.3.mlp.up_proj.weight"),
        hf_delta(lora("up_proj", "mlp", a, b, 3), "layers.3.mlp.up_proj.weight"),
    )


def test_every_module_of_a_real_gemma4_lora_maps(lora_run):
    """The shapes `tiny.lora_shapes` writes for big synthetic checkpoints are Qwix's own."""
    state = lora_run[2]
    real = {
        f"layers/{i}/{part}/{module}": {p: v.shape for p, v in params.items()}
        for i, parts in state["layers"].items()
        for part, modules in parts.items()
        for module, params in modules.items()
    }
    assert real == tiny.lora_shapes(tiny.TinyConfig(), 4)
    shapes = tiny.TinyConfig().tensor_shapes(prefix="")
    for name, delta in lora_mapping.deltas(state, LoraConfig(rank=4, alpha=8.0)).items():
        assert delta.shape == shapes[name], name


@pytest.mark.parametrize(
    "tree,message",
    [
        (
            {"vision_encoder": {"proj": {"w_lora_a": np.zeros((2, R))}}},
            "LoRA parameter vision_encoder/proj/w_lora_a: not a Gemma 4",
        ),
        (lora("qkv_einsum", "attn", *ab((D, R), (R, F))), "LoRA parameter layers/0/attn/qkv_einsum/w_lora_a"),
        (
            {"layers": {0: {"mlp": {"up_proj": {"kernel_lora_a": np.zeros((D, R))}}}}},
            "layers/0/up_proj: has ['a'] of its A and B",
        ),
        (
            lora("up_proj", "mlp", *ab((D, R + 1), (R + 1, F))),
            "LoRA layers/0/up_proj: A (24, 4) and B (4, 40) do not have rank 3",
        ),
        # one factor of the wrong rank is enough: the other would reshape into a wrong delta
        (
            lora("up_proj", "mlp", *ab((D, R + 1), (R, F))),
            "LoRA layers/0/up_proj: A (24, 4) and B (3, 40) do not have rank 3",
        ),
        (
            lora("up_proj", "mlp", *ab((D, R - 1), (R, F))),
            "LoRA layers/0/up_proj: A (24, 2) and B (3, 40) do not have rank 3",
        ),
        (
            lora("up_proj", "mlp", *ab((D, R), (R + 1, F))),
            "LoRA layers/0/up_proj: A (24, 3) and B (4, 40) do not have rank 3",
        ),
        (
            lora("up_proj", "mlp", *ab((D, R), (R - 1, F))),
            "LoRA layers/0/up_proj: A (24, 3) and B (2, 40) do not have rank 3",
        ),
        # kv_einsum's B must carry the K/V axis to be split into k_proj and v_proj
        (
            lora("kv_einsum", "attn", *ab((D, R), (R, K, H))),
            "LoRA layers/0/kv_einsum: B (3, 2, 8) is not (rank, 2, heads, head_dim)",
        ),
        (
            lora("kv_einsum", "attn", *ab((D, R), (R, 3, K, H))),
            "LoRA layers/0/kv_einsum: B (3, 3, 2, 8) is not (rank, 2, heads, head_dim)",
        ),
        (
            lora("kv_einsum", "attn", *ab((D, R), (R, 1, K, H))),
            "LoRA layers/0/kv_einsum: B (3, 1, 2, 8) is not (rank, 2, heads, head_dim)",
        ),
    ],
)
def test_unmappable_parameters_are_named(tree, message):
    with pytest.raises(
        lora_mapping.LoraMappingError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
    ):
        lora_mapping.deltas(tree, LoraConfig(rank=R, alpha=R * SCALE))


def test_decoder_names_take_both_key_layouts():
    names = lora_mapping.decoder_names(
        [
            "model.layers.0.mlp.up_proj.weight",
            "model.language_model.layers.1.mlp.up_proj.weight",
            "model.vision_tower.encoder.layers.0.mlp.up_proj.weight",
            "model.embed_tokens.weight",
        ]
    )
    assert names == {
        "layers.0.mlp.up_proj.weight": "model.layers.0.mlp.up_proj.weight",
        "layers.1.mlp.up_proj.weight": "model.language_model.layers.1.mlp.up_proj.weight",
    }
    with pytest.raises(
        lora_mapping.LoraMappingError, match="both model.layers.0.x and model.language_model.layers.0.x"
    ):
        lora_mapping.decoder_names(["model.layers.0.x", "model.language_model.layers.0.x"])
