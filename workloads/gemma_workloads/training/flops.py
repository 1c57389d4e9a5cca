"""Model FLOPs per token and the MFU estimate.

MFU = tokens/s x model FLOPs per token / (devices x peak FLOP/s). Model FLOPs count what LoRA
training must compute, not what the hardware did: the frozen weights cost their forward pass
and the gradient of their inputs (4 FLOPs per weight per token), the LoRA weights also their own
gradients (6), attention its score and mix products forward and backward; recomputation by
rematerialisation and padding are not counted. With this, the seed paper's 763 tokens/s for
Gemma 4 31B on a v5p-8 is about 5 % MFU, as the paper reports.
"""

from __future__ import annotations

from tunix.models.gemma4 import model as gemma4

# Dense bf16 peak TFLOP/s per device, by `jax.Device.device_kind` (first match wins).
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("TPU v5 lite", 197.0),  # v5e
    ("TPU v5e", 197.0),
    ("TPU v5", 459.0),  # v5p reports "TPU v5" (or "TPU v5p")
    ("TPU v6", 918.0),  # v6e (Trillium), "TPU v6 lite"
    ("TPU v4", 275.0),
    ("H200", 989.0),
    ("H100", 989.0),
    ("A100", 312.0),
)


def peak_tflops(device_kind: str) -> float | None:
    """Peak for a device kind; None where unknown (CPUs, for one): MFU is then not reported."""
    return next((peak for prefix, peak in PEAK_TFLOPS if prefix.lower() in device_kind.lower()), None)


def _layer_weights(cfg: gemma4.ModelConfig, kind: gemma4.AttentionType) -> int:
    d, heads = cfg.embed_dim, cfg.num_heads
    glob = kind == gemma4.AttentionType.GLOBAL
    head_dim = cfg.global_key_size if glob else cfg.head_dim
    kv_heads = (cfg.num_global_kv_heads or cfg.num_kv_heads) if glob else cfg.num_kv_heads
    kv = (1 if glob and cfg.k_eq_v_global else 2) * kv_heads * head_dim * d
    return 2 * heads * head_dim * d + kv + 3 * d * cfg.hidden_dim


def _attended(kind: gemma4.AttentionType, window: int | None, seq_len: int) -> float:
    """Mean number of keys a query attends to in a causal row of `seq_len` tokens."""
    if kind == gemma4.AttentionType.LOCAL_SLIDING and window and window < seq_len:
        return window - window * (window - 1) / (2 * seq_len)  # ramps up to the window, then flat
    return (seq_len + 1) / 2


def flops_per_token(cfg: gemma4.ModelConfig, seq_len: int, lora_params: int = 0, *, reference: bool = False) -> float:
    """Training FLOPs per token of a LoRA fine-tune (dense Gemma 4; MoE experts not counted);
    `reference`: plus DPO's forward pass of the base model over the same token."""
    pattern = cfg.attention_pattern or gemma4.GEMMA4_ATTENTION_PATTERN
    kinds = [pattern[i % len(pattern)] for i in range(cfg.num_layers)]
    frozen = sum(_layer_weights(cfg, k) for k in kinds) + cfg.num_embed * cfg.embed_dim  # + tied output head
    attention = 0.0
    for kind in kinds:
        head_dim = cfg.global_key_size if kind == gemma4.AttentionType.GLOBAL else cfg.head_dim
        attention += 4 * cfg.num_heads * head_dim * _attended(kind, cfg.sliding_window_size, seq_len)
    return 4 * frozen + 6 * lora_params + 3 * attention + (2 * frozen + attention if reference else 0)


def mfu(tokens_per_second: float, flops: float, devices: int, peak: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1], or None without a known peak (TFLOP/s per device)."""
    if not peak:
        return None
    return tokens_per_second * flops / (devices * peak * 1e12)
