"""Step time, tokens/s, MFU and HFU of the LoRA training recipe for a Gemma 4 shape, for the
reference code path and a fast one in the same run, against a matmul ceiling measured on the
same device in the same run.

It runs the training workload's own loop (Qwix LoRA, remat, Tunix PeftTrainer, AdamW with
accumulation) on random weights and full rows of random tokens, so every token counts. Every path
starts from the same weights and sees the same tokens, so their losses must agree to rounding:
the table gives the first step's (before any update) and the last's.

    python benchmarks/train_step.py                                   # tiny model, CPU-sized
    python benchmarks/train_step.py --preset 31b --layers 30 --seq 3072 --micro-batch 1 --rank 64 \
        --dtype bfloat16 --attention auto --loss-chunk 512 --remat none dots --each --profile trace
        # a slice of Gemma 4 31B (its real widths; sliding and global layers alternate, as in the
        # earlier H100 measurements) with 30 of its 60 layers; the reference path (Tunix attention,
        # whole logits, whole-layer remat) runs too, then one fast row per remat policy, then each
        # lever alone; one step of each fast row is traced and summarised (profile_summary.py)

    python benchmarks/train_step.py --preset 31b --layers 60 --seq 3072 --micro-batch 1 --rank 64 \
        --dtype bfloat16 --compile-only [--no-scan]
        # each row's step lowered and compiled from abstract inputs, nothing allocated or run
        # (compile_only.py): compile seconds, HLO size and matrix products, on any machine

Rows are printed as they are measured; a row that runs out of device memory says so and the
others go on. Each row's "compile s" is XLA's compilation of its step alone (JAX's compile events
for it), apart from the row's whole set-up, which its last line gives, tracing included. The
layers are scanned unless --no-scan (training/scan.py).

MFU counts model FLOPs (metrics.py: forward + gradients, causal and windowed attention, no
recompute); HFU the FLOPs the hardware did: the recompute of the remat policy (with "dots", the
attention's forward: only its output is kept) and of the chunked loss, and the full `seq x seq`
scores that the reference and XLA attention compute (XLA in query blocks computes 7/12 of them;
the fused kernels skip masked blocks, and their own backward recompute of the scores is not
counted). Both are
given against the device's peak (--peak-tflops, or known by device kind) and against the ceiling
of a large matmul in the run's dtype (bf16 with --dtype bfloat16, as on GPU and TPU) measured here.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.models.gemma4 import model as gemma4
from tunix.sft import hooks

from gemma_devcluster import tiny
from gemma_workloads import compilation_cache
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


def random_model(cfg: gemma4.ModelConfig, device_mesh: jax.sharding.Mesh, seed: int = 0) -> gemma4.Gemma4:
    """The model with N(0, 0.02) matrices and unit vectors (norm scales and layer scalars, as Tunix
    initialises them), made leaf by leaf in place on the mesh: eager initialisation of the whole
    model needs several times its memory. Random, not constant, values: with equal weights every
    token's hidden state is the same, so every attention path gives the same loss, right or wrong."""
    abstract = nnx.eval_shape(lambda: gemma4.Gemma4(cfg, rngs=nnx.Rngs(0)))
    mesh.fit_to_mesh(abstract, device_mesh, place=False)
    graph, state = nnx.split(abstract)
    values, tree = jax.tree.flatten(state.to_pure_dict())
    shardings = jax.tree.leaves(nnx.get_named_sharding(state, device_mesh).to_pure_dict())
    key = jax.random.key(seed)
    filled = [
        _filler(a.shape, a.dtype, sharding)(jax.random.fold_in(key, i))
        for i, (a, sharding) in enumerate(zip(values, shardings, strict=True))
    ]
    return nnx.merge(graph, jax.tree.unflatten(tree, filled))


@functools.cache
def _filler(shape: tuple[int, ...], dtype, sharding: jax.sharding.Sharding):
    """One compiled program per distinct leaf (the layers repeat a few shapes): a 30-layer model
    has hundreds of leaves, and compiling each anew took minutes on a GPU."""
    if len(shape) < 2:
        return jax.jit(lambda _: jnp.ones(shape, dtype), out_shardings=sharding)
    return jax.jit(lambda k: 0.02 * jax.random.normal(k, shape, dtype), out_shardings=sharding)


def _beside(name: str):
    """A module beside this file (profile_summary.py, compile_only.py): on the path when this runs
    as a script, a module of the benchmarks folder when a test imports this one."""
    import importlib

    try:
        return importlib.import_module(f"benchmarks.{name}")
    except ImportError:
        return importlib.import_module(name)


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
    first_loss: float  # before any update: the same weights and tokens for every path
    last_loss: float
    compile_seconds: float  # XLA's compilation of the step


def matmul_ceiling(size: int, dtype: str, repeats: int = 10) -> float:
    """TFLOP/s of a `size`^3 matmul in the run's dtype on the default device (median of `repeats`)."""
    a = jax.random.normal(jax.random.key(0), (size, size), model.DTYPES[dtype])  # not constant: that runs faster
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

    def scored_keys(kind: gemma4.AttentionType) -> float:
        """Keys each query is scored against: every one on the reference and XLA paths, and where
        cuDNN hands XLA a head dim above its limit (the 31B model's global layers) unless the row
        goes in query blocks; the fused kernels skip masked blocks."""
        head_dim = cfg.global_key_size if kind == gemma4.AttentionType.GLOBAL else cfg.head_dim
        if attention == "cudnn" and attention_paths.dot_product_implementation("cudnn", head_dim, cfg.dtype) == "xla":
            blocks = attention_paths.QUERY_BLOCKS if attention_paths.query_block(seq) else 1
            return seq * (blocks + 1) / (2 * blocks)
        if attention in ("reference", "xla"):
            return seq
        return metrics._attended(kind, cfg.sliding_window_size, seq)

    attention_forward = sum(4 * nh * scored_keys(k) for k, nh in zip(kinds, heads_dims, strict=True))
    extra = 3 * (attention_forward - model_attention)
    layer_weights = sum(metrics._layer_weights(cfg, k) for k in kinds)
    if remat == "full":  # every layer's forward again
        extra += 2 * layer_weights + 2 * lora_params + attention_forward
    elif remat in ("dots", "offload"):  # only the attention's output is kept: its forward runs again
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
    parser.add_argument(
        "--remat",
        nargs="+",
        default=["dots"],
        choices=REMAT_POLICIES,
        help="the fast path's remat policies, one row each (the --each row uses the first)",
    )
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the reference path (Tunix attention, whole logits, whole-layer remat)",
    )
    parser.add_argument("--each", action="store_true", help="also measure each of the three levers alone")
    parser.add_argument(
        "--profile", type=Path, help="trace the third step of each fast row into DIR/<row> and summarise it there"
    )
    parser.add_argument("--ceiling-size", type=int, help="matmul size for the ceiling (default 8192; 4096 on CPU)")
    parser.add_argument("--peak-tflops", type=float, help="per device; default: by device kind (none for CPUs)")
    parser.add_argument(
        "--scan",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="scan the decoder layers over repetitions of the attention pattern (--no-scan: unrolled)",
    )
    parser.add_argument(
        "--compile-only",
        action="store_true",
        help="only lower and compile each row's step from abstract inputs (no memory for the model needed)",
    )
    parser.add_argument(
        "--compilation-cache",
        metavar="DIR",
        help="compile through JAX's persistent cache in DIR (a second run reads the programs the first wrote)",
    )
    args = parser.parse_args()
    if args.profile and args.steps < TRACED_STEP + 1:
        parser.error(f"--profile traces step {TRACED_STEP}: it needs --steps {TRACED_STEP + 1} or more")

    with compilation_cache.persistent(args.compilation_cache) as cache:
        measure(args)
    if cache is not None:
        print(f"\n{cache.summary()}")


def measure(args: argparse.Namespace) -> None:
    cfg = model_config(args)
    chunk = args.loss_chunk or None
    variants = [] if args.no_baseline else [Variant("reference", "reference", None, "full")]
    variants += [
        Variant("fast" if len(args.remat) == 1 else f"fast-{policy}", args.attention, chunk, policy)
        for policy in args.remat
    ]
    if args.each:  # one lever at a time, the others as in the reference
        variants += [
            Variant("attention", args.attention, None, "full"),
            Variant("loss", "reference", chunk, "full"),
            Variant("remat", "reference", None, args.remat[0]),
        ]
    if args.compile_only:
        compile_rows(args, cfg, variants)
        return
    size = args.ceiling_size or (4096 if jax.default_backend() == "cpu" else 8192)
    table = Table(args, matmul_ceiling(size, args.dtype))
    table.header(cfg, size)
    for variant in variants:
        trace = args.profile / variant.name if args.profile and variant.name.startswith("fast") else None
        began = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="train-step-bench-") as out:
            try:
                table.row(run(args, cfg, variant, out, trace))
            except Exception as e:  # only running out of device memory is a result
                if "RESOURCE_EXHAUSTED" not in str(e):
                    raise
                table.out_of_memory(variant, str(e))
        gc.collect()  # the last row's model and optimizer state leave the device before the next
        stats = jax.devices()[0].memory_stats() or {}  # the peak is the process's so far, all rows
        peak = f", device memory peak so far {stats['peak_bytes_in_use'] / 2**30:.1f} GiB" if stats else ""
        print(f"  ({variant.name}: {time.perf_counter() - began:.0f} s with set-up and compilation{peak})", flush=True)
        if trace and any(trace.glob("plugins/profile/*/*.trace.json.gz")):  # a row that stopped early has none
            summary = _beside("profile_summary").summarise(trace)
            (trace / "summary.txt").write_text(summary)
            print(
                f"\n{variant.name}: step {TRACED_STEP} traced into {trace}\n"
                + "\n".join(summary.splitlines()[:12])
                + "\n"
            )
    table.footer()


def compile_rows(args: argparse.Namespace, cfg: gemma4.ModelConfig, variants: list[Variant]) -> None:
    """Each row's step lowered and compiled from abstract inputs (compile_only.py), nothing run."""
    compiler = _beside("compile_only")
    print(
        f"model       {args.preset} x {cfg.num_layers} layers, {args.dtype}, LoRA rank {args.rank}\n"
        f"devices     {jax.device_count()} x {jax.devices()[0].device_kind}, jax {jax.__version__}\n"
        f"batch       {args.micro_batch} x {args.seq} tokens; compiled only, from abstract inputs\n"
    )
    print(
        f"{'path':10} {'attention':10} {'loss':>7} {'remat':7} {'layers':9} {'lower s':>8} {'compile s':>10} {'CPU s':>7} "
        f"{'HLO instr':>10} {'dots':>6} {'shapes':>6} {'temp GiB':>9}"
    )
    batch = batches.Batches(synthetic_rows(args.micro_batch, args.seq, cfg.num_embed), args.micro_batch, seed=0).next()
    for variant in variants:
        with tempfile.TemporaryDirectory(prefix="train-step-bench-") as out:
            c = compiler.compile_step(cfg, train_config(args, variant, out), batch, args.steps)
        temp = f"{c.temp_bytes / 2**30:9.2f}" if c.temp_bytes is not None else f"{'n/a':>9}"
        resolved = attention_paths.resolve(variant.attention)
        print(
            f"{variant.name:10} {resolved:10} {str(variant.loss_chunk or 'whole'):>7} {variant.remat:7} {c.layers:9} "
            f"{c.lower_seconds:8.1f} {c.compile_seconds:10.1f} {c.compile_cpu_seconds:7.1f} {c.instructions:10d} "
            f"{c.dots:6d} {c.dot_shapes:6d} {temp}",
            flush=True,
        )
        gc.collect()


TRACED_STEP = 3  # the first compiles, the second may still wait on it


class StepTrace(hooks.TrainingHooks):
    """A training hook that traces the device during one optimizer step, then hands every call on
    to the hook it wraps (the progress reporter)."""

    def __init__(self, inner: hooks.TrainingHooks, directory: Path, step: int):
        self.inner, self.directory, self.step = inner, directory, step
        self.tracing = False

    def _settle(self, train_ctx) -> None:
        jax.block_until_ready(nnx.state(train_ctx.model, nnx.LoRAParam))  # the dispatched steps are done

    def on_train_step_start(self, train_ctx) -> None:
        if not self.tracing and train_ctx.train_steps == self.step - 1:
            self._settle(train_ctx)
            jax.profiler.start_trace(str(self.directory))
            self.tracing = True
        elif self.tracing and train_ctx.train_steps == self.step:
            self.on_train_end(train_ctx)
        self.inner.on_train_step_start(train_ctx)

    def on_train_end(self, train_ctx) -> None:
        if self.tracing:
            self._settle(train_ctx)
            jax.profiler.stop_trace()
            self.tracing = False
            self.step = -1  # once
        self.inner.on_train_end(train_ctx)

    def on_train_start(self, train_ctx) -> None:
        self.inner.on_train_start(train_ctx)

    def on_train_step_end(self, train_ctx, train_step: int, train_loss: float) -> None:
        self.inner.on_train_step_end(train_ctx, train_step, train_loss)

    def on_eval_step_start(self, train_ctx) -> None:
        self.inner.on_eval_step_start(train_ctx)

    def on_eval_step_end(self, train_ctx, eval_loss: float) -> None:
        self.inner.on_eval_step_end(train_ctx, eval_loss)


def train_config(args: argparse.Namespace, variant: Variant, out: str) -> TrainConfig:
    return TrainConfig(
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
        scan_layers=args.scan,
    )


class CompileClock:
    """Seconds JAX spent tracing and compiling the training step while it is on (jax.monitoring's
    events carry the function's name; jax/_src/dispatch.py)."""

    EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/backend_compile_duration")

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(self.EVENTS, 0.0)

    def __call__(self, event: str, duration_secs: float, fun_name: str = "", **_) -> None:
        if event in self.seconds and "train_step" in str(fun_name):
            self.seconds[event] += duration_secs

    def __enter__(self) -> CompileClock:
        jax.monitoring.register_event_duration_secs_listener(self)
        return self

    def __exit__(self, *_) -> None:
        with contextlib.suppress(AssertionError, ValueError):  # Tunix's trainer clears every listener as it closes
            jax.monitoring.unregister_event_duration_listener(self)

    @property
    def compile_seconds(self) -> float:
        return self.seconds[self.EVENTS[1]]


def run(args: argparse.Namespace, cfg: gemma4.ModelConfig, variant: Variant, out: str, trace: Path | None) -> Measured:
    config = train_config(args, variant, out)
    rows = synthetic_rows(config.batch_size * args.steps, args.seq, cfg.num_embed)
    data = train.Data(batches.Batches(rows, args.micro_batch, seed=0, accumulation=args.accumulation), [], args.steps)
    device_mesh = mesh.make_mesh(None)
    with Preemption(0, multi_host=False) as preemption, mesh.active(device_mesh), CompileClock() as clock:
        base = random_model(cfg, device_mesh)
        lora_model, dropout = train.adapt(base, config, device_mesh)
        resolved = attention_paths.resolve(variant.attention)
        trainer = train.make_trainer(lora_model, config, args.steps, device_mesh)
        if trace:  # fit() installs the progress reporter: trace around it
            install = trainer.with_training_hooks
            trainer.with_training_hooks = lambda reporter: install(StepTrace(reporter, trace, TRACED_STEP))
        reporter = train.fit(
            trainer, data, config, cfg, preemption=preemption, dropout=dropout, device_mesh=device_mesh
        )
        lora_params = lora.lora_parameter_count(lora_model)
    timed = reporter.history[1:-1] or reporter.history[1:]  # per-step rates (the last line is the run's average)
    if not timed:
        raise RuntimeError(f"{variant.name}: no step after the first (compilation) finished: nothing to time")
    rate = statistics.median(p.tokens_per_second for p in timed)
    hardware = hardware_flops_per_token(
        cfg, args.seq, lora_params, reporter.flops_per_token, resolved, variant.remat, variant.loss_chunk
    )
    return Measured(
        variant,
        resolved,
        config.batch_size * args.seq / rate,
        rate,
        reporter.flops_per_token,
        hardware,
        reporter.history[0].loss,
        reporter.history[-1].loss,
        clock.compile_seconds,
    )


class Table:
    """The report, printed a row at a time as the rows are measured."""

    def __init__(self, args: argparse.Namespace, ceiling: float):
        self.args, self.ceiling = args, ceiling
        self.peak = args.peak_tflops or metrics.peak_tflops(jax.devices()[0].device_kind)
        self.first: Measured | None = None

    def header(self, cfg: gemma4.ModelConfig, size: int) -> None:
        args, device = self.args, jax.devices()[0]
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
            f"ceiling     {args.dtype} {size}^3 matmul: {self.ceiling:.2f} TFLOP/s per device"
            + (f" ({100 * self.ceiling / self.peak:.1f} % of the {self.peak:g} TFLOP/s peak)" if self.peak else "")
        )
        print(
            f"\n{'path':10} {'attention':10} {'loss':>7} {'remat':7} {'compile s':>9} {'step s':>8} {'tokens/s':>10} "
            f"{'MFU':>7} {'HFU':>7} {'MFU/ceil':>9} {'HFU/ceil':>9} {'speed':>6} {'loss 1':>8} {'loss N':>8}",
            flush=True,
        )

    def _pct(self, tflops: float, flops: float) -> str:
        return f"{100 * tflops * flops / self.peak:6.2f}%" if self.peak else f"{'n/a':>7}"

    def _lead(self, v: Variant, attention: str) -> str:
        return f"{v.name:10} {attention:10} {str(v.loss_chunk or 'whole'):>7} {v.remat:7}"

    def row(self, m: Measured) -> None:
        self.first = self.first or m
        tflops = m.tokens_per_second / jax.device_count() / 1e12
        print(
            f"{self._lead(m.variant, m.attention)} {m.compile_seconds:9.1f} {m.step_seconds:8.3f} {m.tokens_per_second:10.1f} "
            f"{self._pct(tflops, m.model_flops)} {self._pct(tflops, m.hardware_flops)} "
            f"{100 * tflops * m.model_flops / self.ceiling:8.2f}% {100 * tflops * m.hardware_flops / self.ceiling:8.2f}% "
            f"{m.tokens_per_second / self.first.tokens_per_second:5.2f}x {m.first_loss:8.4f} {m.last_loss:8.4f}",
            flush=True,
        )

    def out_of_memory(self, v: Variant, error: str) -> None:
        print(f"{self._lead(v, v.attention)} out of device memory: {error.splitlines()[0][:160]}", flush=True)

    def footer(self) -> None:
        if self.first:
            print(f"\nFLOPs/token model {self.first.model_flops / 1e9:.3f} G; speed is tokens/s against the first row")


if __name__ == "__main__":
    main()
