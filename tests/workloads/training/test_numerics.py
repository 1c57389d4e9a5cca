"""Training numerics on a model shaped like the release, in bf16 (what TPU runs use) and float32, at
the seed paper's batch shape (micro-batch 1, 8 accumulation steps): a finite, falling loss; float32
adapters and optimizer state; a non-finite loss stops the run, naming the step, with finite checkpoints."""

import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from gemma_devcluster import tiny
from gemma_operator.failure_policy import Action, action_for
from gemma_workloads import runner
from gemma_workloads.config import EXIT_FAILED, EXIT_OK, TrainConfig, TrainResult
from gemma_workloads.training import trainer as train
from tests.workloads.training.test_train import lora_params

DTYPES = ("bfloat16", "float32")
STEPS = 12


def release_config(tmp: Path, model: Path, dtype: str, **overrides) -> TrainConfig:
    dataset = tmp / "chat.jsonl"
    if not dataset.exists():
        tiny.write_dataset(dataset, "chat", n=64)
    values = dict(
        model_path=str(model),
        model_dtype=dtype,
        dataset=dict(path=str(dataset), format="chat", max_seq_len=64),
        lora=dict(rank=8, alpha=16.0),
        steps=STEPS,
        batch_size=8,
        micro_batch_size=1,
        learning_rate=1e-2,
        warmup_steps=1,
        checkpoint_every=STEPS,
        log_every=1,
        output_dir=str(tmp / "out"),
        termination_log=str(tmp / "termination-log"),
    )
    return TrainConfig.model_validate(values | overrides)


def test_adam_hyperparameters_stay_float32_for_bf16_parameters(tmp_path):
    """optax.inject_hyperparams stores b1, b2, eps in the parameters' dtype unless told otherwise
    (optax schedules/_inject.py); in bf16, b2 = 0.999 is 1.0, so the bias correction 1 - b2**t
    (optax tree_utils/_tree_math.py) is 0 and the first update is NaN."""
    config = release_config(tmp_path, tmp_path, "bfloat16", learning_rate=1e-4, warmup_steps=0)
    params = {"a": jnp.full((4,), 0.02, jnp.bfloat16)}
    grads = {"a": jnp.asarray([1e-3, 0.0, -2e-3, 5e-4], jnp.bfloat16)}
    optimizer = train.optimizer(config, STEPS)
    state = optimizer.init(params)
    assert state.hyperparams["b2"].dtype == jnp.float32 and float(state.hyperparams["b2"]) == pytest.approx(0.999)
    updates, _ = optimizer.update(grads, state, params)
    np.testing.assert_allclose(np.asarray(updates["a"], np.float32), [-1e-4, 0.0, 1e-4, -1e-4], rtol=1e-2)


@pytest.fixture(scope="module")
def release_runs(tmp_path_factory, tiny_release) -> dict[str, tuple[TrainConfig, train.Outcome]]:
    out = {}
    for dtype in DTYPES:
        config = release_config(tmp_path_factory.mktemp(dtype), tiny_release.path, dtype)
        out[dtype] = config, train.run(config)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_release_shape_trains_with_a_finite_falling_loss(release_runs, dtype):
    config, outcome = release_runs[dtype]
    losses = [p.loss for p in outcome.history]
    assert outcome.exit_code == EXIT_OK and len(losses) == STEPS and np.isfinite(losses).all(), losses
    assert np.mean(losses[-3:]) < 0.9 * losses[0], losses
    params = lora_params(config.checkpoint_dir, STEPS)
    assert {v.dtype for v in params.values()} == {np.dtype(np.float32)}, "the adapter is checkpointed in float32"


def test_bf16_training_follows_float32_training(release_runs):
    (_, bf16), (_, fp32) = (release_runs[d] for d in DTYPES)
    np.testing.assert_allclose([p.loss for p in bf16.history], [p.loss for p in fp32.history], rtol=0.05)


def saved_float_dtypes(item: Path) -> set[np.dtype]:
    """The float dtypes of an Orbax item as saved (its metadata; no array is read)."""
    import orbax.checkpoint as ocp

    meta = ocp.PyTreeCheckpointer().metadata(item).item_metadata.tree
    return {np.dtype(m.dtype) for m in jax.tree.leaves(meta) if np.dtype(m.dtype).kind == "f"}


def test_a_small_learning_rate_step_moves_the_float32_adapter(release_runs):
    """The bf16 run checkpoints its adapter and Adam's state in float32. A 1e-5 AdamW step (the
    tail of the paper's 1e-4 cosine schedule) then moves every adapter weight, weight decay
    included; stored in bf16, almost none of them would have changed."""
    config, _ = release_runs["bfloat16"]
    step = Path(config.checkpoint_dir) / str(STEPS)
    assert (
        saved_float_dtypes(step / "model_params")
        == saved_float_dtypes(step / "optimizer_state")
        == {np.dtype(np.float32)}
    )
    adapter = lora_params(config.checkpoint_dir, STEPS)
    small = config.model_copy(
        update={"learning_rate": 1e-5, "lr_schedule": "constant", "warmup_steps": 0, "weight_decay": 0.1}
    )
    optimizer, rng = train.optimizer(small, STEPS), np.random.default_rng(0)
    grads = {k: jnp.asarray(rng.normal(0.0, 1e-3, v.shape), jnp.float32) for k, v in adapter.items()}
    updates, _ = optimizer.update(grads, optimizer.init(adapter), adapter)
    kept_in_bf16 = 0
    for name, before in adapter.items():
        after = np.asarray(optax.apply_updates(before, updates[name]))
        assert after.dtype == np.float32 and (after != before).mean() > 0.99, name
        kept_in_bf16 += int((after.astype(ml_dtypes.bfloat16) == before.astype(ml_dtypes.bfloat16)).sum())
    assert kept_in_bf16 > 0.8 * sum(v.size for v in adapter.values()), "in bf16, most of the step rounds away"


def test_a_non_finite_loss_stops_the_run_naming_the_step(release_runs, tiny_release, tmp_path, capsys):
    """A base weight holding inf (a corrupt conversion, say) makes every loss NaN: the run fails at
    step 1 as an application error (exit 1, never retried), and its checkpoints hold only the
    finite adapter it started with. The bf16 run's settings, so its compiled step is reused."""
    from safetensors.numpy import load_file, save_file

    model = Path(shutil.copytree(tiny_release.path, tmp_path / "model"))
    weights = load_file(model / "model.safetensors")
    weights["model.layers.1.mlp.up_proj.weight"][0, 0] = np.inf
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    reference, _ = release_runs["bfloat16"]
    config = reference.model_copy(
        update={
            "model_path": str(model),
            "checkpoint_every": 1,
            "output_dir": str(tmp_path / "out"),
            "termination_log": str(tmp_path / "termination-log"),
        }
    )
    path = tmp_path / "config.json"
    path.write_text(config.dumps())
    assert runner.main(["train", "--config", str(path)]) == EXIT_FAILED
    assert action_for(EXIT_FAILED) is Action.FAIL
    result = TrainResult.model_validate_json(Path(config.termination_log).read_text())
    assert result.status == "failed" and result.error.startswith("step 1: the loss is nan"), result.error
    assert result.error in capsys.readouterr().err
    assert not (tmp_path / "out" / "progress.json").exists(), "a NaN step is not reported as progress"
    steps = sorted(int(p.name) for p in Path(config.checkpoint_dir).iterdir() if p.name.isdigit())
    assert steps, "the step 1 checkpoint was written before the loss was read"
    for step in steps:
        for name, value in lora_params(config.checkpoint_dir, step).items():
            assert np.isfinite(value).all() and (np.abs(value).max() == 0) == ("lora_b" in name), (step, name)
