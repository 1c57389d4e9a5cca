"""The training HBM estimate (fit.training_memory) against XLA's own memory analysis of the
workload's compiled step (tests/support/xla_memory.py: Qwix LoRA, the remat policy, Tunix's step,
compiled for CPU devices, never run), per device, for Gemma 4 shapes, ranks, sequence lengths,
remat policies and meshes.

What is compared, and within what:
- the state a step keeps between steps (XLA's argument bytes less the batch) against the estimate's
  weights plus three of the four float32 LoRA copies it counts (parameter and two Adam moments; the
  gradient lives only inside the step): within STATE_TOLERANCE on one device, since both are exact
  sizes; on a mesh the estimate may exceed XLA's by up to MESH_STATE_SLACK, since it shards the
  LoRA matrices over tp only and the workload also shards those whose dimensions allow over fsdp;
- the step's working memory (XLA's temporary bytes) against the estimate's activations, logits and
  LoRA gradient: within the factor WORK_FACTOR either way. The estimate is a rule of thumb for a
  transformer layer (Korthikanti et al.: 34 d + 5 heads seq bytes per token and layer) that XLA's
  scheduler beats or misses by a margin that depends on the shape; at these small widths the
  buffers the rule leaves to the fixed 1 GiB allowance (masks, RoPE tables, the optimizer's
  scratch) weigh more than they do at 31B, where that allowance covers them.
  With fsdp > 1 each device also gathers one layer's weights and, for the logits, the embedding
  (FSDP's all-gather), a term fit.py leaves to its fixed XLA allowance; it is added to the estimate
  here (at 31B on fsdp x tp 4 it is about 0.95 GB a chip, close to the whole allowance).
- the forward pass alone (no remat, nothing kept for a backward pass) between its float32 logits,
  which it must hold, and the step's working memory as estimated, which it never exceeds (the
  34 d + 5 heads seq rule counts what a layer keeps for its backward pass, which a forward pass frees).
The fixed `xla` allowance is left out of every comparison: it is what XLA needs beyond the terms.

Every step is compiled with XLA's optimization barriers kept (NO_BARRIER_EXPANSION). JAX's remat fences
the recomputation of a layer behind a barrier on the layer's saved inputs so that XLA can neither merge
it with the forward pass nor run it before the backward pass needs it. XLA's CPU compiler drops the
barriers before fusion and scheduling (cpu_compiler.cc: OptimizationBarrierExpander right after
HloCSE; the GPU compiler drops them only after scheduling): the recomputation then runs beside the
forward pass (on the 4-layer d512 shape the recomputed projections of layer 0 are scheduled four
instructions after the forward ones, of about 1,500) and every layer's recomputed activations live
until the backward pass, so whole-layer remat needed as much as no remat (126 MB vs 120 MB at seq
128, 3.5x the estimate); with the barriers kept it needs 42 MB, 1.2x the estimate's 36 MB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gemma_devcluster import tiny
from gemma_operator import fit
from gemma_operator.model_shapes import ModelShape

pytestmark = pytest.mark.ml  # compiles the workload's step with XLA
ROOT = Path(__file__).resolve().parents[2]
STATE_TOLERANCE = 0.02
MESH_STATE_SLACK = 0.25
WORK_FACTOR = 2.0
# The pass that drops optimization barriers on CPU (its name in xla/hlo/transforms/expanders/
# optimization_barrier_expander.h): kept, the barriers order remat as the GPU compiler keeps them.
NO_BARRIER_EXPANSION = "--xla_disable_hlo_passes=cse_barrier_expander"

TINY = {"layers": 2, "hidden_size": 96, "intermediate_size": 192, "vocab_size": 512, "num_attention_heads": 4}
SMALL = {"layers": 4, "hidden_size": 512, "intermediate_size": 2048, "vocab_size": 4096, "num_attention_heads": 8}


def _config(shape, seq, micro_batch, rank, remat, fsdp=1, tp=1) -> dict:
    return {
        "shape": shape,
        "dtype": "float32",
        "seq": seq,
        "micro_batch": micro_batch,
        "rank": rank,
        "remat": remat,
        "fsdp": fsdp,
        "tp": tp,
    }


FAST = [_config(TINY, 64, 2, 8, "full"), _config(TINY, 256, 2, 8, "none")]
ONE_DEVICE = [
    *FAST,
    _config(TINY, 256, 2, 8, "dots"),
    _config(TINY, 256, 2, 8, "full"),
    _config(SMALL, 512, 1, 16, "dots"),
    _config(SMALL, 512, 1, 16, "none"),
    _config(SMALL, 512, 1, 16, "full"),
    _config(SMALL, 128, 2, 16, "full"),
]
FOUR_DEVICES = [
    _config(TINY, 128, 4, 8, "full", fsdp=4),
    _config(TINY, 128, 4, 8, "none", fsdp=4),
    _config(TINY, 128, 4, 8, "full", fsdp=2, tp=2),
    _config(TINY, 128, 4, 8, "dots", fsdp=2, tp=2),
    _config(SMALL, 256, 2, 16, "full", fsdp=2, tp=2),
]


def _measure(configs: list[dict], devices: int) -> list[dict]:
    env = {
        **os.environ,
        "XLA_FLAGS": f"{os.environ['XLA_FLAGS']} --xla_force_host_platform_device_count={devices} {NO_BARRIER_EXPANSION}",
        "JAX_PLATFORMS": "cpu",
    }
    run = subprocess.run(
        [sys.executable, "-m", "tests.support.xla_memory", json.dumps(configs)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


def _shape(measured: dict) -> ModelShape:
    """The planning shape of the measured model: the tiny test model's heads, the measured widths."""
    s, t = measured["config"]["shape"], tiny.TinyConfig()
    return ModelShape(
        "measured",
        measured["params"],
        layers=s["layers"],
        embed_dim=s["hidden_size"],
        mlp_dim=s["intermediate_size"],
        heads=s["num_attention_heads"],
        head_dim=t.head_dim,
        kv_heads=t.num_key_value_heads,
        global_kv_heads=t.num_global_key_value_heads,
        global_head_dim=t.global_head_dim,
        vocab=s["vocab_size"],
        sliding_window=t.sliding_window,
        local_per_global=1,
    )


def _estimate(measured: dict, shape: ModelShape) -> fit.MemoryEstimate:
    c = measured["config"]
    return fit.training_memory(
        shape,
        dtype=c["dtype"],
        fsdp=c["fsdp"],
        tp=c["tp"],
        micro_batch=c["micro_batch"],
        seq_len=c["seq"],
        lora_rank=c["rank"],
        lora_targets=c.get("targets") or list(shape.projection_shapes()),
        remat=c["remat"] != "none",
        hbm_gib=95.0,
        usable_fraction=0.9,
    )


def comparisons(measured: dict) -> dict[str, tuple[float, ...]]:
    """Term -> (estimated, XLA's) bytes per device; for the forward pass (lower bound, XLA's, upper bound)."""
    shape = _shape(measured)
    c = measured["config"]
    # Tunix fuses K and V into one projection on sliding layers, which Qwix adapts with one A
    # matrix: the estimate's separate k_proj and v_proj adapters (the merged checkpoint's) count
    # rank x d more per sliding layer, a little more than trained.
    planned = shape.lora_params(c["rank"], list(shape.projection_shapes()))
    fused = c["rank"] * shape.embed_dim * shape.sliding_layers
    assert planned - fused == measured["lora_params"], "the planning shape adapts the projections the workload adapts"
    e = _estimate(measured, shape)
    devices = c["fsdp"] * c["tp"]
    lora_copy = e.parts["lora+adam"] / 4  # one float32 copy of the LoRA parameters
    activations = e.activations_by_remat[c["remat"]]
    return {
        "state": (e.parts["weights"] + 3 * lora_copy, measured["argument"] - measured["batch"] / devices),
        "work": (activations + e.parts["logits"] + lora_copy + _fsdp_gather(shape, c), measured["temp"]),
        "forward": (e.parts["logits"] / 2, measured["forward_temp"], activations + e.parts["logits"]),
    }


def _fsdp_gather(shape: ModelShape, c: dict) -> float:
    """Bytes per device of one decoder layer's weights and the embedding, gathered whole over fsdp."""
    if c["fsdp"] == 1:
        return 0.0
    embedding = shape.vocab * shape.embed_dim
    return ((shape.params - embedding) / shape.layers + embedding) * 4 / c["tp"]


def _check(results: list[dict], expected: int) -> None:
    assert len(results) == expected, "every configuration was analysed"
    bad = []
    for r in results:
        terms = comparisons(r)
        (state, xla_state), (work, xla_work) = terms["state"], terms["work"]
        low, forward, high = terms["forward"]
        single = r["config"]["fsdp"] * r["config"]["tp"] == 1
        if not -STATE_TOLERANCE <= state / xla_state - 1 <= (STATE_TOLERANCE if single else MESH_STATE_SLACK):
            bad.append(f"{r['config']}: state estimated {state:.0f} vs XLA {xla_state:.0f}")
        if not 1 / WORK_FACTOR <= work / xla_work <= WORK_FACTOR:
            bad.append(f"{r['config']}: working memory estimated {work:.0f} vs XLA {xla_work:.0f}")
        if not low <= forward <= high:
            bad.append(f"{r['config']}: forward pass {forward:.0f} outside [{low:.0f}, {high:.0f}]")
    assert not bad, "\n".join(bad)


def test_estimate_agrees_with_xla_on_tiny_shapes():
    _check(_measure(FAST, 1), len(FAST))


@pytest.mark.slow
@pytest.mark.sweep  # thirteen compiled steps, about ten minutes of CPU: `make test-sweep`
def test_estimate_agrees_with_xla_across_shapes_ranks_remat_and_meshes():
    one = _measure(ONE_DEVICE, 1)
    _check(one + _measure(FOUR_DEVICES, 4), len(ONE_DEVICE) + len(FOUR_DEVICES))
    wide = {r["config"]["remat"]: r["temp"] for r in one if r["config"]["shape"] == SMALL and r["config"]["seq"] == 512}
    assert wide["full"] < wide["none"] / 2, "whole-layer remat keeps the layers' inputs, not their activations"
