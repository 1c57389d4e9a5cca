"""Preference pairs: read, checked, rendered as the server renders a chat, laid out and batched in pairs."""

import numpy as np
import pytest

from gemma_workloads.config import DatasetConfig
from gemma_workloads.data import DataError, TextCodec, read_examples
from gemma_workloads.training import pairs
from tests.workloads.test_data import write_lines

END_OF_TURN = "<turn|>"  # Gemma 4 closes a model turn with it


@pytest.fixture(scope="module")
def codec(tiny_sharded) -> TextCodec:
    return TextCodec(str(tiny_sharded.path))


def dataset(path, **fields) -> DatasetConfig:
    return DatasetConfig(path=str(path), format="preference", **fields)


@pytest.mark.parametrize(
    "prompt",
    [
        "Capital of Kenya?",
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of Kenya?"}],
    ],
)
def test_each_answer_follows_the_prompt_the_chat_endpoint_sends(tmp_path, codec, tiny_sharded, prompt):
    """The prompt is transformers' `apply_chat_template(messages, add_generation_prompt=True)`, what
    vLLM's chat endpoint sends (`safe_apply_chat_template` in vllm/renderers/hf.py), a plain string
    being one user turn; only each answer and its end-of-turn token are trained."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_sharded.path)
    path = write_lines(tmp_path / "d.jsonl", [{"prompt": prompt, "chosen": " Nairobi.\n", "rejected": "Lima."}])
    (pair,) = pairs.pairs_of(read_examples(dataset(path), codec).items)
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    sent = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"])
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    for example, answer in ((pair.chosen, "Nairobi."), (pair.rejected, "Lima.")):
        ids = tokenizer.encode(answer, add_special_tokens=False)
        assert example.tokens.tolist() == sent + ids + [end]
        assert example.loss_mask.tolist() == [False] * len(sent) + [True] * (len(ids) + 1)
        assert example.line == 1


@pytest.mark.parametrize(
    "row,message",
    [
        ({"prompt": "q", "chosen": "a"}, r"d\.jsonl:1: format 'preference' needs .*missing \['rejected'\]"),
        ({"prompt": "q", "rejected": "a"}, r"d\.jsonl:1: .*missing \['chosen'\]"),
        (
            {"prompt": "q", "chosen": "Paris.", "rejected": " Paris. "},
            r"d\.jsonl:1: .*'chosen' and 'rejected' are the same",
        ),
        ({"prompt": "q", "chosen": "", "rejected": "a"}, r"d\.jsonl:1: field 'chosen' is empty"),
        ({"prompt": "q", "chosen": 3, "rejected": "a"}, r"d\.jsonl:1: field 'chosen' must be a string"),
        ({"prompt": "", "chosen": "a", "rejected": "b"}, r"d\.jsonl:1: field 'prompt' is empty"),
        (
            {
                "prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                "chosen": "a",
                "rejected": "b",
            },
            r"d\.jsonl:1: field 'prompt': the conversation must end with a user turn",
        ),
        (
            {"prompt": [{"role": "robot", "content": "q"}], "chosen": "a", "rejected": "b"},
            r"d\.jsonl:1: messages\[0\]\.role is 'robot'",
        ),
        (
            {"prompt": "q", "chosen": "<|channel>thought\nhmm<channel|>a", "rejected": "b"},
            r"d\.jsonl:1: field 'chosen' contains '<\|channel>', a control token",
        ),
    ],
)
def test_a_bad_pair_fails_with_file_line_and_problem(tmp_path, codec, row, message):
    path = write_lines(tmp_path / "d.jsonl", [row])
    with pytest.raises(DataError, match=message):
        read_examples(dataset(path), codec)


def test_a_pair_over_max_seq_len_is_refused_or_skipped_naming_its_line(tmp_path, codec):
    """Cutting an answer could change which one is better: the pair is refused, or left out with skip_invalid."""
    long = "word " * 80
    rows = [{"prompt": "q", "chosen": "a", "rejected": "b"}, {"prompt": "q", "chosen": "a", "rejected": long}]
    path = write_lines(tmp_path / "d.jsonl", rows)
    found = pairs.pairs_of(read_examples(dataset(path, max_seq_len=32), codec).items)
    with pytest.raises(DataError, match=r"d\.jsonl:2: the prompt with its rejected answer is \d+ tokens, over .*32"):
        pairs.fitting(found, dataset(path, max_seq_len=32))
    kept = pairs.fitting(found, dataset(path, max_seq_len=32, skip_invalid=True))
    assert [p.line for p in kept] == [1]


def test_pairs_travel_together_chosen_rows_first(tmp_path, codec):
    """Both answers of a line land on the same side of the split, and in the step's batch the
    chosen rows come first, then the rejected ones in the same order (Tunix's DPO layout:
    chosen logps are the first half of the batch, tunix/sft/dpo/dpo_trainer.py)."""
    rows = [{"prompt": f"question {i}", "chosen": f"good {i}", "rejected": f"bad {i} bad"} for i in range(10)]
    path = write_lines(tmp_path / "d.jsonl", rows)
    found = pairs.pairs_of(read_examples(dataset(path), codec).items)
    train, held = pairs.split(found, 0.2, seed=1)
    assert len(held) == 2 and {p.line for p in train}.isdisjoint(p.line for p in held)
    laid = pairs.layout(train, 48)
    assert laid.tokens.shape == (8, 2, 48)
    batch = pairs.PairBatches(laid, micro_batch_size=2, seed=0).next()
    inputs = pairs.model_inputs(batch)
    assert inputs["input_tokens"].shape == (4, 48) and inputs["loss_scale"].tolist() == [0.5, 0.5]
    chosen, rejected = (
        codec.tokenizer.decode(np.asarray(r).tolist()) for r in np.asarray(inputs["input_tokens"])[[0, 2]]
    )
    assert "good" in chosen and "bad" in rejected and chosen.split("good")[1][:2] == rejected.split("bad")[1][:2]


def test_held_out_batches_weigh_each_pair_once(codec):
    """Tunix averages eval batches: the scales make that the mean over real pairs, filler pairs weigh 0."""
    rows = pairs.layout([pairs.Pair(*_examples(codec, i)) for i in range(5)], 48)
    batches = pairs.eval_batches(rows, 2)
    scales = np.concatenate([b["loss_scale"] for b in batches])
    assert len(batches) == 3 and scales[-1] == 0
    assert np.isclose(scales.sum() / len(batches), 1.0)  # mean over batches of sums = mean over the 5 pairs


def _examples(codec: TextCodec, i: int):
    return [codec.answer([{"role": "user", "content": f"q{i}"}], text, "field") for text in (f"yes {i}", f"no {i}")]


def test_an_eval_pair_is_answered_only_where_an_expected_answer_is_given(tmp_path, codec):
    """Preference eval rows are scored by their margin; the generation metrics need `expected` or
    `expected_regex`, and only such rows are answered (their prompt is the pair's)."""
    from gemma_workloads.config import EvaluationConfig
    from gemma_workloads.training.evaluation.rows import read_rows

    rows = [
        {"prompt": "Capital of Peru?", "chosen": "Lima.", "rejected": "Rome."},
        {"prompt": "Capital of Peru?", "chosen": "Lima.", "rejected": "Rome.", "expected": "Lima."},
        {"prompt": "Capital of Peru?", "chosen": "Lima.", "rejected": "Rome.", "expected_regex": "Li"},
    ]
    path = write_lines(tmp_path / "eval.jsonl", rows)
    plain, expected, pattern = read_rows(dataset(path), codec, EvaluationConfig(max_new_tokens=8))
    pair = pairs.pairs_of(read_examples(dataset(path), codec).items)[0]
    for row in (plain, expected, pattern):
        assert row.examples[0].tokens.tolist() == pair.chosen.tokens.tolist()  # the loss is the chosen answer's
        assert row.rejected is not None and row.rejected.tokens.tolist() == pair.rejected.tokens.tolist()
    assert plain.prompt is None and plain.expected is None
    assert (
        expected.expected == "Lima." and expected.prompt.tolist() == pair.chosen.tokens[~pair.chosen.loss_mask].tolist()
    )
    assert pattern.expected is None and pattern.expected_regex == "Li" and pattern.prompt is not None
    with pytest.raises(DataError, match=r"eval\.jsonl:1: field 'expected' must be a string"):
        read_rows(dataset(write_lines(tmp_path / "eval.jsonl", [rows[0] | {"expected": 3}])), codec, EvaluationConfig())
