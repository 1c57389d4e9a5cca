"""Preference tuning run for real on a tiny Gemma 4: DPO and ORPO, float32 and bfloat16, the paper's
batch shape (micro-batch 1 x accumulation 8), judged by transformers on the merged model against
the base; the first step's loss; resume; a NaN."""

import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from gemma_workloads import runner
from gemma_workloads.config import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, MergeConfig, TrainConfig, TrainResult
from gemma_workloads.merging import merger
from gemma_workloads.training import trainer as train
from tests.workloads.training.test_train import elsewhere, lora_params, run_cli, step_of
from tests.workloads.training.test_train import make_config as train_config

# bf16 once, with ORPO: its odds ratio (log1p of -exp of a mean log-probability) is the term that
# bf16 would break first; the log-probabilities themselves come from the float32 chunked loss in both methods.
RUNS = [("dpo", "float32"), ("orpo", "float32"), ("orpo", "bfloat16")]
# ORPO's odds-ratio term works on mean per-token log-probabilities, where the one token that tells the
# answers apart weighs a tenth: it needs more steps than DPO to learn the same preference.
STEPS, EVERY = {"dpo": 24, "orpo": 32}, 8
BETA, ORPO_LAMBDA = 0.5, 1.0
END_OF_TURN = "<turn|>"  # Gemma 4 closes a model turn with it


def make_config(tmp: Path, model_path: str, method: str, dtype: str) -> TrainConfig:
    """test_train's recipe on 64 pairs, one pair a micro-batch."""
    return train_config(
        tmp,
        model_path,
        "preference",
        model_dtype=dtype,
        method=method,
        preference=dict(beta=BETA, orpo_lambda=ORPO_LAMBDA),
        lora=dict(rank=8, alpha=16.0),  # no dropout: the held-out loss is then a function of the weights
        steps=STEPS[method],
        micro_batch_size=1,
        learning_rate=4e-3,
        warmup_steps=2,
        checkpoint_every=EVERY,
        evaluation=dict(max_rows=16, max_new_tokens=8),
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_sharded) -> dict[tuple[str, str], tuple[TrainConfig, train.Outcome, Path]]:
    """One run per method and dtype, each merged (model and PEFT adapter) as the merge Job does."""
    out = {}
    for method, dtype in RUNS:
        tmp = tmp_path_factory.mktemp(f"{method}-{dtype}")
        config = make_config(tmp, str(tiny_sharded.path), method, dtype)
        outcome = train.run(config)
        assert outcome.exit_code == EXIT_OK, outcome.result
        merged = tmp / "merged"
        result = merger.merge(
            MergeConfig(base_model_path=config.model_path, checkpoint_dir=config.checkpoint_dir, output_dir=str(merged))
        )
        assert result.status == "succeeded" and result.adapter, result
        out[method, dtype] = config, outcome, merged
    return out


def held_out_rows(config: TrainConfig) -> list[dict]:
    """The JSONL rows of the held-out lines (the split is training's own)."""
    import json

    lines = {row.line for row in train.prepare_data(config).evaluation or []}
    text = Path(config.dataset.path).read_text().splitlines()
    return [json.loads(text[n - 1]) for n in sorted(lines)]


def answer_logps(model_path: Path, tokenizer_path: str, rows: list[dict]) -> np.ndarray:
    """[rows, 2]: log p(chosen), log p(rejected), each answer with its end-of-turn token after the
    prompt vLLM's chat endpoint sends (`apply_chat_template(..., add_generation_prompt=True)`),
    summed over the answer tokens by transformers in float32: independent of the training code."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="eager")
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    out = []
    for row in rows:
        prompt = list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": row["prompt"]}], add_generation_prompt=True, return_dict=True
            )["input_ids"]
        )
        pair = []
        for key in ("chosen", "rejected"):
            answer = tokenizer.encode(row[key].strip(), add_special_tokens=False) + [end]
            with torch.no_grad():
                logits = model(torch.tensor([prompt + answer])).logits[0, len(prompt) - 1 : -1].double()
            pair.append(float(torch.log_softmax(logits, -1)[range(len(answer)), answer].sum()))
        out.append(pair)
    return np.asarray(out)


@pytest.fixture(scope="module")
def judged(runs, tiny_sharded) -> dict:
    """Transformers' log-probabilities of the held-out pairs: the base once, each merged fine-tune."""
    config = next(iter(runs.values()))[0]
    rows = held_out_rows(config)
    base = answer_logps(tiny_sharded.path, config.model_path, rows)
    return {"rows": rows, "base": base} | {k: answer_logps(m, config.model_path, rows) for k, (_, _, m) in runs.items()}


@pytest.mark.parametrize("run", RUNS, ids=["-".join(r) for r in RUNS])
def test_preference_tuning_raises_held_out_preference_over_the_base(runs, judged, run):
    config, outcome, _ = runs[run]
    base, tuned = judged["base"], judged[run]
    base_margin, tuned_margin = base[:, 0] - base[:, 1], tuned[:, 0] - tuned[:, 1]
    assert len(judged["rows"]) >= 6
    print(
        f"{run}: accuracy {(tuned_margin > 0).mean():.3f} (base {(base_margin > 0).mean():.3f}), "
        f"margin {tuned_margin.mean():.3f} (base {base_margin.mean():.3f}) nats on {len(base)} pairs"
    )
    assert (tuned_margin > 0).mean() >= (base_margin > 0).mean() + 0.25  # at least two more of 7 pairs
    assert tuned_margin.mean() > base_margin.mean() + 0.25
    figures = {m.name: m for m in outcome.result.evaluation}
    assert figures["preferenceAccuracy"].rows == len(judged["rows"])
    assert figures["preferenceAccuracy"].value > figures["preferenceAccuracy"].baseline
    # The trainer's own figures are these, up to the precision it computes in.
    tolerance = 1e-3 if config.model_dtype == "float32" else 0.25
    assert figures["rewardMargin"].value == pytest.approx(tuned_margin.mean(), rel=tolerance, abs=tolerance)
    assert figures["rewardMargin"].baseline == pytest.approx(base_margin.mean(), rel=tolerance, abs=tolerance)


def test_the_dpo_loss_is_that_of_the_fine_tune_against_the_base(runs, judged):
    """The reported held-out loss after the last step is the DPO loss (the DPO paper, arXiv
    2305.18290, eq. 7) computed from transformers' log-probabilities of the merged model (policy)
    and of the base (reference)."""
    _, outcome, _ = runs["dpo", "float32"]
    tuned, base = judged["dpo", "float32"], judged["base"]
    delta = (tuned[:, 0] - base[:, 0]) - (tuned[:, 1] - base[:, 1])
    expected = np.mean(np.log1p(np.exp(-BETA * delta)))
    assert outcome.result.eval_loss == pytest.approx(expected, rel=1e-4)


def first_step_pairs(config: TrainConfig) -> list[list[list[int]]]:
    """The token ids of each pair of the first optimizer step: [[chosen ids, answer mask...]]."""
    data = train.prepare_data(config)
    out = []
    for i in range(config.grad_accumulation):
        batch = data.train.micro_batch(i)
        for pair in range(config.micro_batch_size):
            rows = []
            for side in (0, 1):
                real = batch["segment_ids"][pair, side] > 0
                rows.append((batch["tokens"][pair, side][real].tolist(), batch["loss_mask"][pair, side][real]))
            out.append(rows)
    return out


@pytest.mark.parametrize("method", ["dpo", "orpo"])
def test_the_first_step_loss_is_computed_from_the_policy_and_reference_log_probabilities(runs, tiny_sharded, method):
    """At step 1 the adapter is zero, so the policy is the base: DPO's loss is log 2 for every pair
    (the reference is exactly the policy), and ORPO's (the ORPO paper, arXiv 2403.07691, eq. 2-7,
    with the mean per-token log-probability) follows from the base's log-probabilities, here taken
    from transformers on the first step's own token ids."""
    import torch
    from transformers import AutoModelForCausalLM

    config, outcome, _ = runs[method, "float32"]
    model = AutoModelForCausalLM.from_pretrained(tiny_sharded.path, dtype=torch.float32, attn_implementation="eager")
    losses = []
    for pair in first_step_pairs(config):
        logps, counts = [], []
        for ids, mask in pair:
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0, :-1].double()
            targets = np.flatnonzero(mask[1:])
            logps.append(float(torch.log_softmax(logits, -1)[targets, [ids[t + 1] for t in targets]].sum()))
            counts.append(len(targets))
        if method == "dpo":  # policy = reference: the log-ratios cancel, whatever the log-probabilities
            losses.append(math.log(2))
        else:
            mean_c, mean_r = logps[0] / counts[0], logps[1] / counts[1]
            log_odds = (mean_c - math.log1p(-math.exp(mean_c))) - (mean_r - math.log1p(-math.exp(mean_r)))
            losses.append(-mean_c + ORPO_LAMBDA * math.log1p(math.exp(-log_odds)))
    assert outcome.history[0].step == 1
    assert outcome.history[0].loss == pytest.approx(np.mean(losses), rel=1e-5)


def test_an_interrupted_dpo_run_resumes_bit_identically(runs, tmp_path, capsys):
    """SIGTERM after step 5, a final checkpoint, a restart: the adapter at the last step is the
    uninterrupted run's, bit for bit."""
    baseline, _, _ = runs["dpo", "float32"]
    config = elsewhere(baseline, tmp_path)
    first = run_cli(config, tmp_path, "first", sigterm_at=5)
    assert first.code == EXIT_PREEMPTED, first.stderr
    assert 5 <= first.result.step < STEPS["dpo"] and step_of(first.result.checkpoint) == first.result.step
    (tmp_path / "second.json").write_text(config.dumps())
    assert runner.main(["train", "--config", str(tmp_path / "second.json")]) == EXIT_OK
    result = TrainResult.model_validate_json(Path(config.termination_log).read_text())
    assert result.status == "succeeded" and step_of(result.checkpoint) == STEPS["dpo"]
    ours = lora_params(config.checkpoint_dir, STEPS["dpo"])
    reference = lora_params(baseline.checkpoint_dir, STEPS["dpo"])
    assert ours.keys() == reference.keys()
    for key in ours:
        np.testing.assert_array_equal(ours[key], reference[key], err_msg=key)


def test_a_nan_fails_a_dpo_run_naming_the_step(runs, tmp_path, capsys):
    """A base weight holding inf makes the policy's and the reference's log-probabilities NaN: the
    run fails at step 1 as an application error, never a quiet success."""
    from safetensors.numpy import load_file, save_file

    baseline, _, _ = runs["dpo", "float32"]
    model = Path(shutil.copytree(baseline.model_path, tmp_path / "model"))
    shard = sorted(model.glob("*.safetensors"))[0]
    weights = load_file(shard)
    name = next(k for k in weights if "mlp.up_proj" in k)
    weights[name][0, 0] = np.inf
    save_file(weights, shard, metadata={"format": "pt"})
    config = elsewhere(baseline, tmp_path, model_path=str(model))
    (tmp_path / "config.json").write_text(config.dumps())
    assert runner.main(["train", "--config", str(tmp_path / "config.json")]) == EXIT_FAILED
    result = TrainResult.model_validate_json(Path(config.termination_log).read_text())
    assert result.status == "failed" and result.error.startswith("step 1: the loss is nan"), result.error
