"""The evaluation after training, run for real on the tiny Gemma 4: the loss is training's loss,
greedy decoding with the KV cache is greedy decoding, the baseline is the model without its
adapter, a resumed finished run only evaluates, and a figure that is not finite fails the run."""

import json
import math
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from gemma_devcluster import tiny
from gemma_workloads import runner
from gemma_workloads.config import EXIT_FAILED, EXIT_OK, LoraConfig, TrainConfig
from gemma_workloads.data import DataError, TextCodec
from gemma_workloads.training import lora, mesh
from gemma_workloads.training import trainer as train
from gemma_workloads.training.evaluation import evaluate, scores
from gemma_workloads.training.evaluation.greedy import generate
from gemma_workloads.training.evaluation.rows import eval_dataset, read_rows
from gemma_workloads.training.model_loader import load_model

MAX_SEQ_LEN = 64


# ---------------------------------------------------------------------------- scoring


@pytest.mark.parametrize(
    "answer, expected, pattern, hits",
    [
        ("The capital of Peru is Lima.", "The capital of Peru is Lima.", None, {"exactMatch": True, "contains": True}),
        (
            " The capital of Peru\nis  Lima.\n",
            "The capital of Peru is Lima.",
            None,
            {"exactMatch": True, "contains": True},
        ),
        (
            "Well: the capital of Peru is Lima.",
            "the capital of Peru is Lima.",
            None,
            {"exactMatch": False, "contains": True},
        ),
        ("The capital of Peru is Lima", "The capital of Peru is Lima.", None, {"exactMatch": False, "contains": False}),
        (
            "the capital of peru is lima.",
            "The capital of Peru is Lima.",
            None,
            {"exactMatch": False, "contains": False},
        ),
        ("It is Lima, I think.", "Lima", r"\bLima\b", {"exactMatch": False, "contains": True, "regexMatch": True}),
        ("Limassol", "Lima", r"\bLima\b", {"exactMatch": False, "contains": True, "regexMatch": False}),
        ("It is Lima.", "Lima", r"^Lima\.?$", {"exactMatch": False, "contains": True, "regexMatch": False}),
        ("anything", None, None, {}),
        ("Lima", None, "Lima|Cusco", {"regexMatch": True}),
    ],
)
def test_scoring(answer, expected, pattern, hits):
    assert scores.hits(answer, expected, pattern) == hits


def test_a_metric_without_eligible_rows_is_left_out():
    assert scores.rates([{"exactMatch": True, "contains": True}, {"exactMatch": False, "contains": True}, {}]) == {
        "exactMatch": (0.5, 2),
        "contains": (1.0, 2),
    }
    assert scores.rates([{"regexMatch": False}, {"regexMatch": True, "exactMatch": True, "contains": True}]) == {
        "exactMatch": (1.0, 1),
        "contains": (1.0, 1),
        "regexMatch": (0.5, 2),
    }
    assert scores.rates([{}, {}]) == {}


# ---------------------------------------------------------------------------- on the tiny model


def config_for(tmp: Path, model_path: str, fmt: str = "chat", **overrides) -> TrainConfig:
    dataset = tiny.write_dataset(tmp / f"{fmt}.jsonl", fmt, n=6)
    values = dict(
        model_path=model_path,
        model_dtype="float32",
        micro_batch_size=4,
        batch_size=4,
        steps=1,
        dataset=dict(path=str(dataset), format=fmt, max_seq_len=MAX_SEQ_LEN),
        evaluation=dict(path=str(dataset), max_new_tokens=8),
        output_dir=str(tmp / "out"),
    )
    return TrainConfig.model_validate(values | overrides)


def adapted(model_path: str, dtype: str = "float32", *, dropout: float = 0.0, b: float = 0.05, seed: int = 0):
    """The tiny model with LoRA on every target, its B factors random (non-zero: the adapter matters)."""
    model, _ = load_model(model_path, dtype=dtype, mesh=mesh.make_mesh(None))
    model = lora.apply_lora(model, LoraConfig(rank=4, alpha=8.0, dropout=dropout), seed=seed)
    if dropout:
        model.set_attributes(qwix_rngs=nnx.Rngs(dropout=seed))
    rng = np.random.default_rng(seed)
    for path, var in nnx.iter_graph(model):
        if isinstance(var, nnx.LoRAParam) and path[-1].endswith("lora_b"):
            var[...] = jnp.asarray(rng.normal(0, b, var.shape), jnp.float32)
    return model


@pytest.fixture(scope="module")
def chat(tmp_path_factory, tiny_sharded):
    config = config_for(tmp_path_factory.mktemp("chat"), str(tiny_sharded.path))
    codec = TextCodec(config.model_path)
    return config, codec, read_rows(eval_dataset(config.dataset, config.evaluation), codec, config.evaluation)


def test_rows_come_from_the_eval_file_or_the_held_out_lines(chat, tmp_path):
    config, codec, rows = chat
    assert [r.line for r in rows] == [1, 2, 3, 4, 5, 6]
    lines = Path(config.dataset.path).read_text().splitlines()
    assert [r.expected for r in rows] == [json.loads(x)["messages"][-1]["content"] for x in lines]
    assert all(np.array_equal(r.prompt, r.examples[0].tokens[: len(r.prompt)]) for r in rows), "training's tokens"
    held_out = config.model_copy(
        update={"evaluation": config.evaluation.model_copy(update={"path": None, "max_rows": 1})}
    )
    examples = [e for r in rows for e in r.examples]
    assert [r.line for r in evaluate.prepare(held_out, codec, [examples[4], examples[2]])] == [3], "file order, capped"
    with pytest.raises(DataError, match=r"the held-out split is empty: set dataset\.eval_fraction or evaluation\.path"):
        evaluate.prepare(held_out, codec, [])
    longest = max(len(r.prompt) for r in rows)
    tight = config.evaluation.model_copy(update={"max_new_tokens": MAX_SEQ_LEN - longest + 1})
    with pytest.raises(
        DataError,
        match=rf"chat\.jsonl:\d: the prompt of {longest} tokens plus evaluation\.max_new_tokens "
        rf"{tight.max_new_tokens} exceeds dataset\.max_seq_len {MAX_SEQ_LEN}",
    ):
        read_rows(eval_dataset(config.dataset, tight), codec, tight)


def test_eval_loss_is_the_mean_training_loss_per_answer_token(chat, tiny_sharded):
    """Computed again from the model's logits, one example at a time, in float64: the mean NLL of
    the answer tokens (the loss mask training uses), over 6 rows in 2 batches (the second padded)."""
    config, codec, rows = chat
    model = adapted(str(tiny_sharded.path))
    value = evaluate.mean_loss(model, rows, MAX_SEQ_LEN, batch_size=4)
    nll, count, every = 0.0, 0, []
    for e in (e for r in rows for e in r.examples):
        t = len(e)
        logits, _ = model(jnp.asarray(e.tokens[None]), jnp.arange(t)[None], None, jnp.tril(jnp.ones((1, t, t), bool)))
        x = np.asarray(logits[0, :-1], np.float64)
        top = x.max(axis=-1, keepdims=True)
        logp = x - top - np.log(np.exp(x - top).sum(axis=-1, keepdims=True))
        token_nll = -logp[np.arange(t - 1), e.tokens[1:]]
        nll += token_nll[e.loss_mask[1:]].sum()
        count += e.loss_mask[1:].sum()
        every.extend(token_nll)
    assert count == sum(int(e.loss_mask[1:].sum()) for r in rows for e in r.examples) and len(rows) == 6
    assert value == pytest.approx(nll / count, rel=1e-5)
    assert abs(value - np.mean(every)) > 1e-3, "the test must be able to fail: the prompt tokens are left out"


def reference_greedy(model, prompt: np.ndarray, max_new_tokens: int, stop_ids: set[int]) -> list[int]:
    """Greedy decoding the slow way: a full forward over the whole sequence for every new token,
    without a cache. The sequence is right-padded to one length (one compiled program): with a
    causal mask, what follows a position cannot change its logits."""
    length = len(prompt) + max_new_tokens
    forward = nnx.jit(
        lambda m, tokens: m(tokens, jnp.arange(length)[None], None, jnp.tril(jnp.ones((1, length, length), bool)))[0]
    )
    ids, new = list(prompt), []
    for _ in range(max_new_tokens):
        logits = forward(model, jnp.asarray([ids + [0] * (length - len(ids))], jnp.int32))
        new.append(int(jnp.argmax(logits[0, len(ids) - 1])))
        ids.append(new[-1])
        if new[-1] in stop_ids:
            break
    return new


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_decoding_with_the_cache_is_argmax_over_full_forwards(chat, tiny_sharded, dtype):
    """Prompts of different lengths in one left-padded batch, longer than the sliding window (16),
    so the ring cache of the sliding layers wraps; 3 prompts in batches of 2 (the last filled)."""
    config, codec, rows = chat
    model = adapted(str(tiny_sharded.path), dtype, b=0.2)
    prompts = [r.prompt for r in rows[:2]] + [rows[0].prompt[:9]]
    assert len({len(p) for p in prompts}) > 1 and max(len(p) for p in prompts) > 16
    stops = codec.stop_ids | {codec.end_of_turn_id}
    got = generate(model, prompts, max_new_tokens=12, stop_ids=stops, batch_size=2)
    want = [reference_greedy(model, p, 12, stops) for p in prompts]
    assert got == want
    assert len({tuple(g) for g in got}) > 1, "the test must be able to fail: the answers differ"


def test_the_baseline_is_the_model_without_its_adapter(chat, tiny_sharded):
    config, codec, rows = chat
    model = adapted(str(tiny_sharded.path), b=0.2)
    tuned_state = jax.tree.map(np.asarray, lora.lora_state(model).to_pure_dict())
    result = evaluate.evaluate(model, config, rows, codec)
    base_model, _ = load_model(str(tiny_sharded.path), mesh=mesh.make_mesh(None))
    base = evaluate.score(base_model, rows, config, codec)
    assert result.base.answers == base.answers and result.base.loss == pytest.approx(base.loss, rel=1e-6)
    figures = {r.name: r for r in result.results}
    assert (
        figures["evalLoss"].baseline == result.base.loss and figures["evalLoss"].value != figures["evalLoss"].baseline
    )
    assert set(figures) == {"evalLoss", "perplexity", "exactMatch", "contains"}, "no row has expected_regex"
    assert figures["perplexity"].value == pytest.approx(math.exp(figures["evalLoss"].value))
    after = jax.tree.map(np.asarray, lora.lora_state(model).to_pure_dict())
    assert all(
        np.array_equal(a, b) for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(tuned_state), strict=True)
    ), "the adapter is restored after the baseline"

    fresh = lora.apply_lora(load_model(str(tiny_sharded.path), mesh=mesh.make_mesh(None))[0], LoraConfig(rank=4))
    for r in evaluate.evaluate(fresh, config, rows, codec).results:  # B starts at zero: the adapter adds nothing
        assert r.value == r.baseline, r


def test_lora_dropout_is_off_while_evaluating(chat, tiny_sharded):
    """Qwix applies LoRA dropout on every call; the evaluation of a model trained with dropout is
    that of the same weights without it, every time."""
    config, codec, rows = chat
    with_dropout = adapted(str(tiny_sharded.path), dropout=0.5, b=0.2)
    without = adapted(str(tiny_sharded.path), dropout=0.0, b=0.2)
    first, second = (evaluate.score(with_dropout, rows, config, codec) for _ in range(2))
    third = evaluate.score(without, rows, config, codec)
    assert first.loss == second.loss == third.loss and first.answers == second.answers == third.answers
    inputs = dict(input_tokens=jnp.asarray(rows[0].examples[0].tokens[None]))
    t = inputs["input_tokens"].shape[1]
    logits = [
        with_dropout(inputs["input_tokens"], jnp.arange(t)[None], None, jnp.tril(jnp.ones((1, t, t), bool)))[0]
        for _ in range(2)
    ]
    assert not np.array_equal(logits[0], logits[1]), "the test must be able to fail: training's calls drop out"


# ---------------------------------------------------------------------------- the training program


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_sharded):
    """A short run on its own copy of the tiny model (so a test may break it), scored on an eval file
    whose first 3 rows have an `expected_regex`: the answer's city."""
    tmp = tmp_path_factory.mktemp("finished")
    model = tmp / "model"
    shutil.copytree(tiny_sharded.path, model)
    dataset = tiny.write_dataset(tmp / "chat.jsonl", "chat", n=32)
    rows = [json.loads(line) for line in dataset.read_text().splitlines()[:6]]
    for row in rows[:3]:
        row["expected_regex"] = row["messages"][-1]["content"].split()[-1].rstrip(".")
    eval_file = tmp / "eval.jsonl"
    eval_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = TrainConfig.model_validate(
        dict(
            model_path=str(model),
            model_dtype="float32",
            steps=6,
            batch_size=4,
            micro_batch_size=4,
            learning_rate=1e-2,
            dataset=dict(path=str(dataset), format="chat", max_seq_len=MAX_SEQ_LEN),
            lora=dict(rank=4, alpha=8.0),
            checkpoint_every=3,
            keep_checkpoints=2,
            log_every=1,
            output_dir=str(tmp / "out"),
            termination_log=str(tmp / "termination-log"),
            evaluation=dict(path=str(eval_file), max_rows=5, max_new_tokens=10),
        )
    )
    return config, train.run(config)


@pytest.mark.slow
def test_a_finished_run_reports_its_figures_and_predictions(finished):
    config, outcome = finished
    assert outcome.exit_code == EXIT_OK and outcome.result.status == "succeeded"
    figures = {r.name: r for r in outcome.result.evaluation}
    assert list(figures) == ["evalLoss", "perplexity", "exactMatch", "contains", "regexMatch"]
    assert figures["evalLoss"].rows == 5 and figures["exactMatch"].rows == 5 and figures["regexMatch"].rows == 3
    assert figures["evalLoss"].value < figures["evalLoss"].baseline, "6 steps on the same questions help"
    folder = Path(config.output_dir) / "evaluation"
    predictions = [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]
    assert [p["line"] for p in predictions] == [1, 2, 3, 4, 5]
    assert all({"prompt", "expected", "answer", "hits", "base_answer", "base_hits"} <= set(p) for p in predictions)
    assert [("regexMatch" in p["hits"]) for p in predictions] == [True, True, True, False, False]
    assert figures["exactMatch"].value == sum(p["hits"]["exactMatch"] for p in predictions) / 5
    assert figures["contains"].baseline == sum(p["base_hits"]["contains"] for p in predictions) / 5
    assert predictions[0]["prompt"].endswith("<channel|>") and predictions[0]["expected"].startswith("The capital of")
    written = json.loads((folder / "metrics.json").read_text())
    assert written == [r.model_dump() for r in outcome.result.evaluation]


def checkpoint_files(config: TrainConfig) -> dict[str, float]:
    root = Path(config.checkpoint_dir)
    return {str(p.relative_to(root)): p.stat().st_mtime for p in root.rglob("*")}


@pytest.mark.slow
def test_a_resumed_run_whose_training_finished_only_evaluates(finished):
    config, first = finished
    before = checkpoint_files(config)
    again = train.run(config)
    assert again.exit_code == EXIT_OK and again.result.step == first.result.step == 6
    assert again.history == [], "no step trained again"
    assert checkpoint_files(config) == before, "no checkpoint written again"
    assert again.result.evaluation == first.result.evaluation


@pytest.mark.slow
def test_a_figure_that_is_not_finite_fails_the_run_and_keeps_the_checkpoint(finished, tmp_path):
    """The base model's weights broken after training (NaN in a norm): the resumed run evaluates
    only, every figure is NaN, and the run fails naming them; the checkpoint is kept."""
    config, _ = finished
    config = config.model_copy(update={"termination_log": str(tmp_path / "termination-log")})
    for shard in Path(config.model_path).glob("*.safetensors"):
        tensors = load_file(shard)
        for name in [n for n in tensors if n.endswith("norm.weight") and ".layers.0." in n]:
            tensors[name] = np.full_like(tensors[name], np.nan)
        save_file(tensors, shard, metadata={"format": "pt"})
    path = tmp_path / "config.json"
    path.write_text(config.dumps())
    before = checkpoint_files(config)
    assert runner.main(["train", "--config", str(path)]) == EXIT_FAILED
    result = json.loads(Path(config.termination_log).read_text())
    assert result["status"] == "failed" and result["step"] == 6 and result["checkpoint"].endswith("/6")
    assert result["error"].startswith("evaluation: figures that are not finite: evalLoss nan (base nan)"), result
    assert {"name": "evalLoss", "value": None, "baseline": None, "rows": 5} in result["evaluation"], (
        "NaN is null in JSON"
    )
    assert checkpoint_files(config) == before, "the checkpoint is kept"
