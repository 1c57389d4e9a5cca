"""The HBM fit for Gemma 4 31B worked out by hand, each term written out from the model's published
shape (Tunix's `ModelConfig.gemma4_31b`: 60 layers, 50 sliding and 10 global, d 5376, MLP 21504,
32 heads of 256 (512 on global layers), 16 KV heads on sliding layers, 4 on global ones with K = V,
vocab 262144, window 1024), so that every term of fit.py is pinned, and cases at the limits."""

from __future__ import annotations

import pytest

from gemma_operator import fit
from gemma_operator.model_shapes import PRESETS

G31 = PRESETS["gemma4-31b"]
GIB = 2**30
ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# LoRA parameters per unit of rank: rank x (in + out) per adapted projection.
LORA_PER_RANK = {
    "q_proj": 50 * (5376 + 32 * 256) + 10 * (5376 + 32 * 512),  # 896,000
    "k_proj": 50 * (5376 + 16 * 256) + 10 * (5376 + 4 * 512),  # 547,840
    "v_proj": 50 * (5376 + 16 * 256),  # 473,600: global layers use K as V
    "o_proj": 50 * (32 * 256 + 5376) + 10 * (32 * 512 + 5376),  # 896,000
    "gate_proj": 60 * (5376 + 21504),  # 1,612,800
    "up_proj": 60 * (5376 + 21504),
    "down_proj": 60 * (21504 + 5376),
}


def test_lora_parameters_by_hand():
    assert sum(LORA_PER_RANK.values()) == 7_651_840
    assert G31.lora_params(16, ALL_TARGETS) == 16 * 7_651_840
    assert G31.lora_params(8, ["q_proj", "v_proj"]) == 8 * (896_000 + 473_600)


def test_training_31b_on_v5p_8_by_hand():
    """v5p-8 (4 chips of 95 GiB), mesh fsdp 1 x tp 4, micro-batch 1 of 2048 tokens, LoRA rank 16 on
    every projection, bf16 weights, whole-layer remat."""
    e = fit.training_memory(
        G31,
        dtype="bfloat16",
        fsdp=1,
        tp=4,
        micro_batch=1,
        seq_len=2048,
        lora_rank=16,
        lora_targets=ALL_TARGETS,
        remat=True,
        hbm_gib=95.0,
        usable_fraction=0.9,
    )
    tokens, b, tp = 2048, 2, 4
    weights = 30.70e9 * b / 4  # every weight, sharded over the 4 chips
    lora_adam = 16 * 7_651_840 * 4 * 4 / tp  # float32 parameter, gradient and two Adam moments, over tp
    per_layer = tokens * (34 * 5376 + 5 * 32 * 2048) * b / tp  # Korthikanti et al.: 34 d + 5 heads seq
    inputs = tokens * 5376 * b * 60  # every layer's input, kept for the backward pass
    dots = tokens * (2 * 32 * 256 + 2 * 16 * 256 + 2 * 5376 + 2 * 21504) * b / tp * 60  # q, k, v, o, gate, up, down
    logits = tokens * 262144 * 4 * 2 / tp  # float32 logits and their gradient
    assert (weights, lora_adam, per_layer, inputs, dots, logits) == (
        15.35e9,
        489_717_760,
        522_715_136,
        1_321_205_760,
        4_812_963_840,
        1_073_741_824,
    )
    assert e.parts == pytest.approx(
        {"weights": weights, "lora+adam": lora_adam, "activations": inputs + per_layer, "logits": logits, "xla": GIB}
    )
    assert e.activations_by_remat == pytest.approx(
        {"none": 60 * per_layer, "dots": inputs + dots + per_layer, "full": inputs + per_layer}
    )
    assert e.available == 95 * GIB * 0.9
    assert round(e.total / GIB, 2) == 18.47 and e.fits
    # Without remat the 60 layers' working sets (29.2 GiB) still fit beside the rest (16.8 GiB).
    assert fit.remat_policy(e) == "none"


@pytest.mark.parametrize(
    "hbm_gib, policy",
    [
        (95.0, "none"),  # 45.96 GiB with every activation kept
        (52.0, "none"),  # 46.8 GiB usable
        (50.0, "dots"),  # 45.0 usable: "none" needs 45.96, "dots" 22.95
        (26.0, "dots"),  # 23.4 usable
        (25.0, "full"),  # 22.5 usable
    ],
)
def test_remat_policy_at_the_limits(hbm_gib, policy):
    e = fit.training_memory(
        G31,
        dtype="bfloat16",
        fsdp=1,
        tp=4,
        micro_batch=1,
        seq_len=2048,
        lora_rank=16,
        lora_targets=ALL_TARGETS,
        remat=True,
        hbm_gib=hbm_gib,
        usable_fraction=0.9,
    )
    rest = 15.35e9 + 489_717_760 + 1_073_741_824 + GIB
    need = {
        "none": rest + 60 * 522_715_136,
        "dots": rest + 1_321_205_760 + 4_812_963_840 + 522_715_136,
    }
    expected = next((p for p in ("none", "dots") if need[p] <= hbm_gib * GIB * 0.9), "full")
    assert fit.remat_policy(e) == expected == policy


def test_serving_31b_on_two_v6e_chips_is_refused():
    """TP 2 over v6e chips of 32 GiB, maxModelLen 8192, vLLM's default gpu_memory_utilization 0.9:
    30.7 GiB needed against 28.8 allowed."""
    e = fit.serving_memory(G31, tp=2, max_model_len=8192, hbm_gib=32.0, gpu_memory_utilization=0.9)
    weights = 30.70e9 * 2 / 2
    # K and V (bf16) of one 8192-token request: on the 50 sliding layers 16 heads x 256 for the
    # 1023 tokens before the window's last plus the 1024 one scheduler step has in flight; on the
    # 10 global layers 4 heads x 512 for every token (K is V, but vLLM keeps both slots).
    sliding = 2 * 16 * 256 * 50 * (1023 + 1024) * 2
    full = 2 * 4 * 512 * 10 * 8192 * 2
    assert (sliding, full) == (1_676_902_400, 671_088_640)
    assert fit.kv_cache_bytes(G31, 8192) == sliding + full
    assert e.parts == pytest.approx({"weights": weights, "kv(1 seq)": (sliding + full) / 2, "xla": GIB})
    assert e.available == pytest.approx(32 * GIB * 0.9)
    assert (round(e.total / GIB, 1), round(e.available / GIB, 1)) == (30.7, 28.8)
    assert not e.fits
    assert fit.concurrent_sequences(e) == 0
    roomier = fit.serving_memory(G31, tp=2, max_model_len=8192, hbm_gib=32.0, gpu_memory_utilization=0.97)
    assert roomier.fits and roomier.available == pytest.approx(32 * GIB * 0.97)


def test_the_sliding_layers_hold_what_a_step_has_in_flight():
    # a short request: every token on every layer
    assert fit.kv_cache_bytes(G31, 1000) == (2 * 16 * 256 * 50 + 2 * 4 * 512 * 10) * 1000 * 2
    # --max-num-batched-tokens 8192 on an 8192-token request: the sliding layers hold it all
    assert fit.kv_cache_bytes(G31, 8192, 8192) == (2 * 16 * 256 * 50 + 2 * 4 * 512 * 10) * 8192 * 2
    # ... and of a longer one, the window less one token plus those 8192
    assert fit.kv_cache_bytes(G31, 20000, 8192) == (2 * 16 * 256 * 50 * 9215 + 2 * 4 * 512 * 10 * 20000) * 2


def test_serving_31b_on_v6e_8_by_hand():
    """TP 8: each chip holds 2 of the 16 sliding KV heads, and 1 of the 4 global ones (vLLM
    replicates KV heads when TP exceeds them)."""
    e = fit.serving_memory(G31, tp=8, max_model_len=32768, hbm_gib=32.0, gpu_memory_utilization=0.9)
    kv_one = (2 * 2 * 256 * 50 * 2047 + 2 * 1 * 512 * 10 * 32768) * 2
    assert e.parts == pytest.approx({"weights": 30.70e9 * 2 / 8, "kv(1 seq)": kv_one, "xla": GIB})
    free = 32 * GIB * 0.9 - 30.70e9 * 2 / 8 - GIB
    assert fit.concurrent_sequences(e) == int(free // kv_one) == 25


# Kubernetes quantities as the operator's settings write them (decimal and binary SI suffixes).
@pytest.mark.parametrize(
    "text, size",
    [
        ("7", 7),
        ("2KB", 2_000),
        ("500MB", 500_000_000),
        ("10GB", 10_000_000_000),
        ("1TB", 10**12),
        ("3Ki", 3 * 1024),
        ("4Mi", 4 * 1024**2),
        ("1.5Gi", 3 * 2**29),
        ("1Ti", 2**40),
    ],
)
def test_parse_size(text, size):
    assert fit.parse_size(text) == size


def test_host_memory_by_hand():
    """One training host loading the 31B checkpoint: its bf16 files (vision tower too), the largest
    tensor converted (the 262144 x 5376 embedding), the runtime and /dev/shm, against 90 % of the host."""
    e = fit.host_memory(
        G31, dtype="bfloat16", runtime_bytes=8 * GIB, shm_bytes=16 * GIB, host_bytes=400 * GIB, usable_fraction=0.9
    )
    assert e.parts == {
        "checkpoint": (30.70e9 + 0.55e9) * 2,
        "conversion": 262144 * 5376 * 2,
        "runtime": 8 * GIB,
        "/dev/shm": 16 * GIB,
    }
    assert e.available == 400 * GIB * 0.9 and e.unit == "of host memory"
