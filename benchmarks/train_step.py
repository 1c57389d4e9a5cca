"""Step time, tokens/s, MFU and HFU of the LoRA training recipe for a Gemma 4 shape, for the
reference code path and a fast one in the same run, against a matmul ceiling measured on the
same device in the same run.

It runs the training workload's own loop (Qwix LoRA, remat, Tunix PeftTrainer, AdamW with
accumulation) on constant weights and full rows of random tokens, so every token counts.

    python benchmarks/train_step.py                                   # tiny model, CPU-sized
    python benchmarks/train_step.py --preset 31b --layers 30 --seq 3072 --micro-batch 1 --rank 64 \
        --dtype bfloat16 --attention auto --loss-chunk 512 --remat dots
        # a slice of Gemma 4 31B (its real widths; sliding and global layers alternate, as in the
        # earlier H100 measurements) with 30 of its 60 layers; the reference path (Tunix attention, whole logits, whole-layer remat) runs too

MFU counts model FLOPs (metrics.py: forward + gradients, causal and windowed attention, no
recompute); HFU the FLOPs the hardware did: the recompute of the remat policy and of the chunked
loss, and the full `seq x seq` scores that the reference and XLA attention compute (the fused
kernels skip masked blocks; their own backward recompute of the scores is not counted). Both are
given against the device's peak (--peak-tflops, or known by device kind) and against the ceiling
of a large matmul in the run's dtype (bf16 with --dtype bfloat16, as on GPU and TPU) measured here.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.models.gemma4 import model as gemma4

from gemma_devcluster import tiny
from gemma_workloads.config import ATTENTION_PATHS, REMAT_POLICIES, DatasetConfig, LoraConfig, TrainConfig
from gemma_workloads.training import attention as attention_paths
from gemma_workloads.training import batches, lora, mesh
from gemma_workloads.training import flops as metrics
from gemma_workloads.training import model_loader as model
from gemma_workloads.training import trainer as train
from gemma_workloads.training.preemption import Preemption


def model_config(args: argparse.Namespace) -> gemma4.ModelConfig:
    if args.preset == "tiny":
        cfg = model.tunix_config(tiny.TinyConfig().hf_config(), dtype=args.dtype)
    else:
        cfg = getattr(gemma4.ModelConfig, f"gemma4_{args.preset}")()
        cfg.attention_pattern = (gemma4.AttentionType.LOCAL_SLIDING, gemma4.AttentionType.GLOBAL)
        cfg.param_dtype = cfg.dtype = model.DTYPES[args.dtype]
    if args.layers:
        cfg.num_layers = args.layers
        cfg.frac_shared_layers = 0.0  # a slice has no room for e2b/e4b's KV-sharing layers
    return cfg


def constant_model(cfg: gemma4.ModelConfig, device_mesh: jax.sharding.Mesh) -> gemma4.Gemma4:
    """The model with every weight 0.02, made in place on the mesh: timing does not depend on the
    values, and eager random initialisation needs several times the model's memory."""
    abstract = nnx.eval_shape(lambda: gemma4.Gemma4(cfg, rngs=nnx.Rngs(0)))
    mesh.fit_to_mesh(abstract, device_mesh, place=False)
    graph, state = nnx.split(abstract)
    shardings = nnx.get_named_sharding(state, device_mesh).to_pure_dict()

    def fill(a: jax.ShapeDtypeStruct, sharding) -> jax.Array:
        return jax.jit(lambda: jnp.full(a.shape, 0.02, a.dtype), out_shardings=sharding)()

    return nnx.merge(graph, jax.tree.map(fill, state.to_pure_dict(), shardings))


def synthetic_rows(count: int, seq: int, vocab: int) -> batches.Rows:
    tokens = np.random.default_rng(0).integers(6, vocab, size=(count, seq), dtype=np.int32)
    mask = np.ones((count, seq), bool)
    mask[:, 0] = False
    return batches.Rows(
        tokens, mask, np.ones((count, seq), np.int32), np.tile(np.arange(seq, dtype=np.int32), (count, 1))
    )


@dataclass(frozen=True)
class Variant:
    name: str
    attention: str
    loss_chunk: int | None
    remat: str


@dataclass(frozen=True)
class Measured:
    variant: Variant
    attention: str  # the path "auto" resolved to
    step_seconds: float
    tokens_per_second: float
    model_flops: float  # per token
    hardware_flops: float  # per token


def matmul_ceiling(size: int, dtype: str, repeats: int = 10) -> float:
    """TFLOP/s of a `size`^3 matmul in the run's dtype on the default device (median of `repeats`)."""
    a = jnp.ones((size, size), model.DTYPES[dtype])
    mm = jax.jit(lambda x: x @ x)
    mm(a).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mm(a).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times) / 1e12


def hardware_flops_per_token(
    cfg: gemma4.ModelConfig,
    seq: int,
    lora_params: int,
    model_flops: float,
    attention: str,
    remat: str,
    loss_chunk: int | None,
) -> float:
    """Model FLOPs plus what the hardware does on top (see the module docstring)."""
    pattern = cfg.attention_pattern or gemma4.GEMMA4_ATTENTION_PATTERN
    kinds = [pattern[i % len(pattern)] for i in range(cfg.num_layers)]
    heads_dims = [
        cfg.num_heads * (cfg.global_key_size if k == gemma4.AttentionType.GLOBAL else cfg.head_dim) for k in kinds
    ]
    model_attention = sum(
        4 * nh * metrics._attended(k, cfg.sliding_window_size, seq) for k, nh in zip(kinds, heads_dims, strict=True)
    )

    # the reference and XLA paths compute every score, masked or not; so does cuDNN's fallback to
    # XLA for head dims above its limit (the 31B model's global layers) or outside bf16/fp16
    def every_score(kind: gemma4.AttentionType) -> bool:
        head_dim = cfg.global_key_size if kind == gemma4.AttentionType.GLOBAL else cfg.head_dim
        if attention == "cudnn":
            return attention_paths.dot_product_implementation("cudnn", head_dim, cfg.dtype) == "xla"
        return attention in ("reference", "xla")

    attention_forward = sum(
        4 * nh * (seq if every_score(k) else metrics._attended(k, cfg.sliding_window_size, seq))
        for k, nh in zip(kinds, heads_dims, strict=True)
    )
    extra = 3 * (attention_forward - model_attention)
    layer_weights = sum(metrics._layer_weights(cfg, k) for k in kinds)
    if remat == "full":  # every layer's forward again
        extra += 2 * layer_weights + 2 * lora_params + attention_forward
    elif remat in ("dots", "offload") and attention in ("reference", "xla"):  # their score products are not kept
        extra += attention_forward
    if loss_chunk:  # the logits again in the backward pass
        extra += 2 * cfg.num_embed * cfg.embed_dim
    return model_flops + extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny", choices=["tiny", "31b", "e4b", "e2b"])
    parser.add_argument("--layers", type=int, help="keep this many layers (default: all)")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps; the first (compilation) is not timed")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument(
        "--attention",
        default="auto",
        choices=ATTENTION_PATHS,
        help="the fast path's attention (auto is the reference on a CPU: pass xla to time XLA's kernel)",
    )
    parser.add_argument("--loss-chunk", type=int, default=512, help="tokens per cross-entropy chunk; 0: whole logits")
    parser.add_argument("--remat", default="dots", choices=REMAT_POLICIES, help="the fast path's remat policy")
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the reference path (Tunix attention, whole logits, whole-layer remat)",
    )
    parser.add_argument("--each", action="store_true", help="also measure each of the three levers alone")
    parser.add_argument("--ceiling-size", type=int, help="matmul size for the ceiling (default 8192; 4096 on CPU)")
    parser.add_argument("--peak-tflops", type=float, help="per device; default: by device kind (none for CPUs)")
    args = parser.parse_args()

    cfg = model_config(args)
    variants = [] if args.no_baseline else [Variant("reference", "reference", None, "full")]
    chunk = args.loss_chunk or None
    if args.each:  # one lever at a time, the others as in the reference
        variants += [
            Variant("attention", args.attention, None, "full"),
            Variant("loss", "reference", chunk, "full"),
            Variant("remat", "reference", None, args.remat),
        ]
    variants.append(Variant("fast", args.attention, chunk, args.remat))
    measured = []
    for variant in variants:
        with tempfile.TemporaryDirectory(prefix="train-step-bench-") as out:
            measured.append(run(args, cfg, variant, out))
    size = args.ceiling_size or (4096 if jax.default_backend() == "cpu" else 8192)
    report(args, cfg, measured, matmul_ceiling(size, args.dtype), size)


def run(args: argparse.Namespace, cfg: gemma4.ModelConfig, variant: Variant, out: str) -> Measured:
    config = TrainConfig(
        model_path="(random weights)",
        model_dtype=args.dtype,
        dataset=DatasetConfig(path="(random tokens)", max_seq_len=args.seq),
        lora=LoraConfig(rank=args.rank, alpha=float(args.rank), dropout=0.05),
        steps=args.steps,
        batch_size=args.micro_batch * args.accumulation,
        micro_batch_size=args.micro_batch,
        learning_rate=1e-4,
        checkpoint_every=10**6,
        log_every=1,
        output_dir=out,
        peak_tflops_per_device=args.peak_tflops,
        attention=variant.attention,
        loss_chunk_tokens=variant.loss_chunk,
        remat_policy=variant.remat,
    )
    rows = synthetic_rows(config.batch_size * args.steps, args.seq, cfg.num_embed)
    data = train.Data(batches.Batches(rows, args.micro_batch, seed=0, accumulation=args.accumulation), [], args.steps)
    device_mesh = mesh.make_mesh(None)
    with Preemption(0, multi_host=False) as preemption, mesh.active(device_mesh):
        base = constant_model(cfg, device_mesh)
        lora_model, dropout = train.adapt(base, config, device_mesh)
        resolved = lora_model.layers[0].attn.attention_path
        trainer = train.make_trainer(lora_model, config, args.steps, device_mesh)
        reporter = train.fit(
            trainer, data, config, cfg, preemption=preemption, dropout=dropout, device_mesh=device_mesh
        )
        lora_params = lora.lora_parameter_count(lora_model)
    timed = reporter.history[1:-1] or reporter.history[1:]  # per-step rates (the last line is the run's average)
    rate = statistics.median(p.tokens_per_second for p in timed)
    hardware = hardware_flops_per_token(
        cfg, args.seq, lora_params, reporter.flops_per_token, resolved, variant.remat, variant.loss_chunk
    )
    return Measured(variant, resolved, config.batch_size * args.seq / rate, rate, reporter.flops_per_token, hardware)


def report(
    args: argparse.Namespace, cfg: gemma4.ModelConfig, measured: list[Measured], ceiling: float, size: int
) -> None:
    device = jax.devices()[0]
    peak = args.peak_tflops or metrics.peak_tflops(device.device_kind)
    print(
        f"model       {args.preset} x {cfg.num_layers} layers, {args.dtype}, LoRA rank {args.rank}, "
        f"window {cfg.sliding_window_size}, vocab {cfg.num_embed}"
    )
    print(f"devices     {jax.device_count()} x {device.device_kind}, jax {jax.__version__}")
    print(
        f"batch       {args.micro_batch} x {args.seq} tokens x {args.accumulation} micro-batches, "
        f"{args.steps} steps (first not timed)"
    )
    print(
        f"ceiling     {args.dtype} {size}^3 matmul: {ceiling:.2f} TFLOP/s per device"
        + (f" ({100 * ceiling / peak:.1f} % of the {peak:g} TFLOP/s peak)" if peak else " (no peak known)")
    )
    print()
    header = (
        f"{'path':10} {'attention':10} {'loss':>7} {'remat':7} {'step s':>8} {'tokens/s':>10} "
        f"{'MFU':>7} {'HFU':>7} {'MFU/ceil':>9} {'HFU/ceil':>9} {'speed':>6}"
    )
    print(header)
    devices = jax.device_count()
    for m in measured:
        tflops = m.tokens_per_second / devices / 1e12
        pct = (
            (lambda flops, tflops=tflops: f"{100 * tflops * flops / peak:6.2f}%")
            if peak
            else (lambda flops: f"{'n/a':>7}")
        )
        v = m.variant
        print(
            f"{v.name:10} {m.attention:10} {str(v.loss_chunk or 'whole'):>7} {v.remat:7} {m.step_seconds:8.3f} "
            f"{m.tokens_per_second:10.1f} {pct(m.model_flops)} {pct(m.hardware_flops)} "
            f"{100 * tflops * m.model_flops / ceiling:8.2f}% {100 * tflops * m.hardware_flops / ceiling:8.2f}% "
            f"{m.tokens_per_second / measured[0].tokens_per_second:5.2f}x"
        )
    print(f"\nFLOPs/token model {measured[0].model_flops / 1e9:.3f} G; speed is tokens/s against the first row")


if __name__ == "__main__":
    main()
