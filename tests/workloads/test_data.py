"""Dataset reading, checking, tokenisation and loss masks; row layout and data order."""

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest

from gemma_devcluster import tiny
from gemma_workloads.config import DatasetConfig
from gemma_workloads.data import DataError, TextCodec, read_examples
from gemma_workloads.training import batches


@pytest.fixture(scope="module")
def codec(tiny_sharded) -> TextCodec:
    return TextCodec(str(tiny_sharded.path))


def trained_text(codec: TextCodec, example) -> str:
    return codec.tokenizer.decode(example.tokens[example.loss_mask].tolist(), skip_special_tokens=False)


def write_lines(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize(
    "fmt,expected",
    [
        ("chat", "The capital of Peru is Lima.<turn|>"),  # the end of turn is learnt too
        ("prompt-completion", " The capital of Peru is Lima.<eos>"),
        ("text", "Q: What is the capital of Peru?\nA: The capital of Peru is Lima.<eos>"),  # all but the first, <bos>
    ],
)
def test_loss_mask_covers_exactly_what_the_model_should_write(tmp_path, codec, fmt, expected):
    path = tiny.write_dataset(tmp_path / "d.jsonl", fmt, n=32)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    index = next(i for i, r in enumerate(rows) if "What is the capital of Peru" in json.dumps(r))
    example = read_examples(DatasetConfig(path=str(path), format=fmt), codec).items[index]
    assert trained_text(codec, example) == expected
    assert 0 < example.loss_mask.sum() < len(example)


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Capital of Japan?"},
    {"role": "assistant", "content": "Tokyo."},
    {"role": "user", "content": "And Kenya?"},
    {"role": "assistant", "content": " Nairobi.\n"},
]


def test_each_assistant_turn_is_trained_on_the_prompt_the_server_sends(tmp_path, codec, tiny_sharded):
    """The prompt of turn i is transformers' `apply_chat_template(messages[:i], add_generation_prompt=True)`,
    what vLLM's chat endpoint sends (tests/serving checks vLLM against transformers), and the target
    is the turn's content and the end-of-turn token. With the release's template (thought block
    after the generation prompt, none in the history) each turn is a sequence of its own."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_sharded.path)
    path = write_lines(tmp_path / "d.jsonl", [{"messages": CONVERSATION}])
    examples = read_examples(DatasetConfig(path=path, format="chat"), codec).items
    turns = [i for i, m in enumerate(CONVERSATION) if m["role"] == "assistant"]
    assert len(examples) == len(turns) and {e.line for e in examples} == {1}
    for example, i in zip(examples, turns, strict=True):
        prompt = tokenizer.apply_chat_template(CONVERSATION[:i], add_generation_prompt=True, return_dict=True)
        prompt = prompt["input_ids"]
        answer = tokenizer.encode(CONVERSATION[i]["content"].strip(), add_special_tokens=False)
        assert example.tokens.tolist() == list(prompt) + answer + [tokenizer.convert_tokens_to_ids("<turn|>")]
        assert example.loss_mask.tolist() == [False] * len(prompt) + [True] * (len(answer) + 1)
    assert tokenizer.decode(examples[1].tokens.tolist()) == (
        "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nCapital of Japan?<turn|>\n<|turn>model\nTokyo.<turn|>\n"
        "<|turn>user\nAnd Kenya?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>Nairobi.<turn|>"
    )


def test_a_template_that_grows_by_prefixes_gives_one_sequence_per_conversation(tmp_path, tiny_sharded, caplog):
    """Without the thought block (as Gemma 4's smaller checkpoints render), each turn's prompt
    extends the previous turn's sequence, so the conversation stays one sequence. A server that
    does not stop at the end-of-turn token (no generation_config.json here) is warned about."""
    model = tmp_path / "model"
    model.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).write_text((tiny_sharded.path / name).read_text())
    (model / "chat_template.jinja").write_text(tiny.CHAT_TEMPLATE.replace("<|channel>thought\n<channel|>", ""))
    codec = TextCodec(str(model))
    assert TextCodec(str(tiny_sharded.path)).end_of_turn_id == tiny.TURN_END_ID and not caplog.records
    assert codec.end_of_turn_id == tiny.TURN_END_ID
    assert "ends a model turn with '<turn|>', where vLLM does not stop (it stops at ids [1]:" in caplog.text
    (example,) = read_examples(
        DatasetConfig(path=write_lines(tmp_path / "d.jsonl", [{"messages": CONVERSATION}])), codec
    ).items
    assert trained_text(codec, example) == "Tokyo.<turn|>Nairobi.<turn|>"
    assert codec.tokenizer.decode(example.tokens.tolist(), skip_special_tokens=False).endswith(
        "<|turn>model\nTokyo.<turn|>\n<|turn>user\nAnd Kenya?<turn|>\n<|turn>model\nNairobi.<turn|>"
    )


@pytest.mark.parametrize("bos_in_tokenizer_json", [False, True])
@pytest.mark.parametrize("prompt", ["Q: What is the capital of Peru?\nA:", "<bos>Q: Peru?\nA:"])
def test_completion_prompts_are_tokenized_as_the_server_does(
    tmp_path, tiny_sharded, bos_in_tokenizer_json, prompt, caplog
):
    """vLLM's /v1/completions encodes a prompt with transformers' tokenizer and add_special_tokens=True
    (vllm/entrypoints/openai/completion/protocol.py); transformers 5 takes <bos> from tokenizer.json's
    post-processor and ignores tokenizer_config.json's add_bos_token (tokenization_utils_base.py).
    The tiny checkpoint declares add_bos_token: true with no post-processor: no <bos> unless sent."""
    from tokenizers import Tokenizer, processors
    from transformers import AutoTokenizer

    model = tmp_path / "model"
    shutil.copytree(tiny_sharded.path, model, ignore=shutil.ignore_patterns("*.safetensors*"))
    if bos_in_tokenizer_json:
        backend = Tokenizer.from_file(str(model / "tokenizer.json"))
        bos = [("<bos>", tiny.BOS_ID)]
        backend.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=bos)
        backend.save(str(model / "tokenizer.json"))
    served = AutoTokenizer.from_pretrained(model)(prompt)["input_ids"]
    codec = TextCodec(str(model))
    pairs = write_lines(tmp_path / "pairs.jsonl", [{"prompt": prompt, "completion": " Lima."}])
    (pair,) = read_examples(DatasetConfig(path=pairs, format="prompt-completion"), codec).items
    (text,) = read_examples(
        DatasetConfig(path=write_lines(tmp_path / "text.jsonl", [{"text": prompt}]), format="text"), codec
    ).items
    assert pair.tokens[: len(served)].tolist() == served and not pair.loss_mask[: len(served)].any()
    assert text.tokens.tolist() == served + [tiny.EOS_ID]
    assert (served[0] == tiny.BOS_ID) == (bos_in_tokenizer_json or prompt.startswith("<bos>")), "must be able to fail"
    warned = [r.getMessage() for r in caplog.records if "rows are trained without <bos>" in r.getMessage()]
    assert len(warned) == (0 if served[0] == tiny.BOS_ID else 2), "one warning per dataset without <bos>"


@pytest.mark.parametrize(
    "fmt,lines,message",
    [
        (
            "chat",
            [
                '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}',
                '{"messages": [{"role": "user", "content": "hi"}',
            ],
            r"d\.jsonl:2: invalid JSON",
        ),
        (
            "chat",
            ['{"msgs": [{"role": "user", "content": "hi"}]}'],
            r"d\.jsonl:1: format 'chat' needs field\(s\) \['messages'\]; missing \['messages'\], found \['msgs'\]",
        ),
        (
            "prompt-completion",
            ['{"prompt": "a", "response": "b"}'],
            r"d\.jsonl:1: .*missing \['completion'\], found \['prompt', 'response'\]",
        ),
        ("chat", ['{"messages": [{"role": "robot", "content": "hi"}]}'], r"d\.jsonl:1: messages\[0\]\.role is 'robot'"),
        ("chat", ['{"messages": [{"role": "user", "content": "hi"}]}'], r"d\.jsonl:1: no assistant message"),
        (
            "chat",
            [
                '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}',
                '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", '
                '"reasoning_content": "Let me think."}]}',
            ],
            r"d\.jsonl:2: messages\[1\] has 'reasoning_content': thinking is not trained",
        ),
        (
            "chat",
            [
                '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", '
                '"tool_calls": [{"function": {"name": "f"}}]}, {"role": "tool", "content": "1"}]}'
            ],
            r"d\.jsonl:1: messages\[1\] has 'tool_calls': tool calls are not trained",
        ),
        (
            "chat",
            ['{"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "1"}]}'],
            r"d\.jsonl:1: messages\[1\]\.role is 'tool'.*\(tool calls and their results are not trained\)",
        ),
        (
            "chat",
            [
                '{"messages": [{"role": "user", "content": "q"}, '
                '{"role": "assistant", "content": "<|channel>thought\\nhmm<channel|>a"}]}'
            ],
            r"d\.jsonl:1: messages\[1\]\.content contains '<\|channel>', a control token",
        ),
        ("text", ['["a list"]'], r"d\.jsonl:1: expected a JSON object, got list"),
        ("text", ['{"text": 3}'], r"d\.jsonl:1: field 'text' must be a string"),
        ("text", [], r"d\.jsonl has no usable examples"),
    ],
)
def test_a_bad_line_fails_with_file_line_and_problem(tmp_path, codec, fmt, lines, message):
    path = write_lines(tmp_path / "d.jsonl", lines)
    with pytest.raises(DataError, match=message):
        read_examples(DatasetConfig(path=path, format=fmt), codec)


def test_missing_dataset_file_is_named(tmp_path, codec):
    with pytest.raises(DataError, match=r"dataset .*nope\.jsonl not found"):
        read_examples(DatasetConfig(path=str(tmp_path / "nope.jsonl")), codec)


def test_skip_invalid_counts_what_it_skips(tmp_path, codec):
    """A byte that is not UTF-8 spoils its line only, so it is skipped like any other bad line."""
    good = {"text": "Q: x\nA: y"}
    path = write_lines(tmp_path / "d.jsonl", [good, "{oops", good, {"txt": "z"}])
    with open(path, "ab") as f:
        f.write(b'{"text": "caf\xe9"}\n')
    out = read_examples(DatasetConfig(path=path, format="text", skip_invalid=True), codec)
    assert len(out.items) == 2
    assert [s.split(": ")[0] for s in out.skipped] == [f"{path}:2", f"{path}:4", f"{path}:5"]
    assert out.skipped[2].endswith("byte 0xe9 at column 14 is not UTF-8 (save the file as UTF-8)")


def test_chat_needs_a_template(tmp_path, tiny_sharded):
    model = tmp_path / "model"
    model.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).write_text((tiny_sharded.path / name).read_text())
    path = tiny.write_dataset(tmp_path / "d.jsonl", "chat", n=2)
    with pytest.raises(DataError, match="needs a chat template"):
        read_examples(DatasetConfig(path=str(path), format="chat"), TextCodec(str(model)))


def example(n: int, start: int = 10):
    from gemma_workloads.data import Example

    return Example(
        np.arange(start, start + n, dtype=np.int32), np.r_[np.zeros(n // 2, bool), np.ones(n - n // 2, bool)]
    )


def test_packing_keeps_examples_apart():
    rows = batches.layout([example(5), example(6, 20), example(7, 30)], 12, packing=True)
    assert len(rows) == 2
    np.testing.assert_array_equal(rows.segment_ids[0], [1] * 5 + [2] * 6 + [0])
    np.testing.assert_array_equal(rows.positions[0], [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 0])
    assert not rows.loss_mask[0, 5], "a segment's first token is never predicted from the previous one"
    inputs = batches.model_inputs({k: v[:1] for k, v in rows.take(np.arange(2)).items()})
    attention = np.asarray(inputs["attention_mask"][0])
    assert attention[6, 5] and attention[6, 6] and not attention[6, 4] and not attention[6, 7]
    assert not attention[11].any(), "padding attends to nothing"
    padded = batches.layout([example(5), example(6)], 12, packing=False)
    assert len(padded) == 2 and padded.segment_ids[1].tolist() == [1] * 6 + [0] * 6


def test_sequence_too_short_for_every_example():
    with pytest.raises(DataError, match=r"max_seq_len 16 is shorter than every example \(the shortest has 20 tokens\)"):
        batches.fitting([example(20), example(25)], 16)
    assert len(batches.fitting([example(20), example(10)], 16)) == 1


def test_order_is_a_function_of_seed_and_position():
    rows = batches.layout([example(4, 10 * i) for i in range(1, 8)], 4, packing=False)
    stream = batches.Batches(rows, 3, seed=5)
    first = [stream.next()["tokens"][:, 0].tolist() for _ in range(5)]  # 15 rows: two epochs and a bit
    assert sorted(sum(first[:2], []) + first[2][:1]) == [10 * i for i in range(1, 8)], "epoch 0 visits every row once"
    resumed = batches.Batches(rows, 3, seed=5, position=3)
    assert resumed.next()["tokens"][:, 0].tolist() == first[3]
    assert batches.Batches(rows, 3, seed=6).next()["tokens"][:, 0].tolist() != first[0]
    assert stream.state() | {"fingerprint": None} == {
        "micro_batches": 5,
        "micro_batch_size": 3,
        "epoch": 2,
        "row_in_epoch": 1,
        "fingerprint": None,
    }
    assert stream.steps_for(epochs=2, batch_size=6) == 3


def test_eval_split_is_held_out_and_covered_once():
    examples = [example(4, 10 * i) for i in range(1, 11)]
    train, held = batches.split(examples, 0.2, seed=0)
    assert len(train) == 8 and len(held) == 2
    assert {e.tokens[0] for e in train} | {e.tokens[0] for e in held} == {10 * i for i in range(1, 11)}
    turns = [replace(e, line=i // 3 + 1) for i, e in enumerate(examples)]  # 4 conversations of up to 3 turns
    for seed in range(5):
        train, held = batches.split(turns, 0.25, seed)
        assert len({e.line for e in held}) == 1 and not {e.line for e in held} & {e.line for e in train}
    evals = batches.eval_batches(batches.layout(held, 4, packing=False), 3)
    assert len(evals) == 1 and evals[0]["segment_ids"][2].sum() == 0 and not evals[0]["loss_mask"][2].any()
