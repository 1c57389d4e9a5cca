"""Pre-flight HBM estimates: will this training step or this vLLM server fit on the slice?

Deliberately simple, per-chip, and conservative where the layout is not known:
- training: base weights sharded over the whole mesh; LoRA parameters with their gradient and two
  AdamW moments in float32, sharded over tp only; activations per micro-batch (with decoder
  rematerialisation only the layer inputs are kept, plus one layer's working set; without it every
  layer's), using the 34*D + 5*heads*seq bytes-per-token rule of Korthikanti et al. (2022); the
  float32 logits and their gradient; a fixed allowance for XLA's buffers. A preference pair is two
  sequences, and DPO's reference forward adds one layer's working set and float32 logits without
  gradient (training_method.py). `remat_policy` picks
  the fastest rematerialisation that fits (gemma_workloads.training.remat): keeping everything, else
  keeping the projections' outputs ("dots"), else whole-layer recompute. Remat saves memory only
  where XLA keeps JAX's optimization barriers until it has scheduled the step, so that each layer
  is recomputed just before its backward pass: XLA's CPU compiler drops them before fusion, runs the
  recomputation beside the forward pass and needs as much as without remat (tests/operator/
  test_fit_xla.py compares with the barriers kept).
- serving: weights / TP, plus the KV cache of one full `maxModelLen` sequence (vLLM refuses to
  start without room for it), sized as vLLM sizes it, against `gpuMemoryUtilization` of the HBM.
- the training host: every host loads the whole checkpoint. Tunix's loader maps the files and
  can hold a host copy of every weight until all are on the chips (reshaped weights are copies),
  converts one tensor at a time to the training dtype, and the runtime needs its own room; a
  gs:// or hf:// model is first staged whole onto disk (file pages the kernel can drop, unlike
  the pages of a memory-backed volume).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from gemma_operator.model_shapes import DTYPE_BYTES, ModelShape
from gemma_operator.training_method import METHOD_COST

GIB = 2**30
XLA_ALLOWANCE = 1 * GIB
_SIZE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def parse_size(text: str) -> int:
    """Bytes of a Kubernetes-style quantity ("64Gi", "10GB")."""
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", text)
    if match is None:
        raise ValueError(f"{text!r} is not a quantity such as 64Gi or 10GB")
    number, unit = match.groups()
    return int(float(number) * _SIZE_UNITS[unit])


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per chip, by part, against what the chip offers."""

    parts: dict[str, float]
    available: float
    unit: str = "per chip"
    activations_by_remat: dict[str, float] = field(default_factory=dict)  # training: bytes per remat policy

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.available

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in self.parts.items())
        return f"{self.total / GIB:.1f} GiB {self.unit} needed ({parts}) vs {self.available / GIB:.1f} GiB available"


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
    method: str = "sft",
    unit: str = "per chip",
) -> MemoryEstimate:
    b = DTYPE_BYTES[dtype]
    devices = fsdp * tp
    cost = METHOD_COST[method]
    # Per device: the batch's rows are split over fsdp, each one or two sequences.
    tokens = max(1, micro_batch // fsdp) * cost.sequences_per_row * seq_len
    per_layer_work = tokens * (34 * shape.embed_dim + 5 * shape.heads * seq_len) * b / tp
    layer_inputs = tokens * shape.embed_dim * b * shape.layers
    # "dots" also keeps each layer's matmul outputs: q, k, v, attention, o, gate, up, down
    q, kv, d = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.embed_dim
    saved_dots = tokens * (2 * q + 2 * kv + 2 * d + 2 * shape.mlp_dim) * b / tp * shape.layers
    by_remat = {
        "none": per_layer_work * shape.layers,
        "dots": layer_inputs + saved_dots + per_layer_work,
        "full": layer_inputs + per_layer_work,
    }
    activations = by_remat["full" if remat else "none"]
    parts = {
        "weights": shape.params * b / devices,
        "lora+adam": shape.lora_params(lora_rank, lora_targets) * 4 * 4 / tp,
        "activations": activations,
        "logits": tokens * shape.vocab * 4 * 2 / tp,
    }
    if cost.reference_forward:  # one layer at a time, then float32 logits, no gradient; counted as overlapping the step
        parts["reference"] = per_layer_work + tokens * shape.vocab * 4 / tp
    parts["xla"] = XLA_ALLOWANCE
    return MemoryEstimate(parts, hbm_gib * GIB * usable_fraction, unit, activations_by_remat=by_remat)


def remat_policy(estimate: MemoryEstimate) -> Literal["none", "dots", "full"]:
    """The fastest remat policy whose activations fit beside the rest of a training estimate:
    "none", then "dots", else "full". Host offload is never chosen here: the host's memory is
    budgeted for loading the checkpoint (host.py), not for activations."""
    rest = estimate.total - estimate.parts["activations"]
    if rest + estimate.activations_by_remat["none"] <= estimate.available:
        return "none"
    if rest + estimate.activations_by_remat["dots"] <= estimate.available:
        return "dots"
    return "full"


# vLLM's default --max-num-batched-tokens for its API server on TPU is at most this (V6E's; V5E
# 512, V5P 256: vllm/engine/arg_utils.py, get_batch_defaults).
TPU_MAX_NUM_BATCHED_TOKENS = 1024


def kv_cache_bytes(
    shape: ModelShape, max_model_len: int, max_num_batched_tokens: int | None = None, tp: int = 1
) -> int:
    """The KV cache vLLM reserves on each of `tp` chips for one `max_model_len` request, as its KV
    cache specs size it (vllm/v1/kv_cache_interface.py, `max_memory_usage_bytes`): K and V on
    every layer, Gemma 4's global layers too (their V is K, but vLLM loads K into both slots:
    vllm/model_executor/models/gemma4.py); a sliding layer holds its window less one token plus the
    tokens one scheduler step has in flight (SlidingWindowSpec), never more than the request. A
    rank holds max(1, heads // tp) KV heads: beyond that TP replicates them (vLLM's attention
    layers). Rounding each layer up to whole blocks (one block at most) is left out."""
    batched = max_num_batched_tokens or TPU_MAX_NUM_BATCHED_TOKENS
    sliding_tokens = min(shape.sliding_window - 1 + batched, max_model_len)
    sliding = 2 * max(1, shape.kv_heads // tp) * shape.head_dim * shape.sliding_layers * sliding_tokens
    full = 2 * max(1, shape.global_kv_heads // tp) * shape.global_head_dim * shape.global_layers * max_model_len
    return (sliding + full) * DTYPE_BYTES["bfloat16"]


def serving_memory(
    shape: ModelShape,
    *,
    tp: int,
    max_model_len: int,
    hbm_gib: float,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int | None = None,
    unit: str = "per chip",
) -> MemoryEstimate:
    weights = shape.params * DTYPE_BYTES["bfloat16"] / tp
    kv = kv_cache_bytes(shape, max_model_len, max_num_batched_tokens, tp)
    parts = {"weights": weights, "kv(1 seq)": kv, "xla": XLA_ALLOWANCE}
    return MemoryEstimate(parts, hbm_gib * GIB * gpu_memory_utilization, unit)


def host_memory(
    shape: ModelShape, *, dtype: str, runtime_bytes: float, shm_bytes: float, host_bytes: float, usable_fraction: float
) -> MemoryEstimate:
    """Bytes one training host holds while it loads the model, against its memory."""
    parts = {
        "checkpoint": shape.checkpoint_bytes(),
        "conversion": shape.largest_tensor_elements() * DTYPE_BYTES[dtype],
        "runtime": runtime_bytes,
        "/dev/shm": shm_bytes,
    }
    return MemoryEstimate(parts, host_bytes * usable_fraction, "of host memory")


def staging_disk(shape: ModelShape, available_bytes: float) -> MemoryEstimate:
    """The checkpoint's files plus room for the download's metadata and partial files."""
    files = shape.checkpoint_bytes()
    parts = {"checkpoint": files, "headroom": max(2 * GIB, 0.05 * files)}
    return MemoryEstimate(parts, available_bytes, "of local disk")


def concurrent_sequences(estimate: MemoryEstimate) -> int:
    """How many full-length sequences the KV budget left after the weights holds."""
    kv_one = estimate.parts["kv(1 seq)"]
    free = estimate.available - estimate.parts["weights"] - estimate.parts["xla"]
    return max(0, int(free // kv_one)) if kv_one > 0 else 0
