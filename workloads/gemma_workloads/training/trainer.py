"""LoRA fine-tuning of Gemma 4, the seed paper's recipe (Tunix PeftTrainer, Qwix LoRA, AdamW with
warmup and decay, fsdp x tp mesh, Orbax checkpoints), for any Gemma 4 checkpoint in Hugging Face
format, local or on gs://; `python -m gemma_workloads train --config FILE` runs it (runner.py).

The run checks every input before touching a device (preflight.py; as a program, before JAX is
imported), resumes from the latest complete checkpoint, reports progress on stdout, and ends with
a `TrainResult` in the termination log and an exit code the operator acts on (config.py).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pydantic
from flax import nnx
from tunix.models.gemma4 import model as gemma4
from tunix.sft import peft_trainer

from gemma_workloads import compilation_cache
from gemma_workloads.config import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, Progress, TrainConfig, TrainResult
from gemma_workloads.data import TextCodec, read_examples
from gemma_workloads.input_files import InputError
from gemma_workloads.model_folder import check_model_folder
from gemma_workloads.sources import resolve_model
from gemma_workloads.training import attention, lora, loss, mesh, pairs, preference_loss, remat, scan
from gemma_workloads.training import batches as batching
from gemma_workloads.training import checkpoint_writer as checkpoints
from gemma_workloads.training import flops as metrics
from gemma_workloads.training.evaluation import evaluate as evaluation
from gemma_workloads.training.feed import DataFeed
from gemma_workloads.training.model_loader import load_model, read_hf_config
from gemma_workloads.training.preemption import Preempted, Preemption
from gemma_workloads.training.progress import NonFiniteStep, ProgressReporter

log = logging.getLogger("gemma_workloads.train")


class ConfigError(ValueError):
    """The config is valid on its own but not for this data or checkpoint directory."""


BAD_INPUT = (ConfigError, InputError, checkpoints.CheckpointMismatch, pydantic.ValidationError)


@dataclass
class Data:
    train: batching.Batches
    eval: list[dict[str, np.ndarray]]
    total_steps: int
    codec: TextCodec | None = None
    evaluation: list[evaluation.EvalRow] | None = None  # the rows scored after the last step


@dataclass
class Outcome:
    result: TrainResult
    exit_code: int
    history: list[Progress]


def prepare_data(config: TrainConfig) -> Data:
    """Tokenise and check the whole dataset, lay it out in rows, and count the steps."""
    ds = config.dataset
    codec = TextCodec(config.model_path)
    examples = read_examples(ds, codec).items
    if config.preference_tuning:
        train_pairs, held_pairs = pairs.split(
            pairs.fitting(pairs.pairs_of(examples), ds), ds.eval_fraction, config.seed
        )
        rows, held_rows = pairs.layout(train_pairs, ds.max_seq_len), pairs.layout(held_pairs, ds.max_seq_len)
        data: batching.Batches = pairs.PairBatches(
            rows, config.micro_batch_size, config.seed, accumulation=config.grad_accumulation
        )
        evals = pairs.eval_batches(held_rows, config.micro_batch_size) if held_pairs else []
        held_out = [e for p in held_pairs for e in (p.chosen, p.rejected)]
        kept, held, unit = len(train_pairs) + len(held_pairs), len(held_pairs), "pairs"
    else:
        train, held_out = batching.split(batching.fitting(examples, ds.max_seq_len), ds.eval_fraction, config.seed)
        rows = batching.layout(train, ds.max_seq_len, packing=ds.packing)
        data = batching.Batches(rows, config.micro_batch_size, config.seed, accumulation=config.grad_accumulation)
        evals = []
        if held_out:
            held_rows = batching.layout(held_out, ds.max_seq_len, packing=ds.packing)
            evals = batching.eval_batches(held_rows, config.micro_batch_size)
        kept, held, unit = len(train) + len(held_out), len(held_out), "examples"
    total = config.steps or data.steps_for(config.epochs or 1, config.batch_size)  # epochs is 1 unless set
    if config.warmup_steps >= total:
        raise ConfigError(f"warmup_steps {config.warmup_steps} must be smaller than the {total} training steps")
    log.info(
        "data: %d %s -> %d rows of %d tokens (%d held out for eval); %d steps of %d rows",
        kept,
        unit,
        len(rows),
        ds.max_seq_len,
        held,
        total,
        config.batch_size,
    )
    return Data(data, evals, total, codec, evaluation.prepare(config, codec, held_out))


def schedule(config: TrainConfig, total_steps: int) -> optax.Schedule:
    lr, warmup = config.learning_rate, config.warmup_steps
    if config.lr_schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, total_steps)
    if config.lr_schedule == "linear":
        return optax.join_schedules(
            [optax.linear_schedule(0.0, lr, warmup), optax.linear_schedule(lr, 0.0, total_steps - warmup)], [warmup]
        )
    # Not optax.warmup_constant_schedule: it is the warmup alone, 0 forever when warmup is 0.
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), optax.constant_schedule(lr)], [warmup])


def optimizer(config: TrainConfig, total_steps: int) -> optax.GradientTransformation:
    """AdamW over optimizer steps (Tunix wraps it to accumulate micro-batch gradients).

    Its hyperparameters are float32 whatever the parameters' dtype: optax would store them in the
    parameters' dtype, and in bf16 Adam's b2 = 0.999 becomes 1.0, so the bias correction
    1 - b2**t is 0 and the first update is NaN."""
    return optax.inject_hyperparams(optax.adamw, hyperparam_dtype=jnp.float32)(
        learning_rate=schedule(config, total_steps), weight_decay=config.weight_decay
    )


class Trainer(peft_trainer.PeftTrainer):
    """Tunix's PeftTrainer whose checkpoints also hold the data position, and whose step keeps
    the trained state where it was placed."""

    feed: DataFeed | None = None
    mesh: jax.sharding.Mesh | None = None
    save_times: checkpoints.SaveTimes | None = None
    _jitted_train_step_fn: Any  # Tunix's: None until its first step compiles
    _checkpoints: checkpoints.LayerOrderCheckpoints

    @property
    def checkpoint_manager(self) -> checkpoints.LayerOrderCheckpoints:
        return self._checkpoints

    @checkpoint_manager.setter
    def checkpoint_manager(self, manager) -> None:
        """Tunix's constructor makes its checkpoint manager and restores from it at once: the
        manager becomes a LayerOrderCheckpoints as it is set, so checkpoints keep the unrolled
        layout when the layers are scanned."""
        manager.__class__ = checkpoints.LayerOrderCheckpoints
        self._checkpoints = manager

    def jit_train_and_eval_step(self, skip_jit: bool = False, cache_nnx_graph: bool = False):
        """Tunix's jitted steps, with the model donated as well as the optimizer: otherwise every
        call returns a new copy of each frozen base weight, so a step needs the base model twice
        (14 GiB more per v5p chip for the 31B model)."""
        if skip_jit or self._jitted_train_step_fn is not None:
            return super().jit_train_and_eval_step(skip_jit, cache_nnx_graph)
        self._shard_optimizer(self.mesh)
        train_step = nnx.jit(self.create_train_step_fn(), donate_argnames=("model", "optimizer"))
        eval_step = nnx.jit(self.create_eval_step_fn(), donate_argnames=("model",))
        bind = nnx.cached_partial if cache_nnx_graph else functools.partial
        self._jitted_train_step_fn = functools.partial(bind(train_step, self.model, self.optimizer))
        self._jitted_eval_step_fn = functools.partial(bind(eval_step, self.model))
        return self._jitted_train_step_fn, self._jitted_eval_step_fn

    def create_train_step_fn(self):
        """Tunix's step, with the LoRA parameters and optimizer state constrained to their
        annotated shardings: left to XLA, they come back laid out differently, and the next call
        compiles the whole step again (minutes for the 31B model).

        A micro-batch whose loss or gradient is not finite leaves both as they were, so no
        checkpoint can hold its NaNs; the run stops when the step's loss is reported
        (`NonFiniteStep`), which on a TPU is one step later."""
        step, device_mesh = super().create_train_step_fn(), self.mesh
        assert device_mesh is not None  # set before the trainer's first step

        def train_step(model, optimizer, inputs):
            trained = ((model, nnx.LoRAParam), (optimizer, nnx.optimizer.OptState))
            before = [jax.tree.leaves(nnx.state(node, kind)) for node, kind in trained]
            loss, aux, grad_norm = step(model, optimizer, inputs)
            finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
            for (node, kind), old in zip(trained, before, strict=True):
                leaves, tree = jax.tree.flatten(nnx.state(node, kind))
                state = jax.tree.unflatten(
                    tree, [jnp.where(finite, new, prev) for new, prev in zip(leaves, old, strict=True)]
                )
                nnx.update(node, jax.lax.with_sharding_constraint(state, nnx.get_named_sharding(state, device_mesh)))
            return loss, aux, grad_norm

        return train_step

    def close(self) -> None:
        """Tunix's, after which the compilation cache counts again what evaluation compiles."""
        super().close()
        compilation_cache.listen_again()

    def custom_checkpoint_metadata(self) -> dict:
        return {checkpoints.DATA_POSITION: self.feed.batches.state()} if self.feed else {}

    @property
    def restored_metadata(self) -> dict:
        return self._restored_custom_metadata or {}


def adapt(
    model: gemma4.Gemma4, config: TrainConfig, device_mesh: jax.sharding.Mesh
) -> tuple[gemma4.Gemma4, nnx.Rngs | None]:
    """LoRA on the base model, placed on the mesh, with attention, remat and dropout as configured."""
    model = lora.apply_lora(model, config.lora, seed=config.seed)
    mesh.fit_to_mesh(model, device_mesh, place=True)
    chosen = attention.use_attention(model, config.attention)
    remat.use_remat(model, config.remat)
    layers = scan.scan_layers(model, device_mesh) if config.scan_layers else "unrolled"
    log.info("attention: %s; remat: %s; layers %s", chosen, config.remat, layers)
    dropout = nnx.Rngs(dropout=config.seed) if config.lora.dropout > 0 else None
    if dropout is not None:
        model.set_attributes(qwix_rngs=dropout)  # Qwix draws LoRA dropout masks from here
    return model, dropout


def training_loss(config: TrainConfig):
    """The method's loss: token-weighted NLL (sft), or the pairs' DPO or ORPO loss."""
    if config.preference_tuning:
        return preference_loss.trainer_loss(config.method, config.preference, config.loss_chunk_tokens)
    return loss.trainer_loss(config.loss_chunk_tokens)


def make_trainer(
    model: gemma4.Gemma4, config: TrainConfig, total_steps: int, device_mesh: jax.sharding.Mesh
) -> Trainer:
    """Tunix's PeftTrainer for the config; it restores the latest complete checkpoint, if any."""
    times = checkpoints.SaveTimes()
    trainer = (
        Trainer(
            model,
            optimizer(config, total_steps),
            peft_trainer.TrainingConfig(
                eval_every_n_steps=config.checkpoint_every,
                max_steps=total_steps,
                gradient_accumulation_steps=config.grad_accumulation if config.grad_accumulation > 1 else None,
                checkpoint_root_directory=config.checkpoint_dir,
                checkpointing_options=checkpoints.options(config, total_steps, times),
                pbar_description=None,
            ),
        )
        .with_loss_fn(training_loss(config))
        .with_gen_model_input_fn(pairs.model_inputs if config.preference_tuning else batching.model_inputs)
    )
    trainer.mesh = device_mesh
    trainer.save_times = times
    checkpoints.time_saves(trainer.checkpoint_manager, times)
    return trainer


def resume_position(trainer: Trainer, config: TrainConfig, data: Data) -> int:
    """Micro-batches already consumed, from the restored checkpoint (0 on a fresh start)."""
    expected = trainer.train_steps * config.grad_accumulation
    saved = trainer.restored_metadata.get(checkpoints.DATA_POSITION)
    if saved is None:
        if trainer.train_steps:
            log.warning(
                "checkpoint at step %d has no data position; assuming %d micro-batches", trainer.train_steps, expected
            )
        return expected
    if (saved["micro_batches"], saved["micro_batch_size"]) != (expected, config.micro_batch_size):
        raise ConfigError(
            f"the checkpoint at step {trainer.train_steps} consumed {saved['micro_batches']} micro-batches of "
            f"{saved['micro_batch_size']}; this config would have consumed {expected} of {config.micro_batch_size}: "
            "batch_size and micro_batch_size must not change when resuming"
        )
    if saved["fingerprint"] != data.train.rows.fingerprint:
        log.warning("the training data differ from the checkpoint's; resuming at the same position anyway")
    return expected


def fit(
    trainer: Trainer,
    data: Data,
    config: TrainConfig,
    model_config: gemma4.ModelConfig,
    *,
    preemption: Preemption,
    dropout: nnx.Rngs | None,
    device_mesh: jax.sharding.Mesh,
) -> ProgressReporter:
    """Run the training loop from the data position to the last step or a stop request."""
    data.train.position = resume_position(trainer, config, data)
    if trainer.train_steps:
        log.info("resumed from step %d (%s)", trainer.train_steps, data.train.state())
    feed = trainer.feed = DataFeed(
        data.train,
        data.eval,
        total_steps=data.total_steps,
        accumulation=config.grad_accumulation,
        seed=config.seed,
        preemption=preemption,
        dropout=dropout,
        device_mesh=device_mesh,
    )
    reporter = ProgressReporter(
        total_steps=data.total_steps,
        log_every=config.log_every,
        output_dir=config.output_dir,
        tokens_in_step=feed.tokens_in_step,
        devices=jax.device_count(),
        peak_tflops=config.peak_tflops_per_device or metrics.peak_tflops(jax.devices()[0].device_kind),
        flops_per_token=metrics.flops_per_token(
            model_config,
            config.dataset.max_seq_len,
            lora.lora_parameter_count(trainer.model),
            reference=config.method == "dpo",
        ),
        primary=jax.process_index() == 0,
    )
    trainer.with_data_hooks(feed)
    trainer.with_training_hooks(reporter)
    try:
        trainer.train((), data.eval)
    except Preempted as stop:
        log.warning("preempted: %s", stop)
        trainer.checkpoint_manager.close()
    except NonFiniteStep:
        trainer.checkpoint_manager.close()  # the checkpoints being written hold finite weights: keep them
        raise
    return reporter


def run(config: TrainConfig) -> Outcome:
    """Train (or resume) to the end, or until preempted, compiling through the persistent
    compilation cache where the config names one."""
    with compilation_cache.persistent(config.compilation_cache_dir):
        return _train(config)


def _train(config: TrainConfig) -> Outcome:
    source = config.model_path
    config = config.model_copy(update={"model_path": resolve_model(source)})
    if config.model_path != source:  # downloaded (hf://): checked now that it is here
        check_model_folder(config.model_path, chat=config.dataset.chat)
    with Preemption(config.termination_grace_seconds, multi_host=config.num_hosts > 1) as preemption:
        mesh.initialize_distributed(config.num_hosts)
        hf_config = read_hf_config(config.model_path)
        data = prepare_data(config)
        if jax.process_index() == 0:
            checkpoints.write_lora_metadata(config)
        device_mesh = mesh.make_mesh(config.mesh)
        log.info(
            "mesh fsdp=%d x tp=%d over %d %s device(s)",
            *device_mesh.devices.shape,
            jax.device_count(),
            jax.devices()[0].device_kind,
        )
        with mesh.active(device_mesh):
            model, model_config = load_model(
                config.model_path, dtype=config.model_dtype, mesh=device_mesh, hf_config=hf_config
            )
            model, dropout = adapt(model, config, device_mesh)
            trainer = make_trainer(model, config, data.total_steps, device_mesh)
            reporter = fit(
                trainer, data, config, model_config, preemption=preemption, dropout=dropout, device_mesh=device_mesh
            )
            scored = None
            if (
                data.evaluation and data.codec and trainer.train_steps >= data.total_steps
            ):  # a restarted finished run does only this
                scored = evaluation.run(trainer.model, config, data.evaluation, data.codec)
    step, latest = trainer.train_steps, trainer.checkpoint_manager.latest_step()
    status, code = ("succeeded", EXIT_OK) if step >= data.total_steps else ("preempted", EXIT_PREEMPTED)
    result = TrainResult(
        status=status,
        step=step,
        total_steps=data.total_steps,
        loss=reporter.loss,
        eval_loss=reporter.eval_loss,
        tokens_per_second=reporter.tokens_per_second(),
        checkpoint=checkpoints.step_dir(config, latest) if latest is not None else None,
        evaluation=scored and scored.results,
    )
    if scored and scored.problem:  # loud, and the checkpoint stays
        result, code = result.model_copy(update={"status": "failed", "error": scored.problem}), EXIT_FAILED
    return Outcome(result, code, reporter.history)
