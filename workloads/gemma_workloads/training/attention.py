"""Fused attention for training: no `seq x seq` scores in HBM, the sliding window as a real window.

Tunix's Gemma 4 attention (tunix 0.1.7, `gemma4.model.Attention.block`) multiplies every query by
every key and masks afterwards, on the 5-in-6 sliding layers too; its own splash path is TPU-only,
ignores packed segments and is off. `use_attention(model, path)` swaps each attention module's
class for `FusedAttention`, whose `block` keeps Tunix's projections, norms and RoPE (its own
submodules, so Qwix LoRA still applies) and hands the core to one of:

- "xla": `jax.nn.dot_product_attention(implementation="xla")`, any platform;
- "cudnn": the same call with cuDNN flash attention (GPU, bf16/fp16, head dim <= 256); the 31B
  model's global layers, head dim 512, take XLA a block of queries at a time (`query_blocks`),
  each block against the keys up to its end only, which skips most of the masked half of the
  scores that XLA would compute and hold;
- "splash": Pallas splash attention (TPU; interpreted elsewhere, for tests), with a local mask on
  sliding layers and segment ids;
- "reference": Tunix's own code, unchanged.

Semantics kept exactly (batches.model_inputs): a token attends to earlier tokens of its own
segment (packed examples never see each other), padding (segment 0) is attended by nobody, and
on sliding layers only to the last `sliding_window_size` positions, itself included. The mask
reaches the layers as Tunix's dense `[B, T, S]` boolean; each token's segment is recovered from
it as the first key its row allows (its segment's start), so the fused paths need no new input.
Gemma 4 scales queries by 1 (QK-norm instead of 1/sqrt(d)) and has no attention-logit softcap;
a config that has one (`attn_logits_soft_cap`) is refused by the paths that cannot apply it.
Decoding (a KV cache, or one token) always takes Tunix's code.
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
from jax.interpreters import pxla
from jax.sharding import PartitionSpec as P
from tunix.models.gemma4 import model as gemma4

from gemma_workloads.config import ATTENTION_PATHS
from gemma_workloads.training import scan

Path = Literal["reference", "xla", "cudnn", "splash"]
ATTENTION_OUTPUT = "attention_output"  # its checkpoint name, for remat policies that keep it
CUDNN_MAX_HEAD_DIM = 256  # jax/_src/cudnn/fused_attention_stablehlo.py: check_is_flash_attention (Hopper)


def resolve(path: str, platform: str | None = None) -> Path:
    """The path "auto" means on this platform: splash on TPU, cuDNN on GPU, and Tunix's own
    attention elsewhere. A CPU has no fused kernel: XLA's `dot_product_attention` lowers there to
    the same products with a segment mask, no faster on the quick start, and its different
    rounding moves a 200-step tiny run's trajectory (the demo's recipe was tuned on Tunix's)."""
    if path not in ATTENTION_PATHS:
        raise ValueError(f"attention path {path!r}: expected one of {ATTENTION_PATHS}")
    if path != "auto":
        return path  # type: ignore[return-value]  # one of ATTENTION_PATHS, checked above
    platform = platform or jax.default_backend()
    return {"tpu": "splash", "gpu": "cudnn"}.get(platform, "reference")  # type: ignore[return-value]  # each a Path


def use_attention(model: gemma4.Gemma4, path: str) -> Path:
    """Route every layer's training attention through `path` ("auto": by platform). "cudnn" off a
    GPU is refused; "splash" off a TPU runs interpreted (exact but slow: for tests)."""
    chosen = resolve(path)
    platform = jax.default_backend()
    if chosen == "cudnn" and platform != "gpu":
        raise ValueError(f"attention path 'cudnn' needs a GPU, this JAX runs on {platform}: use 'auto' or 'xla'")
    softcap = getattr(model.config, "attn_logits_soft_cap", None)
    if softcap is not None and chosen in ("xla", "cudnn"):
        raise ValueError(f"attention path {chosen!r} cannot apply the model's attention logit softcap {softcap}")
    for layer in scan.decoder_layers(model):
        if not isinstance(layer.attn, FusedAttention):
            layer.attn.__class__ = FusedAttention
        layer.attn.attention_path = chosen
    return chosen


def segments_from_mask(mask: jax.Array) -> jax.Array:
    """Per-token segment ids `[B, T]` from a causal-within-segment mask `[B, T, T]`: the index of
    the segment's first token; padding rows (which allow nothing) get ids of their own (T + i), so
    each padding token attends only to itself and no softmax is empty."""
    length = mask.shape[-1]
    start = jnp.argmax(mask, axis=-1).astype(jnp.int32)
    valid = jnp.diagonal(mask, axis1=-2, axis2=-1)
    return jnp.where(valid, start, length + jnp.arange(length, dtype=jnp.int32)[None])


def segment_mask(segments: jax.Array) -> jax.Array:
    """`[B, 1, T, S]`: whether two tokens share a segment (causality and the window are the
    kernel's `is_causal` and `local_window_size`)."""
    return (segments[:, :, None] == segments[:, None, :])[:, None]


def dot_product_implementation(path: Literal["xla", "cudnn"], head_dim: int, dtype) -> Literal["xla", "cudnn"]:
    """What `jax.nn.dot_product_attention` is asked for: cuDNN flash attention takes bf16/fp16 and
    head dims up to 256, anything else (the 31B model's global layers, float32) goes to XLA."""
    if path == "cudnn" and head_dim <= CUDNN_MAX_HEAD_DIM and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
        return "cudnn"
    return "xla"


def dot_product_arguments(segments: jax.Array, window: int | None) -> dict:
    """The masking arguments of `jax.nn.dot_product_attention` (the same in JAX 0.10 and 0.11):
    same segment, causal, and on sliding layers the `window - 1` earlier keys plus the token itself."""
    return {
        "mask": segment_mask(segments),
        "scale": 1.0,
        "is_causal": True,
        "local_window_size": (window - 1, 0) if window is not None else None,
    }


def dot_product(
    q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array, window: int | None, path: Literal["xla", "cudnn"]
) -> jax.Array:
    """`jax.nn.dot_product_attention` on `[B, T, N, H]` queries and `[B, S, K, H]` keys/values; on
    the cuDNN path, what cuDNN cannot take goes to XLA in query blocks where the row divides."""
    implementation = dot_product_implementation(path, q.shape[-1], q.dtype)
    block = query_block(q.shape[1])
    if path == "cudnn" and implementation == "xla" and block is not None:
        return query_blocks(q, k, v, segments, window, block)
    return jax.nn.dot_product_attention(
        q, k, v, **dot_product_arguments(segments, window), implementation=implementation
    )


QUERY_BLOCKS = 6  # 7/12 of the full scores at 6 blocks; more blocks skip more but launch smaller products


def query_block(length: int) -> int | None:
    """Queries per block for `query_blocks`: the row in `QUERY_BLOCKS` equal blocks of a multiple
    of 128 tokens; None where it does not divide so (the row then takes one XLA call)."""
    block, rest = divmod(length, QUERY_BLOCKS)
    return block if rest == 0 and block % 128 == 0 else None


def query_blocks(
    q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array, window: int | None, block: int
) -> jax.Array:
    """Causal attention a block of queries at a time, each against the keys up to its last query:
    the same softmax over the same allowed keys per query as one call, with the scores above the
    blocks' diagonal never computed (for 6 blocks, 7/12 of them are)."""
    length = q.shape[1]
    positions = jnp.arange(length)
    out = []
    for start in range(0, length, block):
        end = start + block
        allowed = positions[start:end, None] >= positions[None, :end]  # causal, aligned at the row's start
        if window is not None:
            allowed &= positions[start:end, None] - positions[None, :end] < window
        same = segments[:, start:end, None] == segments[:, None, :end]
        mask = (same & allowed[None])[:, None]  # [B, 1, block, end]
        out.append(
            jax.nn.dot_product_attention(
                q[:, start:end], k[:, :end], v[:, :end], mask=mask, scale=1.0, implementation="xla"
            )
        )
    return jnp.concatenate(out, axis=1)


def _active_mesh() -> jax.sharding.Mesh | None:
    """The legacy `with mesh:` context Tunix 0.1.7 reads too (mesh.active sets it); None where this
    JAX no longer has it."""
    resources = getattr(pxla, "thread_resources", None)
    mesh = resources.env.physical_mesh if resources is not None else None
    return None if mesh is None or mesh.empty else mesh


def splash(
    q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array, window: int | None, softcap: float | None
) -> jax.Array:
    """Pallas splash attention on `[B, T, N, H]` / `[B, S, K, H]`, each device running the kernel
    on its own rows and heads (a Pallas kernel is not partitioned by XLA): rows split over the
    mesh's `fsdp` axis and heads over `tp`, as Tunix lays out activations, where they divide."""
    mesh = _active_mesh()
    local = functools.partial(_splash_local, window=window, softcap=softcap)
    if mesh is None or mesh.size == 1:
        return local(q, k, v, segments)
    rows = "fsdp" if "fsdp" in mesh.shape and q.shape[0] % mesh.shape["fsdp"] == 0 else None
    tp = mesh.shape.get("tp", 1)
    heads = "tp" if tp > 1 and q.shape[2] % tp == 0 and k.shape[2] % tp == 0 else None
    spec = P(rows, None, heads, None)
    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec, P(rows, None)), out_specs=spec, check_vma=False)(
        q, k, v, segments
    )


def splash_block(length: int) -> int | None:
    """The splash kernel's block size for rows of `length`: the largest of 512, 256 and 128 that
    divides it (the kernel's blocks tile the row in multiples of 128 lanes); None if none does."""
    return next((b for b in (512, 256, 128) if length % b == 0), None)


def _splash_local(q, k, v, segments, *, window: int | None, softcap: float | None) -> jax.Array:
    """One MQA splash kernel per KV head over its group of query heads."""
    try:  # imported here: the module stays importable on a JAX without Pallas' TPU ops
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
    except ImportError as e:
        raise RuntimeError(
            f"attention path 'splash' needs Pallas splash attention, missing in JAX {jax.__version__}: "
            "use 'auto' or 'xla'"
        ) from e
    batch, length, heads, dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    shape = (length, length)
    one = masks.LocalMask(shape, window_size=(window - 1, 0), offset=0) if window else masks.CausalMask(shape)
    block = splash_block(length)
    assert block is not None  # the layer takes this path only for rows the blocks tile
    sizes = kernel.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )
    run = kernel.make_splash_mqa_single_device(
        masks.MultiHeadMask([one] * group),
        block_sizes=sizes,
        attn_logits_soft_cap=softcap,
        interpret=jax.default_backend() != "tpu",
    )
    q = q.reshape(batch, length, kv_heads, group, dim).transpose(0, 2, 3, 1, 4)  # B K G T H
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # B K S H

    def one_row(q_row, k_row, v_row, seg_row):
        ids = kernel.SegmentIds(q=seg_row, kv=seg_row)
        return jax.vmap(lambda qh, kh, vh: run(qh, kh, vh, segment_ids=ids))(q_row, k_row, v_row)

    out = jax.vmap(one_row)(q, k, v, segments)  # B K G T H
    return out.transpose(0, 3, 1, 2, 4).reshape(batch, length, heads, dim)


class FusedAttention(gemma4.Attention):
    """Tunix's attention with a fused core in training; `attention_path` picks it."""

    attention_path: Path = "reference"

    def block(self, x, segment_pos, cache, attn_mask, kv_shared_cache=None):
        if self.attention_path == "reference" or cache is not None or x.shape[1] == 1:
            return super().block(x, segment_pos, cache, attn_mask, kv_shared_cache=kv_shared_cache)
        q, k, v = self._projections(x.astype(self.config.dtype), segment_pos, kv_shared_cache)
        window = self.config.sliding_window_size if self.attn_type == gemma4.AttentionType.LOCAL_SLIDING else None
        segments = segments_from_mask(attn_mask[..., : x.shape[1]])
        if self.attention_path == "splash" and splash_block(x.shape[1]) is not None:
            softcap = getattr(self.config, "attn_logits_soft_cap", None)
            encoded = splash(q, k, v, segments, window, softcap)
        else:
            # rows that splash's blocks cannot tile (not a multiple of 128 tokens) take XLA's kernel
            encoded = dot_product(
                q, k, v, segments, window, "xla" if self.attention_path == "splash" else self.attention_path
            )
        encoded = jax.ad_checkpoint.checkpoint_name(encoded, ATTENTION_OUTPUT)
        out = gemma4.shard(self.attn_vec_einsum(encoded), self.config.shd_config.act_btd)
        return {"v": v, "k": k}, out, (k, v)

    def _projections(self, x, positions, kv_shared_cache):
        """Queries, keys and values as Tunix's `block` makes them (tunix 0.1.7)."""
        rope = functools.partial(
            gemma4.apply_rope,
            positions=positions,
            base_frequency=self.rope_base_frequency,
            scale_factor=self.rope_scale_factor,
            rope_proportion=self.rope_proportion,
        )
        act = self.config.shd_config.act_btnh
        q = rope(self._query_norm(gemma4.shard(self.q_einsum(x), act)))
        if kv_shared_cache is not None:
            return q, kv_shared_cache["k"], kv_shared_cache["v"]
        if hasattr(self, "k_einsum"):  # global layers with K = V
            k = v = self.k_einsum(x)
        else:
            k, v = self.kv_einsum(x)
        k, v = gemma4.shard(k, act), gemma4.shard(v, act)
        v = v * jax.lax.rsqrt(jnp.mean(jnp.square(v), axis=-1, keepdims=True) + 1e-06)
        return q, rope(self._key_norm(k)), v
