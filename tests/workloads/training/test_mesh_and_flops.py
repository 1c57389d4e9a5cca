"""Mesh shapes, fitting shardings to the mesh, and the FLOPs/MFU arithmetic."""

import jax
import pytest
from flax import nnx
from tunix.models.gemma4 import model as gemma4

from gemma_devcluster import tiny
from gemma_workloads.config import MeshConfig
from gemma_workloads.training import flops as metrics
from gemma_workloads.training import model_loader as model
from gemma_workloads.training.mesh import default_shape, fit_to_mesh, fitted_spec, make_mesh


def test_default_mesh_is_the_papers():
    assert {n: default_shape(n) for n in (1, 2, 4, 8, 16)} == {1: (1, 1), 2: (1, 2), 4: (1, 4), 8: (2, 4), 16: (4, 4)}


def test_mesh_must_match_the_devices():
    with pytest.raises(ValueError, match="mesh fsdp=2 x tp=4 needs 8 devices; there are 1"):
        make_mesh(MeshConfig(fsdp=2, tp=4))


def test_axes_that_do_not_divide_are_replicated():
    shape = {"fsdp": 2, "tp": 4}
    assert fitted_spec((2, 2, 96, 32), (None, "tp", "fsdp", None), shape) == (None, None, "fsdp", None)
    assert fitted_spec((8, 96), (("fsdp", "tp"), None), shape) == (("fsdp", "tp"), None)
    assert fitted_spec((4, 96), (("fsdp", "tp"), None), shape) == (None, None)


def test_tiny_model_on_tp4_replicates_its_small_kv_heads():
    cfg = model.tunix_config(tiny.TinyConfig().hf_config())
    abstract = nnx.eval_shape(lambda: gemma4.Gemma4(cfg, rngs=nnx.Rngs(0)))
    replicated = fit_to_mesh(abstract, jax.sharding.AbstractMesh((1, 4), ("fsdp", "tp")), place=False)
    assert replicated == ["layers/0/attn/kv_einsum/w axis 1 (2 over tp)", "layers/1/attn/k_einsum/w axis 0 (1 over tp)"]
    assert abstract.layers[0].attn.q_einsum.w.get_metadata("out_sharding") == ("tp", "fsdp", None)
    assert abstract.layers[0].attn.kv_einsum.w.get_metadata("out_sharding") == (None, None, "fsdp", None)


def test_31b_flops_and_the_papers_mfu():
    cfg = gemma4.ModelConfig.gemma4_31b()
    per_token = metrics.flops_per_token(cfg, seq_len=3072)
    # 30.7 B weights (the published size) x 4, plus attention over 3072 tokens (window 1024 on sliding layers).
    assert 30.6e9 * 4 < per_token < 30.8e9 * 4 * 1.1
    # The paper: 763 tokens/s on a v5p-8 (4 chips), "about 5 % MFU".
    assert 0.045 < metrics.mfu(763, per_token, 4, metrics.peak_tflops("TPU v5")) < 0.06
    assert metrics.flops_per_token(cfg, 3072, lora_params=1_000_000) - per_token == 6e6


def test_peak_table():
    assert metrics.peak_tflops("TPU v5 lite") == 197 and metrics.peak_tflops("TPU v5p") == 459
    assert metrics.peak_tflops("TPU v6 lite") == 918 and metrics.peak_tflops("NVIDIA H100 80GB HBM3") == 989
    assert metrics.peak_tflops("cpu") is None and metrics.mfu(100.0, 1e9, 1, None) is None


def test_sliding_window_attends_to_at_most_the_window():
    local, glob = gemma4.AttentionType.LOCAL_SLIDING, gemma4.AttentionType.GLOBAL
    assert metrics._attended(glob, 1024, 3072) == 1536.5
    assert metrics._attended(local, 1024, 512) == 256.5  # shorter than the window: plain causal
    # Exact mean over queries: min(t + 1, window) for t in 0..n-1.
    assert metrics._attended(local, 8, 20) == sum(min(t + 1, 8) for t in range(20)) / 20
