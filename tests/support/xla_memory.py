"""XLA's own memory analysis of the training workload's compiled step, per device, for the HBM fit's
tests to compare against: run as a script in a fresh process, since the number of CPU devices
(the mesh) is fixed when JAX starts.

    XLA_FLAGS="--xla_force_host_platform_device_count=4 --xla_disable_hlo_passes=cse_barrier_expander" \
        python -m tests.support.xla_memory CONFIGS_JSON

(the second flag keeps JAX's optimization barriers, without which XLA's CPU compiler undoes remat:
tests/operator/test_fit_xla.py says how).

The step is the workload's own: Qwix LoRA applied and placed on the mesh by `trainer.adapt`, the
remat policy of `remat.py`, Tunix's PeftTrainer step as `trainer.Trainer` wraps it (loss,
gradients of the LoRA parameters, AdamW update), jitted with model and optimizer donated as the
trainer does; compiled, never run. Weights are constants (values do not change the sizes).
Prints one JSON object per configuration: the compiled step's argument, output, alias and temporary
bytes, the forward pass's temporary bytes, and the model's parameter counts.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile

import jax
from benchmarks.train_step import random_model, synthetic_rows
from flax import nnx
from tunix.sft import sharding_utils

from gemma_devcluster import tiny
from gemma_workloads.config import LORA_MODULES, DatasetConfig, LoraConfig, MeshConfig, TrainConfig
from gemma_workloads.training import batches, lora, mesh, remat
from gemma_workloads.training import model_loader as model
from gemma_workloads.training import trainer as train

LORA_TARGETS = list(LORA_MODULES)  # the workload's default: every projection


def hf_config(shape: dict) -> dict:
    """A Gemma 4 text config: the tiny test model with the widths and layer count of `shape`."""
    layers = shape["layers"]
    kinds = (("sliding_attention", "full_attention") * layers)[:layers]
    widths = {k: shape[k] for k in ("hidden_size", "intermediate_size", "vocab_size", "num_attention_heads")}
    return dataclasses.replace(tiny.TinyConfig(), layer_types=kinds, **widths).hf_config()


def _train_config(c: dict, out: str) -> TrainConfig:
    return TrainConfig(
        model_path="(constant weights)",
        model_dtype=c["dtype"],
        dataset=DatasetConfig(path="(random tokens)", max_seq_len=c["seq"]),
        lora=LoraConfig(rank=c["rank"], alpha=float(c["rank"]), dropout=0.0, target_modules=LORA_TARGETS),
        steps=2,
        batch_size=c["micro_batch"],
        micro_batch_size=c["micro_batch"],
        learning_rate=1e-4,
        checkpoint_every=10**6,
        log_every=1,
        output_dir=out,
        attention="reference",
        loss_chunk_tokens=None,
        remat_policy=c["remat"],
        mesh=MeshConfig(fsdp=c["fsdp"], tp=c["tp"]),
    )


def _model_key(c: dict) -> str:
    """What the adapted model depends on: configurations that share it share one build."""
    return json.dumps([c["shape"], c["dtype"], c["rank"], c["fsdp"], c["tp"]], sort_keys=True)


def analyse(group: list[dict]) -> list[dict]:
    """Memory analyses of configurations that differ only in batch, sequence and remat policy."""
    first = group[0]
    cfg = model.tunix_config(hf_config(first["shape"]), dtype=first["dtype"])
    results = []
    with tempfile.TemporaryDirectory(prefix="xla-memory-") as out:
        config = _train_config(first, out)
        device_mesh = mesh.make_mesh(config.mesh)
        with mesh.active(device_mesh):
            base = random_model(cfg, device_mesh)
            params = sum(x.size for x in jax.tree.leaves(nnx.state(base, nnx.Param)))
            adapted, _ = train.adapt(base, config, device_mesh)
            lora_params = lora.lora_parameter_count(adapted)
            trainer = train.make_trainer(adapted, config, config.steps, device_mesh)
            step = trainer.create_train_step_fn()
            for c in group:
                rows = synthetic_rows(c["micro_batch"], c["seq"], cfg.num_embed)
                batch = batches.Batches(rows, c["micro_batch"], seed=0).next()
                batch = sharding_utils.shard_input(batch, trainer.config.data_sharding_axis)  # as the trainer's loop
                remat.use_remat(adapted, c["remat"])
                graph, state = nnx.split((adapted, trainer.optimizer))

                def train_step(state, inputs, graph=graph):
                    m, opt = nnx.merge(graph, state)
                    loss_value, _, _ = step(m, opt, inputs)
                    return nnx.state((m, opt)), loss_value

                stats = jax.jit(train_step, donate_argnums=0).lower(state, batch).compile().memory_analysis()
                remat.use_remat(adapted, "none")  # a forward pass alone keeps nothing for a backward one
                model_graph, model_state = nnx.split(adapted)

                def forward(model_state, inputs, model_graph=model_graph):
                    return trainer.loss_fn(nnx.merge(model_graph, model_state), **batches.model_inputs(inputs))

                fwd = jax.jit(forward).lower(model_state, batch).compile().memory_analysis()
                results.append(
                    {
                        "config": c,
                        "params": int(params),
                        "lora_params": int(lora_params),
                        "batch": sum(v.nbytes for v in jax.tree.leaves(batch)),
                        "argument": stats.argument_size_in_bytes,
                        "output": stats.output_size_in_bytes,
                        "alias": stats.alias_size_in_bytes,
                        "temp": stats.temp_size_in_bytes,
                        "forward_temp": fwd.temp_size_in_bytes,
                    }
                )
    return results


if __name__ == "__main__":
    groups: dict[str, list[dict]] = {}
    for c in json.loads(sys.argv[1]):
        groups.setdefault(_model_key(c), []).append(c)
    for group in groups.values():
        for result in analyse(group):
            print(json.dumps(result), flush=True)
