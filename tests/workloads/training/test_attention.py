"""The fused attention paths compute Tunix's attention: same logits and LoRA gradients on packed
and unpacked rows, the sliding window shorter than the row, and packed examples isolated."""

import copy
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gemma_workloads.training import attention, batches, loss
from tests.workloads.training.tiny_lora import LENGTH, assert_close, logits, lora_grads, packed_batch, random_lora_model

# cuDNN needs a GPU; splash runs interpreted off TPU.
PATHS = [
    "xla",
    "splash",
    pytest.param(
        "cudnn", marks=pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN flash attention needs a GPU")
    ),
]


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def models(request):
    """The reference model and a copy per fused path, sharing the same weights."""
    reference = random_lora_model(request.param)
    assert reference.config.sliding_window_size < LENGTH, "the window must matter"
    return request.param, reference


def with_path(reference, path: str):
    fused = copy.deepcopy(reference)
    assert attention.use_attention(fused, path) == path
    assert all(type(layer.attn) is attention.FusedAttention for layer in fused.layers)
    return fused


@pytest.mark.parametrize("path", PATHS)
def test_fused_attention_gives_the_reference_logits_and_gradients(models, path):
    dtype, reference = models
    batch = packed_batch()
    fused = with_path(reference, path)
    valid = batch["segment_ids"] > 0  # padding positions' outputs are never used (no loss, attended by nobody)
    assert_close(logits(fused, batch)[valid], logits(reference, batch)[valid], dtype)
    (fused_loss, fused_grads), (ref_loss, ref_grads) = (
        lora_grads(m, loss.token_weighted_nll, batch) for m in (fused, reference)
    )
    assert fused_loss == pytest.approx(ref_loss, rel=1e-5 if dtype == "float32" else 2e-2)
    for got, want in zip(fused_grads, ref_grads, strict=True):
        assert_close(got, want, dtype)


@pytest.mark.parametrize("path", ["reference", *PATHS])
def test_packed_examples_never_attend_to_each_other(models, path):
    """Change a token of example A (row 0, positions 0-39): example B (40-99) must not move."""
    _, reference = models
    model = reference if path == "reference" else with_path(reference, path)
    batch = packed_batch()
    changed = copy.deepcopy(batch)
    changed["tokens"][0, 5] = (batch["tokens"][0, 5] + 1) % 500 + 6
    before, after = logits(model, batch), logits(model, changed)
    np.testing.assert_array_equal(after[0, 40:100], before[0, 40:100])
    np.testing.assert_array_equal(after[1], before[1])
    assert np.abs(after[0, 5:40] - before[0, 5:40]).max() > 1e-3, "example A itself must change"
    # the loss on example B's tokens, through the chunked cross-entropy, does not move either
    b_tokens = np.zeros_like(batch["loss_mask"])
    b_tokens[0, 41:100] = True
    b_loss = [example_loss(model, b, b_tokens) for b in (batch, changed)]
    assert b_loss[0] == b_loss[1]
    a_tokens = np.zeros_like(batch["loss_mask"])
    a_tokens[0, 6:40] = True
    assert example_loss(model, batch, a_tokens) != example_loss(model, changed, a_tokens)


def example_loss(model, batch: dict, tokens: np.ndarray) -> float:
    """The mean loss over `tokens` only."""
    inputs = batches.model_inputs({k: v for k, v in batch.items() if k != "loss_scale"} | {"loss_mask": tokens})
    return float(_chunked_loss(model, inputs))


@nnx.jit
def _chunked_loss(model, inputs: dict) -> jax.Array:
    return loss.token_weighted_nll(model, **inputs, chunk_tokens=64)


def test_the_sliding_window_is_a_real_window():
    """With the window removed the fused path gives other logits: the test rows exercise it."""
    reference = random_lora_model("float32")
    batch = packed_batch()
    fused = with_path(reference, "xla")
    windowless = with_path(reference, "xla")
    windowless.config.sliding_window_size = None  # its own copy of the config (deepcopy)
    valid = batch["segment_ids"] > 0
    assert np.abs(logits(windowless, batch)[valid] - logits(fused, batch)[valid]).max() > 1e-3


def test_segments_are_recovered_from_the_training_mask():
    batch = packed_batch()
    mask = batches.model_inputs(batch)["attention_mask"]
    segments = np.asarray(attention.segments_from_mask(mask))
    for row in range(2):
        for segment in (1, 2):
            where = batch["segment_ids"][row] == segment
            if where.any():
                assert (segments[row, where] == np.argmax(where)).all()
        padding = np.flatnonzero(batch["segment_ids"][row] == 0)
        assert (segments[row, padding] == LENGTH + padding).all()  # each padding token on its own


def test_auto_picks_the_platform_kernel():
    assert [attention.resolve("auto", p) for p in ("tpu", "gpu", "cpu")] == ["splash", "cudnn", "reference"]
    with pytest.raises(ValueError, match="expected one of"):
        attention.resolve("flash")


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the refusal is for machines without a GPU")
def test_cudnn_is_refused_without_a_gpu():
    with pytest.raises(ValueError, match="'cudnn' needs a GPU.*use 'auto' or 'xla'"):
        attention.use_attention(random_lora_model("float32"), "cudnn")


@pytest.mark.parametrize(
    "head_dim,dtype,expected",
    [
        (256, "bfloat16", "cudnn"),
        (256, "float16", "cudnn"),
        (128, "bfloat16", "cudnn"),
        (512, "bfloat16", "xla"),  # the 31B model's global layers: above cuDNN's flash limit on Hopper
        (256, "float32", "xla"),  # cuDNN flash attention takes half precision only
    ],
)
def test_cudnn_falls_back_to_xla_outside_its_limits(head_dim, dtype, expected):
    assert attention.dot_product_implementation("cudnn", head_dim, dtype) == expected
    assert attention.dot_product_implementation("xla", head_dim, dtype) == "xla"


def test_the_kernel_arguments_carry_the_window_and_the_segments():
    segments = np.asarray([[0, 0, 2, 2, 2]], np.int32)
    windowed, full = attention.dot_product_arguments(segments, 3), attention.dot_product_arguments(segments, None)
    assert windowed["local_window_size"] == (2, 0) and full["local_window_size"] is None  # 2 earlier + itself
    assert windowed["is_causal"] and windowed["scale"] == 1.0  # Gemma 4: QK-norm, no 1/sqrt(d)
    np.testing.assert_array_equal(np.asarray(windowed["mask"])[0, 0], segments[0][:, None] == segments[0][None, :])


@pytest.mark.parametrize("length,block", [(3072, 512), (2048, 512), (768, 256), (384, 128), (128, 128), (100, None)])
def test_splash_blocks_tile_the_row(length, block):
    """Pallas splash attention tiles rows in blocks of multiples of 128; other lengths take XLA."""
    assert attention.splash_block(length) == block


SHARDED_SPLASH = """
import numpy as np, jax, jax.numpy as jnp
from gemma_workloads.training import attention, mesh
from gemma_workloads.config import MeshConfig
rng = np.random.default_rng(0)
q = jnp.asarray(rng.normal(size=(2, 128, 4, 32)), jnp.float32)
k, v = (jnp.asarray(rng.normal(size=(2, 128, 2, 32)), jnp.float32) for _ in range(2))
segments = jnp.asarray([[0] * 50 + [50] * 78, [0] * 128], jnp.int32)
want = attention.dot_product(q, k, v, segments, 16, "xla")
want_grad = jax.grad(lambda q: attention.dot_product(q, k, v, segments, 16, "xla").sum())(q)
with mesh.active(mesh.make_mesh(MeshConfig(fsdp=2, tp=2))):
    got = jax.jit(lambda q: attention.splash(q, k, v, segments, 16, None))(q)
    grad = jax.jit(jax.grad(lambda q: attention.splash(q, k, v, segments, 16, None).sum()))(q)
print(float(jnp.abs(got - want).max()), float(jnp.abs(grad - want_grad).max()))
"""


def test_splash_runs_per_device_on_a_mesh():
    """On a 2 x 2 mesh each device runs the kernel on its rows and heads (shard_map), with the
    result of the unsharded XLA attention."""
    env = os.environ | {"XLA_FLAGS": f"{os.environ['XLA_FLAGS']} --xla_force_host_platform_device_count=4"}
    done = subprocess.run([sys.executable, "-c", SHARDED_SPLASH], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    value_error, grad_error = map(float, done.stdout.split())
    assert value_error < 1e-5 and grad_error < 1e-4


@pytest.mark.parametrize("window", [None, 100])
def test_query_blocks_give_one_calls_attention_and_gradients(window):
    """Head dims cuDNN cannot take (float32 here, head dim 512 on the 31B model's global layers) go
    to XLA a block of queries at a time on the cuDNN path: same values and gradients as one call,
    with packed segments and padding."""
    rng = np.random.default_rng(0)
    length = 768  # 6 blocks of 128
    q = jnp.asarray(rng.normal(size=(2, length, 4, 64)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(2, length, 2, 64)), jnp.float32) for _ in range(2))
    ids = np.zeros((2, length), np.int32)
    ids[0, 300:700], ids[0, 700:] = 300, length + np.arange(700, length)  # a second example, then padding
    segments = jnp.asarray(ids)
    assert attention.query_block(length) == 128

    def total(path):
        return lambda q, k, v: (attention.dot_product(q, k, v, segments, window, path) ** 2).sum()

    one_call = attention.dot_product(q, k, v, segments, window, "xla")
    blocked = attention.dot_product(q, k, v, segments, window, "cudnn")
    np.testing.assert_allclose(np.asarray(blocked), np.asarray(one_call), atol=1e-5, rtol=1e-5)
    grads = jax.grad(total("cudnn"), (0, 1, 2))(q, k, v), jax.grad(total("xla"), (0, 1, 2))(q, k, v)
    for got, want in zip(*grads, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("length,block", [(3072, 512), (768, 128), (2048, None), (6 * 100, None)])
def test_query_blocks_are_six_multiples_of_128(length, block):
    assert attention.query_block(length) == block
