"""The training step of a Gemma 4 shape, lowered and compiled from abstract inputs: no weight,
optimizer state or batch is allocated, so a shape far beyond the machine's memory (the 31B model at
60 layers, 57 GiB of bf16 weights) compiles on a small CPU. `benchmarks/train_step.py --compile-only`
runs it for each of its rows.

The model, its LoRA adapter, attention, remat and scan, the optimizer and the step function are the
training workload's own (trainer.adapt, trainer.make_trainer), built under `nnx.eval_shape`; the step
is then `jax.jit(...).lower(...)`ed with `jax.ShapeDtypeStruct`s (through nnx.jit, which splits the
abstract model into them) and compiled.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import jax
import numpy as np
from flax import nnx
from tunix.models.gemma4 import model as gemma4

from gemma_workloads.config import TrainConfig
from gemma_workloads.training import mesh, scan
from gemma_workloads.training import trainer as train

_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?\S+ = ", re.MULTILINE)
# a matrix product's dimension numbers and types, its operands' names left out
_DOT = re.compile(r"stablehlo\.dot_general %[^,]+, %[^,]+(.*)$", re.MULTILINE)


@dataclass(frozen=True)
class Compiled:
    lower_seconds: float  # tracing the step and lowering it to StableHLO
    compile_seconds: float  # XLA's compilation, wall clock
    compile_cpu_seconds: float  # the same in CPU time of this process: what other load on shared cores leaves alone
    instructions: int  # in the optimised HLO
    dots: int  # matrix products in the program as lowered (StableHLO dot_general)
    dot_shapes: int  # distinct products among them (dimensions and types): what a GPU's GEMM autotuner times
    temp_bytes: int | None  # XLA's scratch for one call, where the backend says
    layers: str  # "scanned" or "unrolled", as the model was built


def abstract_training(cfg: gemma4.ModelConfig, config: TrainConfig, device_mesh: jax.sharding.Mesh, steps: int):
    """The LoRA model and its optimizer, abstract, and the trainer's step function."""
    made = {}

    def build():
        model, _ = train.adapt(gemma4.Gemma4(cfg, rngs=nnx.Rngs(0)), config, device_mesh)
        trainer = train.make_trainer(model, config, steps, device_mesh)
        made["step"] = trainer.create_train_step_fn()
        return model, trainer.optimizer

    model, optimizer = nnx.eval_shape(build)
    return model, optimizer, made["step"]


def compile_step(cfg: gemma4.ModelConfig, config: TrainConfig, batch: dict[str, np.ndarray], steps: int) -> Compiled:
    """Lower and compile the step for `batch`'s shapes (a micro-batch as the data feed gives it)."""
    device_mesh = mesh.make_mesh(config.mesh)
    with mesh.active(device_mesh):
        model, optimizer, step = abstract_training(cfg, config, device_mesh, steps)
        inputs = {name: jax.ShapeDtypeStruct(array.shape, array.dtype) for name, array in batch.items()}
        began = time.perf_counter()
        lowered = nnx.jit(step, donate_argnames=("model", "optimizer")).lower(model, optimizer, inputs)
        lowered_at, cpu_at = time.perf_counter(), time.process_time()
        compiled = lowered.compile()
        done, cpu_done = time.perf_counter(), time.process_time()
    memory = compiled.memory_analysis()
    dots = _DOT.findall(lowered.as_text())
    return Compiled(
        lowered_at - began,
        done - lowered_at,
        cpu_done - cpu_at,
        len(_INSTRUCTION.findall(compiled.as_text())),
        len(dots),
        len(set(dots)),
        getattr(memory, "temp_size_in_bytes", None),
        "scanned" if scan.decoder(model) is not None else "unrolled",
    )
