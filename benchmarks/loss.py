"""The training loss against Tunix's default: the same value, its time and its scratch memory.

Both take the model's logits and return the mean next-token loss over the trained tokens (the
training loss without `loss_scale`); the "model" here returns fixed random logits, so only the
loss and its gradient are measured. Time: medians of alternating runs at a shape a CPU can hold.
Scratch memory (XLA's temporaries for loss and gradient, from the compiled program, nothing is
run) also at the 31B model's vocabulary and a paper-sized sequence, and there too for the whole
unembedding + loss from the final hidden states: logits made whole, or in chunks
(cross_entropy.py, `--chunk` tokens).

    python benchmarks/loss.py [--batch 2] [--seq 512] [--vocab 32768] [--repeat 7]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from tunix.sft import peft_trainer

from gemma_workloads.training import cross_entropy, loss

LOSSES = {"tunix default": peft_trainer._default_loss_fn, "token_weighted_nll": loss.token_weighted_nll}


def value_and_grad(loss_fn):
    """The loss and its gradient with respect to the logits, jitted: f(logits, tokens, mask)."""

    def run(logits, tokens, mask):
        inputs = (tokens, mask, jnp.zeros(tokens.shape, jnp.int32), jnp.ones((1, 1, 1), bool))
        return jax.value_and_grad(lambda x: loss_fn(lambda *_: (x, None), *inputs))(logits)

    return jax.jit(run)


def scratch_mib(loss_fn, batch: int, seq: int, vocab: int) -> float:
    shapes = [
        jax.ShapeDtypeStruct((batch, seq, vocab), jnp.float32),
        jax.ShapeDtypeStruct((batch, seq), jnp.int32),
        jax.ShapeDtypeStruct((batch, seq), bool),
    ]
    return value_and_grad(loss_fn).lower(*shapes).compile().memory_analysis().temp_size_in_bytes / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--chunk", type=int, default=512)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.standard_normal((args.batch, args.seq, args.vocab)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, args.vocab, (args.batch, args.seq)), jnp.int32)
    mask = jnp.asarray(rng.random((args.batch, args.seq)) < 0.5)
    fns = {name: value_and_grad(fn) for name, fn in LOSSES.items()}
    values = {name: float(jax.block_until_ready(fn(logits, tokens, mask))[0]) for name, fn in fns.items()}  # compiles
    seconds: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(args.repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(logits, tokens, mask))
            seconds[name].append(time.perf_counter() - start)
    print(f"logits {args.batch} x {args.seq} x {args.vocab} float32, loss and gradient, median of {args.repeat}")
    for name in fns:
        print(
            f"  {name:<20} loss {values[name]:.6f}  {1000 * np.median(seconds[name]):8.1f} ms  "
            f"scratch {scratch_mib(LOSSES[name], args.batch, args.seq, args.vocab):8.0f} MiB"
        )
    print("scratch at 1 x 3072 x 262144 (the 31B vocabulary, compiled only):")
    for name, fn in LOSSES.items():
        print(f"  {name:<20} {scratch_mib(fn, 1, 3072, 262144) / 1024:8.1f} GiB")
    print("scratch from hidden states 1 x 3072 x 5376 and the 262144 x 5376 embedding, softcap 30:")
    for dtype in (jnp.float32, jnp.bfloat16):
        for name, chunk in (("whole logits", None), (f"chunks of {args.chunk}", args.chunk)):
            gib = unembedding_scratch_mib(chunk, 1, 3072, 5376, 262144, dtype) / 1024
            print(f"  {jnp.dtype(dtype).name:<9} {name:<20} {gib:8.2f} GiB")


def unembedding_scratch_mib(chunk: int | None, batch: int, seq: int, dim: int, vocab: int, dtype) -> float:
    """XLA's temporaries for the loss and its gradient with respect to the hidden states."""

    def nll(hidden, embedding, targets):
        if chunk:
            return cross_entropy.token_nll(hidden, embedding, targets, softcap=30.0, chunk_tokens=chunk).sum()
        logits = jnp.tanh(jnp.dot(hidden, embedding.T).astype(jnp.float32) / 30.0) * 30.0
        return (jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, targets[..., None], -1)[..., 0]).sum()

    shapes = [
        jax.ShapeDtypeStruct((batch, seq, dim), dtype),
        jax.ShapeDtypeStruct((vocab, dim), dtype),
        jax.ShapeDtypeStruct((batch, seq), jnp.int32),
    ]
    compiled = jax.jit(jax.value_and_grad(nll)).lower(*shapes).compile()
    return compiled.memory_analysis().temp_size_in_bytes / 2**20


if __name__ == "__main__":
    main()
