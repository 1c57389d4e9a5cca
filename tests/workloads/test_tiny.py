"""The tiny checkpoint generator makes what transformers (and so vLLM) loads as Gemma 4."""

import json

import pytest

from gemma_devcluster import tiny


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny.write_checkpoint(tmp_path_factory.mktemp("tiny"), shards=3)


def test_checkpoint_has_the_files_of_a_released_model(checkpoint):
    names = set(checkpoint.files)
    assert {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "model.safetensors.index.json",
    } <= names
    assert sum(n.startswith("model-0000") for n in names) == 3
    index = json.loads((checkpoint.path / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) == 3, "tensors must be spread over every shard"


def test_transformers_loads_every_tensor(checkpoint):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint.path, dtype=torch.float32)
    assert type(model).__name__ == "Gemma4ForCausalLM"
    expected = set(checkpoint.config.tensor_shapes())
    state = {k for k in model.state_dict() if k != "lm_head.weight"}  # tied to the embedding
    assert state == expected
    layer_types = model.config.layer_types
    assert layer_types == ["sliding_attention", "full_attention"]
    assert model.config.attention_k_eq_v


def test_chat_template_renders_gemma4_turns_as_the_release_does(checkpoint):
    """With thinking off (the default) the generation prompt ends with an empty thought block; model
    turns in the history have none, lose any thinking and are trimmed. So an answer's prompt is not
    a prefix of the conversation rendered with that answer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint.path)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<|channel>thought\nGreet back.<channel|> Hello. "},
        {"role": "user", "content": "Bye"},
    ]
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello.<turn|>\n"
        "<|turn>user\nBye<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
    )
    prompt = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert not tok.apply_chat_template(messages[:3], tokenize=False).startswith(prompt)
    thinking = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    assert thinking.endswith("<|turn>user\nBye<turn|>\n<|turn>model\n")
    assert len(tok) <= checkpoint.config.vocab_size
    ids = tok("The capital of France is Paris.")["input_ids"]
    assert tok.decode(ids) == "The capital of France is Paris.", "no <bos> added to a plain prompt"


@pytest.mark.parametrize(
    "fmt,keys", [("chat", {"messages"}), ("prompt-completion", {"prompt", "completion"}), ("text", {"text"})]
)
def test_dataset_formats(tmp_path, fmt, keys):
    path = tiny.write_dataset(tmp_path / "d.jsonl", fmt, n=10)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 10 and all(set(r) == keys for r in rows)


def test_embed_std_scales_the_embedding_and_nothing_else():
    default, demo = (tiny.random_tensors(tiny.TinyConfig(embed_std=std)) for std in (0.02, 0.2))
    embedding = "model.embed_tokens.weight"
    assert float(demo[embedding].std()) == pytest.approx(0.2, rel=0.05)
    assert float(default[embedding].std()) == pytest.approx(0.02, rel=0.05)
    assert all((default[k] == demo[k]).all() for k in default if k != embedding)
