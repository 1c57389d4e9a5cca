"""The evaluation's run: score the fine-tuned model and, with the adapter off, the base model on
the same rows; write, log and check the figures (the package's docstring says what they are)."""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field

import jax
import numpy as np
from etils import epath
from flax import nnx

from gemma_workloads.config import MetricResult, TrainConfig, join
from gemma_workloads.data import DataError, Example, TextCodec
from gemma_workloads.training import batches as batching
from gemma_workloads.training import lora, loss, pairs, preference_loss
from gemma_workloads.training.evaluation import scores
from gemma_workloads.training.evaluation.greedy import generate
from gemma_workloads.training.evaluation.rows import EvalRow, eval_dataset, read_rows

log = logging.getLogger(__name__)

FOLDER = "evaluation"
PREDICTIONS = "predictions.jsonl"
METRICS = "metrics.json"


def prepare(config: TrainConfig, codec: TextCodec, held_out: list[Example]) -> list[EvalRow] | None:
    """The rows to score, read before training so that a bad one costs no training."""
    ev = config.evaluation
    if ev is None:
        return None
    if ev.path is not None:
        return read_rows(eval_dataset(config.dataset, ev), codec, ev)
    lines = {e.line for e in held_out}
    if not lines:
        raise DataError(
            "evaluation.path is not set and the held-out split is empty: set dataset.eval_fraction or evaluation.path"
        )
    return read_rows(config.dataset, codec, ev, lines)


@dataclass
class Scores:
    """One model's results on the rows."""

    loss: float
    answers: list[str | None]  # None: a row without a prompt
    hits: list[dict[str, bool]]
    margins: list[float] = field(default_factory=list)  # log p(chosen) - log p(rejected), per preference row


@dataclass
class Evaluation:
    results: list[MetricResult]
    predictions: list[dict]
    seconds: float
    problem: str | None = None  # a figure that is not finite, named
    base: Scores | None = field(default=None, repr=False)


_batch_loss = nnx.jit(lambda model, batch: loss.token_weighted_nll(model, **batching.model_inputs(batch)))


def mean_loss(model: nnx.Module, rows: list[EvalRow], max_seq_len: int, batch_size: int) -> float:
    """The training loss over every answer token of the rows: training's own held-out batches,
    whose losses average to that mean (batches.eval_batches)."""
    laid = batching.layout([e for r in rows for e in r.examples], max_seq_len, packing=False)
    batches = batching.eval_batches(laid, batch_size)
    return float(sum(float(_batch_loss(model, b)) for b in batches) / len(batches))


_pair_logps = nnx.jit(lambda model, batch: preference_loss.answer_logps(model, pairs.model_inputs(batch), None))


def margins(model: nnx.Module, rows: list[EvalRow], max_seq_len: int, batch_size: int) -> list[float]:
    """Each preference row's log-probability margin of its chosen answer over its rejected one."""
    held = [pairs.Pair(r.examples[0], r.rejected) for r in rows if r.rejected is not None]
    if not held:
        return []
    out: list[float] = []
    for batch in pairs.eval_batches(pairs.layout(held, max_seq_len), batch_size):
        logps = np.asarray(_pair_logps(model, batch))
        out.extend((logps[:batch_size] - logps[batch_size:]).tolist())
    return out[: len(held)]


def score(model: nnx.Module, rows: list[EvalRow], config: TrainConfig, codec: TextCodec) -> Scores:
    """The loss and the greedy answers of one model."""
    ev = config.evaluation
    assert ev is not None  # prepare() gave rows: the config has an evaluation
    with lora.dropout_off(model):
        value = mean_loss(model, rows, config.dataset.max_seq_len, config.micro_batch_size)
        margin = margins(model, rows, config.dataset.max_seq_len, config.micro_batch_size)
        prompts = [r.prompt for r in rows if r.prompt is not None]
        stops = codec.stop_ids | ({codec.end_of_turn_id} if config.dataset.chat else set())
        generated = iter(
            generate(
                model, prompts, max_new_tokens=ev.max_new_tokens, stop_ids=stops, batch_size=config.micro_batch_size
            )
            if prompts
            else []
        )
    answers = [
        codec.tokenizer.decode(next(generated), skip_special_tokens=True) if r.prompt is not None else None
        for r in rows
    ]
    hits = [
        scores.hits(a, r.expected, r.expected_regex) if a is not None else {}
        for r, a in zip(rows, answers, strict=True)
    ]
    return Scores(value, answers, hits, margin)


def figures(rows: list[EvalRow], tuned: Scores, base: Scores | None) -> list[MetricResult]:
    """The contract's figures, each with the base model's on the same rows."""

    def both(name: str, of) -> MetricResult:
        value, count = of(tuned)
        return MetricResult(name=name, value=value, baseline=of(base)[0] if base else None, rows=count)

    out = [
        both("evalLoss", lambda s: (s.loss, len(rows))),
        both("perplexity", lambda s: (perplexity(s.loss), len(rows))),
    ]
    for name in scores.rates(tuned.hits):
        out.append(both(name, lambda s, n=name: scores.rates(s.hits)[n]))
    if tuned.margins:
        out.append(both("preferenceAccuracy", lambda s: (float(np.mean(np.asarray(s.margins) > 0)), len(s.margins))))
        out.append(both("rewardMargin", lambda s: (float(np.mean(s.margins)), len(s.margins))))
    return out


def perplexity(loss_value: float) -> float:
    """exp(loss); infinite past what a float holds (and then refused as not finite)."""
    try:
        return math.exp(loss_value)
    except OverflowError:
        return math.inf


def not_finite(results: list[MetricResult]) -> str | None:
    """What is wrong, naming each figure that is not finite; None when all are."""
    bad = [
        f"{r.name} {r.value}" + (f" (base {r.baseline})" if r.baseline is not None else "")
        for r in results
        if not math.isfinite(r.value) or (r.baseline is not None and not math.isfinite(r.baseline))
    ]
    if not bad:
        return None
    return (
        f"evaluation: figures that are not finite: {', '.join(bad)}; the model diverged or an input is "
        "broken (the trained checkpoint is kept)"
    )


def predictions(rows: list[EvalRow], tuned: Scores, base: Scores | None) -> list[dict]:
    """One line per row that was answered: what a person reads to judge the figures."""
    out = []
    for i, r in enumerate(rows):
        if r.prompt is None:
            continue
        line = {"line": r.line, "prompt": r.prompt_text, "expected": r.expected}
        if r.expected_regex is not None:
            line["expected_regex"] = r.expected_regex
        line |= {"answer": tuned.answers[i], "hits": tuned.hits[i]}
        if base is not None:
            line |= {"base_answer": base.answers[i], "base_hits": base.hits[i]}
        out.append(line)
    return out


def evaluate(model: nnx.Module, config: TrainConfig, rows: list[EvalRow], codec: TextCodec) -> Evaluation:
    """Score the fine-tuned model, and the base model when asked, on the same rows."""
    started = time.perf_counter()
    tuned = score(model, rows, config, codec)
    base = None
    if config.evaluation is not None and config.evaluation.baseline:
        with lora.adapter_off(model):
            base = score(model, rows, config, codec)
    results = figures(rows, tuned, base)
    seconds = time.perf_counter() - started
    return Evaluation(results, predictions(rows, tuned, base), seconds, not_finite(results), base)


def write(evaluation: Evaluation, output_dir: str) -> str:
    """The predictions and figures under `<output_dir>/evaluation/`; the folder."""
    folder = epath.Path(join(output_dir, FOLDER))
    if jax.process_index() == 0:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / PREDICTIONS).write_text(
            "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in evaluation.predictions)
        )
        (folder / METRICS).write_text("[" + ", ".join(r.model_dump_json() for r in evaluation.results) + "]\n")
    return str(folder)


def run(model: nnx.Module, config: TrainConfig, rows: list[EvalRow], codec: TextCodec) -> Evaluation:
    """Evaluate, write and log the figures."""
    result = evaluate(model, config, rows, codec)
    folder = write(result, config.output_dir)
    models = "fine-tuned and base" if config.evaluation and config.evaluation.baseline else "fine-tuned"
    log.info("evaluation of %d rows (%s) in %.1f s, predictions in %s", len(rows), models, result.seconds, folder)
    for r in result.results:
        log.info(
            "evaluation: %s %.4g%s on %d rows",
            r.name,
            r.value,
            f" (base {r.baseline:.4g})" if r.baseline is not None else "",
            r.rows,
        )
    if result.problem:
        log.error("%s", result.problem)
    return result
