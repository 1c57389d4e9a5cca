"""Step time, tokens/s and the MFU estimate of the LoRA training recipe for a Gemma 4 shape.

It runs the training workload's own loop (Qwix LoRA, remat, Tunix PeftTrainer, AdamW with
accumulation) on random weights and full rows of random tokens, so every token counts.

    python benchmarks/train_step.py                                   # tiny model, CPU-sized
    python benchmarks/train_step.py --preset 31b --layers 2 --seq 256 --rank 64 --dtype bfloat16
        # a slice of Gemma 4 31B: its real widths (hidden 5376, 32 heads, MLP 21504, vocab 262144,
        # one sliding and one global layer) with 2 of its 60 layers

On a machine without a known peak (CPUs), pass --peak-tflops to get an MFU figure.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.models.gemma4 import model as gemma4

from gemma_workloads import tiny
from gemma_workloads.config import DatasetConfig, LoraConfig, TrainConfig
from gemma_workloads.training import batches, mesh
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
    return batches.Rows(tokens, mask, np.ones((count, seq), np.int32), np.tile(np.arange(seq, dtype=np.int32), (count, 1)))


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
    parser.add_argument("--no-remat", action="store_true")
    parser.add_argument("--peak-tflops", type=float, help="per device; default: by device kind (none for CPUs)")
    args = parser.parse_args()

    cfg = model_config(args)
    with tempfile.TemporaryDirectory(prefix="train-step-bench-") as out:
        run(args, cfg, out)


def run(args: argparse.Namespace, cfg: gemma4.ModelConfig, out: str) -> None:
    config = TrainConfig(
        model_path="(random weights)", model_dtype=args.dtype,
        dataset=DatasetConfig(path="(random tokens)", max_seq_len=args.seq),
        lora=LoraConfig(rank=args.rank, alpha=float(args.rank), dropout=0.05), steps=args.steps,
        batch_size=args.micro_batch * args.accumulation, micro_batch_size=args.micro_batch, learning_rate=1e-4,
        checkpoint_every=10**6, log_every=1, gradient_checkpointing=not args.no_remat, output_dir=out,
        peak_tflops_per_device=args.peak_tflops,
    )
    rows = synthetic_rows(config.batch_size * args.steps, args.seq, cfg.num_embed)
    data = train.Data(batches.Batches(rows, args.micro_batch, seed=0, accumulation=args.accumulation), [], args.steps)
    device_mesh = mesh.make_mesh(None)
    with Preemption(0, multi_host=False) as preemption, mesh.active(device_mesh):
        base = constant_model(cfg, device_mesh)
        weights = sum(x.size for x in jax.tree.leaves(nnx.state(base, nnx.Param)))
        lora_model, dropout = train.adapt(base, config, device_mesh)
        trainer = train.make_trainer(lora_model, config, args.steps, device_mesh)
        reporter = train.fit(trainer, data, config, cfg, preemption=preemption, dropout=dropout, device_mesh=device_mesh)

    timed = reporter.history[1:-1] or reporter.history[1:]  # per-step rates (the last line is the run's average)
    rate = statistics.median(p.tokens_per_second for p in timed)
    tokens_per_step = config.batch_size * args.seq
    print(f"model       {args.preset} x {cfg.num_layers} layers, {args.dtype}, LoRA rank {args.rank} "
          f"({weights / 1e6:,.1f} M weights)")
    print(f"devices     {jax.device_count()} x {jax.devices()[0].device_kind}, mesh {dict(device_mesh.shape)}")
    print(f"batch       {args.micro_batch} x {args.seq} tokens x {args.accumulation} micro-batches")
    print(f"step time   {tokens_per_step / rate:.3f} s (median of {len(timed)} steps)")
    print(f"tokens/s    {rate:.1f}")
    print(f"FLOPs/token {reporter.flops_per_token / 1e9:.3f} G")
    mfu = statistics.median(p.mfu for p in timed) if timed[0].mfu is not None else None
    print(f"MFU         {'%.2f %%' % (100 * mfu) if mfu is not None else 'n/a (no peak known: pass --peak-tflops)'}")


if __name__ == "__main__":
    main()
