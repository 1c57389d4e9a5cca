"""The training workload, run for real on a tiny Gemma 4: learning, loss masking, checkpoints,
preemption and resume, the sharded mesh, and bad inputs."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from gemma_devcluster import tiny
from gemma_workloads import runner
from gemma_workloads.config import (
    EXIT_INVALID_INPUT,
    EXIT_OK,
    EXIT_PREEMPTED,
    LORA_METADATA,
    DatasetConfig,
    LoraMetadata,
    Progress,
    TrainConfig,
    TrainResult,
)
from gemma_workloads.data import Example, TextCodec, read_examples
from gemma_workloads.merging import checkpoint_reader as lora_checkpoint
from gemma_workloads.training import batches, lora, loss, mesh
from gemma_workloads.training import checkpoint_writer as checkpoints
from gemma_workloads.training import flops as metrics
from gemma_workloads.training import trainer as train
from gemma_workloads.training.model_loader import load_model, read_hf_config, set_remat, tunix_config

FORMATS = ("chat", "prompt-completion", "text")
STEPS, EVERY = 30, 5


def make_config(tmp: Path, model_path: str, fmt: str = "chat", **overrides) -> TrainConfig:
    """The seed recipe in miniature: LoRA with dropout, warmup + cosine, accumulation (8 = 2 x 4),
    remat, an eval split; log every step."""
    dataset = tmp / f"{fmt}.jsonl"
    if not dataset.exists():
        tiny.write_dataset(dataset, fmt, n=64)
    values = dict(
        model_path=model_path,
        model_dtype="float32",
        dataset=dict(path=str(dataset), format=fmt, max_seq_len=64, eval_fraction=0.1),
        lora=dict(rank=8, alpha=16.0, dropout=0.05),
        steps=STEPS,
        batch_size=8,
        micro_batch_size=4,
        learning_rate=3e-3,
        warmup_steps=3,
        checkpoint_every=EVERY,
        keep_checkpoints=2,
        log_every=1,
        output_dir=str(tmp / "out"),
        termination_log=str(tmp / "termination-log"),
    )
    return TrainConfig.model_validate(values | overrides)


def elsewhere(config: TrainConfig, tmp: Path, **changes) -> TrainConfig:
    """The same run writing to another folder."""
    return config.model_copy(
        update={"output_dir": str(tmp / "out"), "termination_log": str(tmp / "termination-log")} | changes
    )


def lora_params(checkpoint_dir: str, step: int) -> dict[str, np.ndarray]:
    """`model_params` of a step, restored by the merge's own reader: host arrays, no model."""
    restored = lora_checkpoint.restore_params(lora_checkpoint.locate(checkpoint_dir, step, None))
    return {
        "/".join(str(getattr(k, "key", k)) for k in path): v
        for path, v in jax.tree_util.tree_leaves_with_path(restored)
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_sharded) -> dict[str, tuple[TrainConfig, train.Outcome]]:
    """One uninterrupted in-process run per dataset format (they share one compiled program)."""
    out = {}
    for fmt in FORMATS:
        config = make_config(tmp_path_factory.mktemp(fmt), str(tiny_sharded.path), fmt)
        if fmt == "text":  # packed: three examples a row; same shapes, so the same compiled step
            config = config.model_copy(update={"dataset": config.dataset.model_copy(update={"packing": True})})
        out[fmt] = config, train.run(config)
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_training_reduces_loss(runs, fmt):
    config, outcome = runs[fmt]
    assert outcome.exit_code == EXIT_OK and outcome.result.step == STEPS
    if config.dataset.packing:
        assert len(train.prepare_data(config).train.rows) == 20, "57 examples of 21-22 tokens, 3 a row where they fit"
    losses = [p.loss for p in outcome.history]
    assert len(losses) == STEPS
    assert np.mean(losses[-5:]) < 0.85 * losses[0], losses
    evals = [p.eval_loss for p in outcome.history]
    assert evals[-1] < 0.85 * evals[0], "held-out loss must fall too"


def test_results_for_the_operator(runs):
    """The termination log and stdout of the CLI are checked on the subprocess runs below."""
    config, outcome = runs["chat"]
    result = outcome.result
    assert result.status == "succeeded" and result.checkpoint == f"{config.checkpoint_dir}/{STEPS}"
    assert result.loss == outcome.history[-1].loss and result.tokens_per_second > 0
    progress = Progress.model_validate_json((Path(config.output_dir) / "progress.json").read_text())
    assert progress == outcome.history[-1] and progress.step == progress.total_steps == STEPS
    assert progress.mfu is None, "no peak is known for a CPU"


def test_checkpoint_layout_is_the_documented_one(runs):
    config, _ = runs["chat"]
    root = Path(config.checkpoint_dir)
    assert sorted(p.name for p in root.iterdir()) == ["25", "30", LORA_METADATA]  # keep_checkpoints=2
    assert LoraMetadata.model_validate_json((root / LORA_METADATA).read_text()) == checkpoints.lora_metadata(config)
    step = json.loads((root / "30" / "_CHECKPOINT_METADATA").read_text())
    assert step["custom_metadata"][checkpoints.DATA_POSITION]["micro_batches"] == STEPS * 2
    params = lora_params(str(root), 30)
    layer0 = {k.removeprefix("layers/0/"): v.shape for k, v in params.items() if k.startswith("layers/0/")}
    assert layer0 == {  # tiny: D=96, F=192, 4 heads of 32, 2 KV heads; rank 8
        "attn/q_einsum/w_lora_a/value": (96, 8),
        "attn/q_einsum/w_lora_b/value": (8, 4, 32),
        "attn/kv_einsum/w_lora_a/value": (96, 8),
        "attn/kv_einsum/w_lora_b/value": (8, 2, 2, 32),
        "attn/attn_vec_einsum/w_lora_a/value": (4, 32, 8),
        "attn/attn_vec_einsum/w_lora_b/value": (8, 96),
        "mlp/gate_proj/kernel_lora_a/value": (96, 8),
        "mlp/gate_proj/kernel_lora_b/value": (8, 192),
        "mlp/up_proj/kernel_lora_a/value": (96, 8),
        "mlp/up_proj/kernel_lora_b/value": (8, 192),
        "mlp/down_proj/kernel_lora_a/value": (192, 8),
        "mlp/down_proj/kernel_lora_b/value": (8, 96),
    }
    assert params["layers/1/attn/k_einsum/w_lora_b/value"].shape == (8, 1, 64), "global layer: K=V, one KV head of 64"
    assert all(np.abs(v).max() > 0 for k, v in params.items() if "lora_b" in k), "every adapter was trained"


@pytest.fixture
def tiny_on_one_device(tiny_sharded):
    device_mesh = mesh.make_mesh(None)
    with mesh.active(device_mesh):
        yield device_mesh, load_model(str(tiny_sharded.path), mesh=device_mesh)


def test_prompt_tokens_do_not_count(tmp_path, tiny_sharded, tiny_on_one_device):
    """With attention cut off, a position's prediction depends on its own token only, so two chats
    with the same answers but different questions must give the same loss, if and only if the
    questions are left out of it."""
    device_mesh, (model, _) = tiny_on_one_device
    config = make_config(tmp_path, str(tiny_sharded.path), lora=dict(rank=8, alpha=16.0))  # no dropout: deterministic
    model, _ = train.adapt(model, config, device_mesh)
    for layer in model.layers:
        layer.attn.attn_vec_einsum.w[...] = 0.0
    trainer = train.make_trainer(model, config, STEPS, device_mesh)
    codec = TextCodec(config.model_path)
    answers = ["The capital of Peru is Lima.", "The capital of Kenya is Nairobi."]

    def batch(questions: list[str]) -> dict:
        path = tmp_path / "q.jsonl"
        path.write_text(
            "".join(
                json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n"
                for q, a in zip(questions, answers, strict=True)
            )
        )
        rows = batches.layout(read_examples(DatasetConfig(path=str(path)), codec).items, 48, packing=False)
        return rows.take(np.arange(len(rows)))

    compiled = nnx.jit(lambda m, b: trainer.loss_fn(m, **batches.model_inputs(b)))

    def loss(b: dict) -> float:
        return float(compiled(trainer.model, b))

    short, long = batch(["Peru?", "Kenya?"]), batch(["Which city is the capital of Peru?", "Name Kenya's capital."])
    assert not np.array_equal(short["tokens"], long["tokens"])
    assert loss(short) == pytest.approx(loss(long), abs=1e-6)
    every_token = [dict(b, loss_mask=b["segment_ids"] > 0) for b in (short, long)]
    assert abs(loss(every_token[0]) - loss(every_token[1])) > 1e-3, "the test must be able to fail"


class Bigram(nnx.Module):
    """A next-token model with the Gemma model's call signature: the weighting is the loss's, not the model's."""

    def __init__(self, vocab: int):
        self.logits = nnx.Param(jax.random.normal(jax.random.key(0), (vocab, vocab)))

    def __call__(self, tokens, positions, cache, attention_mask):
        return self.logits[...][tokens], None


def test_every_trained_token_of_an_accumulated_step_weighs_the_same():
    """Rows with 2 and 30 trained tokens, one micro-batch each and accumulated (optax.MultiSteps, which
    Tunix uses, averages micro-batch gradients: optax/transforms/_accumulation.py), give the loss and
    gradient of the two rows as one batch. Averaging micro-batch means instead would weigh the
    2-token answer as much as the 30-token one."""
    tokens = np.random.default_rng(0).integers(0, 64, size=(2, 32)).astype(np.int32)
    answers = [np.r_[np.zeros(30, bool), np.ones(2, bool)], np.r_[np.zeros(2, bool), np.ones(30, bool)]]
    rows = batches.layout([Example(t, m) for t, m in zip(tokens, answers, strict=True)], 32, packing=False)
    model = Bigram(64)

    @nnx.jit
    def value_and_grad(m, batch):
        return nnx.value_and_grad(lambda m: loss.token_weighted_nll(m, **batches.model_inputs(batch)))(m)

    whole_loss, whole_grad = value_and_grad(model, batches.Batches(rows, 2, seed=0).next())
    accumulated = batches.Batches(rows, 1, seed=0, accumulation=2)
    micro = [accumulated.next() for _ in range(2)]
    losses, grads = zip(*(value_and_grad(model, b) for b in micro), strict=True)
    assert np.mean(losses) == pytest.approx(float(whole_loss), rel=1e-6)
    whole = whole_grad.logits[...]
    np.testing.assert_allclose(sum(g.logits[...] for g in grads) / 2, whole, rtol=1e-5, atol=1e-8)
    own_means = (
        sum(g.logits[...] * 32 / (2 * b["loss_mask"][:, 1:].sum()) for g, b in zip(grads, micro, strict=True)) / 2
    )
    assert np.abs(own_means - whole).max() > 0.1 * np.abs(whole).max(), "the test must be able to fail"


def test_remat_recomputes_each_decoder_layer_with_the_same_gradients(
    tmp_path, tiny_sharded, tiny_on_one_device, token_ids
):
    device_mesh, (model, _) = tiny_on_one_device
    config = make_config(tmp_path, str(tiny_sharded.path), lora=dict(rank=8, alpha=16.0), gradient_checkpointing=True)
    model, _ = train.adapt(model, config, device_mesh)
    assert lora.lora_parameter_count(model) > 0, "LoRA parameters survive remat (Qwix creates them before it is on)"
    for path, var in nnx.iter_graph(model):
        if isinstance(var, nnx.LoRAParam) and path[-1].endswith("lora_b"):
            var[...] = np.full(var.shape, 0.01, np.float32)  # a non-zero adapter, so every gradient matters
    batch = {
        "tokens": token_ids,
        "loss_mask": np.ones_like(token_ids, bool),
        "segment_ids": np.ones_like(token_ids),
        "positions": np.tile(np.arange(token_ids.shape[1], dtype=np.int32), (len(token_ids), 1)),
    }

    def grad():  # a new function each time: nnx reuses a function's trace for the same graph
        return nnx.value_and_grad(lambda m: peft_trainer_loss(m, batch), argnums=nnx.DiffState(0, nnx.LoRAParam))

    assert str(jax.make_jaxpr(grad())(model)).count("remat") == len(model.layers)
    with_remat = nnx.jit(grad())(model)
    set_remat(model, False)
    assert str(jax.make_jaxpr(grad())(model)).count("remat") == 0
    without = nnx.jit(grad())(model)
    for a, b in zip(jax.tree.leaves(with_remat), jax.tree.leaves(without), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)  # recomputed, so fused differently


def peft_trainer_loss(model, batch: dict):
    from tunix.sft import peft_trainer

    return peft_trainer.PeftTrainer(model, optax.sgd(0.0), peft_trainer.TrainingConfig(eval_every_n_steps=1)).loss_fn(
        model, **batches.model_inputs(batch)
    )


def test_learning_rate_schedules(tmp_path, tiny_sharded):
    def at(kind: str, steps: list[int]) -> list[float]:
        config = make_config(tmp_path, str(tiny_sharded.path), lr_schedule=kind, learning_rate=1.0, warmup_steps=10)
        return [float(train.schedule(config, 110)(s)) for s in steps]

    assert at("cosine", [0, 5, 10, 60, 110]) == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0], abs=1e-6)
    assert at("linear", [0, 5, 10, 60, 110]) == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0], abs=1e-6)
    assert at("constant", [0, 5, 10, 110]) == pytest.approx([0.0, 0.5, 1.0, 1.0], abs=1e-6)
    for kind in ("cosine", "linear", "constant"):  # no warmup: the peak from the first step
        config = make_config(tmp_path, str(tiny_sharded.path), lr_schedule=kind, learning_rate=1.0, warmup_steps=0)
        assert float(train.schedule(config, 110)(0)) == pytest.approx(1.0), kind


def test_a_partly_written_checkpoint_is_never_resumed_from(runs, tmp_path, tiny_on_one_device):
    """A save cut short (SIGKILL at the end of the grace period) leaves Orbax's temporary folder:
    the next run resumes from the latest complete step and removes the leftover."""
    device_mesh, (model, model_config) = tiny_on_one_device
    config, _ = runs["chat"]
    resumed = elsewhere(config, tmp_path, steps=40)
    shutil.copytree(config.checkpoint_dir, resumed.checkpoint_dir)
    partial = Path(resumed.checkpoint_dir) / "35.orbax-checkpoint-tmp-1795336328"
    shutil.copytree(Path(resumed.checkpoint_dir) / "30" / "model_params", partial / "model_params")
    model, _ = train.adapt(model, resumed, device_mesh)
    trainer = train.make_trainer(model, resumed, 40, device_mesh)
    data = train.prepare_data(resumed)
    assert trainer.train_steps == 30 and train.resume_position(trainer, resumed, data) == 60
    trainer.checkpoint_manager.close()
    assert not partial.exists()


@dataclass
class Ended:
    code: int
    progress: list[Progress]
    stderr: str
    result: TrainResult


def run_cli(
    config: TrainConfig,
    tmp: Path,
    name: str,
    *,
    sigterm_at: int | None = None,
    devices: int = 1,
    env: dict[str, str] | None = None,
) -> Ended:
    """`python -m gemma_workloads train` in a subprocess; SIGTERM once it reports `sigterm_at`."""
    path = tmp / f"{name}.json"
    path.write_text(config.dumps())
    err = tmp / f"{name}.stderr"
    env = (
        os.environ
        | {"XLA_FLAGS": f"{os.environ['XLA_FLAGS']} --xla_force_host_platform_device_count={devices}"}
        | (env or {})
    )
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gemma_workloads", "train", "--config", str(path)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
        progress = []
        for line in proc.stdout:
            progress.append(Progress.model_validate_json(line))
            if sigterm_at is not None and progress[-1].step == sigterm_at:
                proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=600)
    return Ended(
        code, progress, err.read_text(), TrainResult.model_validate_json(Path(config.termination_log).read_text())
    )


def step_of(checkpoint: str) -> int:
    return int(checkpoint.rsplit("/", 1)[1])


def test_sigterm_then_restart_ends_where_an_uninterrupted_run_ends(runs, tmp_path, capsys):
    baseline, _ = runs["chat"]
    config = elsewhere(baseline, tmp_path)

    first = run_cli(config, tmp_path, "first", sigterm_at=8)
    assert first.code == EXIT_PREEMPTED, first.stderr
    stopped = first.result.step
    assert first.result.status == "preempted" and 8 <= stopped < STEPS
    assert step_of(first.result.checkpoint) == stopped, "a final checkpoint fits in 30 s of grace"
    assert first.progress[-1].step == stopped

    no_grace = config.model_copy(update={"termination_grace_seconds": 0})
    second = run_cli(no_grace, tmp_path, "second", sigterm_at=stopped + 7)
    assert second.code == EXIT_PREEMPTED, second.stderr
    assert "no time left in the grace period" in second.stderr
    assert second.progress[0].step == stopped + 1, "resumed after the final checkpoint"
    latest = step_of(second.result.checkpoint)
    assert latest == EVERY * (second.result.step // EVERY) > stopped, "only the periodic checkpoint stands"

    (tmp_path / "third.json").write_text(config.dumps())  # the last restart runs here: its compiled code is warm
    assert runner.main(["train", "--config", str(tmp_path / "third.json")]) == EXIT_OK
    third = [Progress.model_validate_json(line) for line in capsys.readouterr().out.splitlines()]
    assert third[0].step == latest + 1 and third[-1].step == STEPS
    result = TrainResult.model_validate_json(Path(config.termination_log).read_text())
    assert result.status == "succeeded" and step_of(result.checkpoint) == STEPS

    ours, reference = lora_params(config.checkpoint_dir, STEPS), lora_params(baseline.checkpoint_dir, STEPS)
    assert ours.keys() == reference.keys()
    for key in ours:
        np.testing.assert_allclose(ours[key], reference[key], rtol=0, atol=1e-6, err_msg=key)


def test_sharded_run_matches_the_single_device_run(runs, tmp_path):
    """Four devices, the paper's default (1, 4) mesh: the tiny model's 2 and 1 KV heads do not
    divide tp=4, so those weights and their LoRA factors are replicated, the rest is sharded, and
    the run computes what the single-device run computes (up to summation order, which Adam's
    normalised steps amplify a little over 30 steps)."""
    baseline_config, baseline = runs["prompt-completion"]
    config = elsewhere(baseline_config, tmp_path, peak_tflops_per_device=0.05)  # an MFU figure on CPUs
    ended = run_cli(config, tmp_path, "sharded", devices=4)
    assert ended.code == EXIT_OK, ended.stderr
    lora_count = sum(math.prod(s) for m in tiny.lora_shapes(tiny.TinyConfig(), 8).values() for s in m.values())
    flops = metrics.flops_per_token(tunix_config(read_hf_config(config.model_path)), 64, lora_count)
    assert all(p.mfu == pytest.approx(p.tokens_per_second * flops / (4 * 0.05e12)) for p in ended.progress[1:]), (
        "MFU: the model's FLOPs at the measured rate over 4 devices' peak"
    )
    assert "mesh fsdp=1 x tp=4 over 4 cpu device(s)" in ended.stderr
    assert "replicated (does not divide the mesh): layers/0/attn/kv_einsum/w axis 1 (2 over tp)" in ended.stderr
    specs = saved_partition_specs(Path(config.checkpoint_dir) / str(STEPS) / "model_params")
    assert "tp" in specs["layers.0.attn.q_einsum.w_lora_b.value"], "4 query heads: sharded over tp"
    assert "tp" not in specs["layers.0.attn.kv_einsum.w_lora_b.value"], "2 KV heads: replicated"
    losses, reference = [p.loss for p in ended.progress], [p.loss for p in baseline.history]
    assert losses[0] == pytest.approx(reference[0], abs=1e-5)
    np.testing.assert_allclose(losses, reference, rtol=2e-4)
    ours, theirs = lora_params(config.checkpoint_dir, STEPS), lora_params(baseline_config.checkpoint_dir, STEPS)
    for key in ours:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=0, atol=3e-3, err_msg=key)


def saved_partition_specs(item: Path) -> dict[str, list]:
    """Orbax's record of how each saved array was sharded (keys are base64 of the dotted path)."""
    import base64

    return {
        base64.b64decode(k).decode(): json.loads(v)["partition_spec"]
        for k, v in json.loads((item / "_sharding").read_text()).items()
    }


@pytest.fixture(scope="module")
def bad_input_dir(tmp_path_factory, tiny_sharded) -> tuple[Path, TrainConfig]:
    tmp = tmp_path_factory.mktemp("bad")
    return tmp, make_config(tmp, str(tiny_sharded.path), steps=4, warmup_steps=0)


# Inputs broken on their own are refused before JAX is imported (test_preflight.py); these need the
# tokenised data.
BAD_CONFIG = {
    "seq too short for any example": (
        {"dataset": {"max_seq_len": 16}},
        r"max_seq_len 16 is shorter than every example",
    ),
    "warmup as long as the run": ({"warmup_steps": 4}, r"warmup_steps 4 must be smaller than the 4 training steps"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIG))
def test_bad_config_exits_2_naming_the_problem(bad_input_dir, case, capsys):
    tmp, config = bad_input_dir
    change, message = BAD_CONFIG[case]
    values = config.model_dump(mode="json")
    for key, value in change.items():
        values[key] = values[key] | value if isinstance(value, dict) and key in values else value
    assert_exits_2(tmp, values, message, capsys)


def assert_exits_2(tmp: Path, values: dict, message: str, capsys) -> None:
    path = tmp / "config.json"
    path.write_text(json.dumps(values))
    termination_log = Path(values["termination_log"])
    termination_log.unlink(missing_ok=True)
    assert runner.main(["train", "--config", str(path)]) == EXIT_INVALID_INPUT
    assert_error(capsys.readouterr().err, message)
    result = TrainResult.model_validate_json(termination_log.read_text())
    assert result.status == "failed"
    assert_error(result.error, message)
    assert not Path(values["output_dir"]).exists(), "refused before anything is written"


def assert_error(text: str, pattern: str) -> None:
    import re

    assert re.search(pattern, text), f"{pattern!r} not in {text!r}"
