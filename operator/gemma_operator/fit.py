"""Pre-flight HBM estimates: will this training step or this vLLM server fit on the slice?

Deliberately simple, per-chip, and conservative where the layout is not known:
- training: base weights sharded over the whole mesh; LoRA parameters with their gradient and two
  AdamW moments in float32, sharded over tp only; activations per micro-batch (with decoder
  rematerialisation only the layer inputs are kept, plus one layer's working set; without it every
  layer's), using the 34*D + 5*heads*seq bytes-per-token rule of Korthikanti et al. (2022); the
  float32 logits and their gradient; a fixed allowance for XLA's buffers.
- serving: weights / TP, plus the KV cache of one full `maxModelLen` sequence (vLLM refuses to
  start without room for it), against `gpuMemoryUtilization` of the HBM.
"""

from __future__ import annotations

from dataclasses import dataclass

from gemma_operator.models import DTYPE_BYTES, ModelShape

GIB = 2**30
XLA_ALLOWANCE = 1 * GIB


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per chip, by part, against what the chip offers."""

    parts: dict[str, float]
    available: float

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.available

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in self.parts.items())
        return f"{self.total / GIB:.1f} GiB per chip needed ({parts}) vs {self.available / GIB:.1f} GiB available"


def training_memory(
    shape: ModelShape,
    *,
    dtype: str,
    fsdp: int,
    tp: int,
    micro_batch: int,
    seq_len: int,
    lora_rank: int,
    lora_targets: list[str],
    remat: bool,
    hbm_gib: float,
    usable_fraction: float,
) -> MemoryEstimate:
    b = DTYPE_BYTES[dtype]
    devices = fsdp * tp
    tokens = max(1, micro_batch // fsdp) * seq_len  # per device: the batch is split over fsdp
    per_layer_work = tokens * (34 * shape.embed_dim + 5 * shape.heads * seq_len) * b / tp
    layer_inputs = tokens * shape.embed_dim * b * shape.layers
    activations = layer_inputs + per_layer_work if remat else per_layer_work * shape.layers
    parts = {
        "weights": shape.params * b / devices,
        "lora+adam": shape.lora_params(lora_rank, lora_targets) * 4 * 4 / tp,
        "activations": activations,
        "logits": tokens * shape.vocab * 4 * 2 / tp,
        "xla": XLA_ALLOWANCE,
    }
    return MemoryEstimate(parts, hbm_gib * GIB * usable_fraction)


def serving_memory(
    shape: ModelShape,
    *,
    tp: int,
    max_model_len: int,
    hbm_gib: float,
    gpu_memory_utilization: float,
) -> MemoryEstimate:
    weights = shape.params * DTYPE_BYTES["bfloat16"] / tp
    kv = shape.kv_bytes_per_token(DTYPE_BYTES["bfloat16"], max_model_len) * max_model_len / tp
    parts = {"weights": weights, "kv(1 seq)": kv, "xla": XLA_ALLOWANCE}
    return MemoryEstimate(parts, hbm_gib * GIB * gpu_memory_utilization)


def concurrent_sequences(estimate: MemoryEstimate) -> int:
    """How many full-length sequences the KV budget left after the weights holds."""
    kv_one = estimate.parts["kv(1 seq)"]
    free = estimate.available - estimate.parts["weights"] - estimate.parts["xla"]
    return max(0, int(free // kv_one)) if kv_one > 0 else 0
