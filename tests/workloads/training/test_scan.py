"""Decoder layers scanned over repetitions of the attention pattern (training/scan.py) compute what
the unrolled layers compute, the frozen weights held stacked: logits, losses and LoRA gradients,
greedy decoding with the KV cache, training resumed across the two layouts, whose checkpoints keep
the unrolled one, and training on a mesh of four devices."""

import functools
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from gemma_devcluster import tiny
from gemma_workloads.config import EXIT_OK, TrainConfig
from gemma_workloads.training import attention, loss, mesh, remat, scan
from gemma_workloads.training import trainer as train
from gemma_workloads.training.evaluation import greedy
from tests.workloads.training import tiny_lora
from tests.workloads.training.test_train import elsewhere, lora_params, make_config, run_cli

S, G = "sliding_attention", "full_attention"
FIVE = tiny.TinyConfig(layer_types=(S, G, S, G, S))  # two periods of (sliding, global), then one layer


@functools.cache
def five_layer_model(*, scanned: bool, remat_policy: str = "full", path: str = "reference"):
    """The same random weights and adapter each time; the tests only read the models."""
    model = tiny_lora.random_lora_model(sizes=FIVE)
    attention.use_attention(model, path)
    remat.use_remat(model, remat_policy)
    if scanned:
        assert scan.scan_layers(model, mesh.make_mesh(None)) == "scanned: 2 x 2 layers, then 1 unrolled"
    return model


def flat(state: nnx.State) -> dict[tuple, np.ndarray]:
    return {path: np.asarray(var[...]) for path, var in nnx.to_flat_state(state)}


def test_the_scanned_unit_is_the_attention_pattern_s_period():
    assert scan.period_of([S, S, S, S, S, G] * 10) == 6, "Gemma 4 31B: five sliding, one global"
    assert scan.period_of([S, G, S, G, S]) == 2, "a last period cut short runs unrolled after the scan"
    assert scan.period_of([S, S, S, G]) == 4, "a pattern that does not repeat is one period"


def test_the_base_weights_are_held_stacked():
    model = five_layer_model(scanned=True)
    decoder = scan.decoder(model)
    assert decoder is not None and len(decoder.blocks) == 2 and len(decoder.rest) == 1
    stacked = [v for b in decoder.blocks for _, v in nnx.iter_graph(b) if isinstance(v, nnx.Param)]
    assert all(v.shape[0] == 2 for v in stacked), "each position's weights: one array over the two periods"
    base = [v for v in stacked if not isinstance(v, nnx.LoRAParam)]
    assert base and all(v.get_metadata("out_sharding")[0] is None for v in base), "the stacked axis is whole"
    unrolled = five_layer_model(scanned=False)
    sizes = [sum(v.size for v in jax.tree.leaves(nnx.state(m, nnx.Param))) for m in (model, unrolled)]
    assert sizes[0] == sizes[1], "the same parameters, restacked"


def test_scanned_layers_give_the_unrolled_loss_and_gradients():
    """The fast path's pieces inside the scan: `dots` remat around each scanned layer, the XLA
    attention kernel and the chunked loss. The default remat and attention (full, Tunix's) are trained
    scanned by the resume test below; the loss runs after the decoder, outside the scan, so whole
    logits or chunks do not touch it; the forward alone (evaluation's) is the greedy test's."""
    batch = tiny_lora.packed_batch()
    loss_fn = loss.trainer_loss(32)
    unrolled = five_layer_model(scanned=False, remat_policy="dots", path="xla")
    scanned = five_layer_model(scanned=True, remat_policy="dots", path="xla")
    value, grads = tiny_lora.lora_grad_state(unrolled, loss_fn, batch)
    scanned_value, scanned_grads = tiny_lora.lora_grad_state(scanned, loss_fn, batch)
    assert scanned_value == pytest.approx(value, rel=1e-6)
    decoder = scan.decoder(scanned)
    assert decoder is not None
    expected, got = flat(grads), flat(scan.unrolled(scanned_grads, decoder))
    assert got.keys() == expected.keys() and any(p[:2] == ("layers", 4) for p in got), "every layer's LoRA"
    for key, value in expected.items():
        tiny_lora.assert_close(got[key], value, "float32")


def test_greedy_decoding_with_the_kv_cache_is_the_same_scanned():
    """Evaluation's decoding: a prefill, then a token at a time through the stacked cache."""
    prompts = [np.arange(6, 11, dtype=np.int32), np.arange(40, 52, dtype=np.int32)]
    answers = [
        greedy.generate(five_layer_model(scanned=s), prompts, max_new_tokens=6, stop_ids={1}, batch_size=2)
        for s in (False, True)
    ]
    assert answers[0] == answers[1] and all(len(a) == 6 for a in answers[1])


@pytest.fixture(scope="module")
def unrolled(tmp_path_factory) -> tuple[TrainConfig, train.Outcome]:
    """Four steps of the seed recipe (LoRA dropout included) on a five-layer checkpoint, unrolled,
    checkpointed at steps 2 and 4."""
    tmp = tmp_path_factory.mktemp("unrolled")
    model = tiny.write_checkpoint(tmp / "five-layers", FIVE, shards=1)
    config = make_config(tmp, str(model.path), steps=4, warmup_steps=0, checkpoint_every=2, scan_layers=False)
    config = config.model_copy(update={"dataset": config.dataset.model_copy(update={"eval_fraction": 0.0})})
    return config, train.run(config)


def assert_same_adapter(checkpoint_dir: str, expected_dir: str, atol: float = 1e-4) -> None:
    ours, theirs = lora_params(checkpoint_dir, 4), lora_params(expected_dir, 4)
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}
    assert "layers/4/mlp/down_proj/kernel_lora_b/value" in ours, "the layer after the scan, at its own index"
    for key in ours:  # Adam's normalised steps amplify differences of summation order a little
        np.testing.assert_allclose(ours[key], theirs[key], rtol=0, atol=atol, err_msg=key)


@pytest.mark.slow
def test_a_run_resumes_across_the_layouts_and_keeps_the_unrolled_checkpoints(unrolled, tmp_path):
    """The unrolled run's step 2 (LoRA and Adam state) resumed with the layers scanned: steps 3 and
    4 are the same, and so is the checkpoint they write, key for key."""
    config, first = unrolled
    resumed = config.model_copy(update={"output_dir": str(tmp_path / "resumed"), "scan_layers": True})
    shutil.copytree(config.checkpoint_dir, resumed.checkpoint_dir, ignore=shutil.ignore_patterns("4"))
    second = train.run(resumed)
    assert [p.step for p in second.history] == [3, 4]
    np.testing.assert_allclose([p.loss for p in second.history], [p.loss for p in first.history[2:]], rtol=1e-5)
    assert_same_adapter(resumed.checkpoint_dir, config.checkpoint_dir)


@pytest.mark.slow
def test_scanned_layers_on_four_devices_train_as_unrolled_ones_on_one(unrolled, tmp_path):
    """The default (1, 4) mesh: the stacked weights and factors keep their layer axis whole and the
    rest sharded as Tunix annotates them (replicated where tp does not divide)."""
    config, first = unrolled
    scanned = elsewhere(config, tmp_path, scan_layers=True)
    ended = run_cli(scanned, tmp_path, "four-devices", devices=4)
    assert ended.code == EXIT_OK, ended.stderr
    assert "mesh fsdp=1 x tp=4" in ended.stderr and "layers scanned: 2 x 2 layers, then 1 unrolled" in ended.stderr
    np.testing.assert_allclose([p.loss for p in ended.progress], [p.loss for p in first.history], rtol=2e-4)
    # Four devices sum in another order than one, which Adam's normalised steps amplify (a few 1e-4
    # after four steps; test_train's sharded run allows 3e-3 after thirty).
    assert_same_adapter(scanned.checkpoint_dir, config.checkpoint_dir, atol=1e-3)
