"""End to end: a chat fine-tune, merged, answers better in the exact format vLLM's chat endpoint serves."""

import json
import random
from pathlib import Path

import pytest

from gemma_devcluster import tiny
from gemma_workloads.config import EXIT_OK, TrainConfig
from gemma_workloads.training import trainer as train
from tests.workloads.merging.test_merger import run_merge

SYSTEM = "Be brief."
END_OF_TURN = "<turn|>"  # Gemma 4 closes a model turn with it; vLLM stops there (generation_config.json's eos_token_id)


def conversations(seed: int = 0) -> list[list[dict]]:
    """One two-turn chat (with a system prompt) per ordered pair of countries, in a seeded order:
    a deterministic mapping, country -> capital, that a tiny model learns in a few dozen steps."""
    rng = random.Random(seed)
    pairs = [(a, b) for a in tiny.COUNTRIES for b in tiny.COUNTRIES if a != b]
    rng.shuffle(pairs)
    chats = []
    for a, b in pairs:
        chat = [{"role": "system", "content": SYSTEM}]
        for country in (a, b):
            chat += [
                {"role": "user", "content": rng.choice(tiny.QUESTIONS).format(c=country)},
                {"role": "assistant", "content": f"The capital of {country} is {tiny.COUNTRIES[country]}."},
            ]
        chats.append(chat)
    return chats


def served_answer_loss(model_path: Path, chats: list[list[dict]]) -> float:
    """Mean loss, per answer token, of each assistant turn after the prompt vLLM's chat endpoint
    sends for it, computed by transformers in float32.

    Independent of the training codec (gemma_workloads.data.TextCodec) and of the Tunix model: the
    prompt is the ids transformers' `apply_chat_template` gives for the checkpoint's template and
    tokenizer, taken as vLLM takes them (`safe_apply_chat_template` in vllm/renderers/hf.py, with
    `return_dict=False`; the chat request's `add_special_tokens` defaults to False in
    vllm/entrypoints/openai/chat_completion/protocol.py, so the only <bos> is the template's); the
    model is transformers' Gemma 4 reading the merged safetensors. A codec that trained on another
    format than this one would lower this loss less (measured in the test below)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model, info = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    end_of_turn = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    total, count = 0.0, 0
    for chat in chats:
        for i in (i for i, m in enumerate(chat) if m["role"] == "assistant"):
            prompt = tokenizer.apply_chat_template(chat[:i], add_generation_prompt=True, return_dict=False)
            answer = tokenizer(chat[i]["content"], add_special_tokens=False)["input_ids"] + [end_of_turn]
            ids = torch.tensor([prompt + answer])
            with torch.no_grad():
                logits = model(ids).logits[0, len(prompt) - 1 : -1]
            total += float(torch.nn.functional.cross_entropy(logits, ids[0, len(prompt) :], reduction="sum"))
            count += len(answer)
    return total / count


@pytest.mark.slow
def test_merged_fine_tune_lowers_the_loss_of_served_answers(tiny_single, tmp_path):
    """Train on multi-turn chats with a system prompt, merge with the merge Job, and score
    held-out chats (other country pairs, same distribution) as the server would present them."""
    chats = conversations()
    train_chats, held_out = chats[:48], chats[48:]
    assert not [c for c in held_out if c in train_chats]
    dataset = tmp_path / "chats.jsonl"
    dataset.write_text("".join(json.dumps({"messages": c}) + "\n" for c in train_chats))
    config = TrainConfig(
        model_path=str(tiny_single.path),
        model_dtype="float32",
        dataset=dict(path=str(dataset), format="chat", max_seq_len=80),
        lora=dict(rank=8, alpha=16.0),
        steps=30,
        batch_size=8,
        micro_batch_size=8,
        learning_rate=3e-3,
        warmup_steps=3,
        checkpoint_every=30,
        gradient_checkpointing=False,
        output_dir=str(tmp_path / "train"),
        termination_log=str(tmp_path / "train-log"),
    )
    assert len(train.prepare_data(config).train.rows) == 2 * len(train_chats), "each assistant turn is a sequence"
    outcome = train.run(config)
    assert outcome.exit_code == EXIT_OK, outcome.result
    merged = tmp_path / "merged"
    code, result = run_merge(
        tmp_path, base_model_path=str(tiny_single.path), checkpoint_dir=config.checkpoint_dir, output_dir=str(merged)
    )
    assert code == EXIT_OK, result

    base, tuned = served_answer_loss(tiny_single.path, held_out), served_answer_loss(merged, held_out)
    # Measured over three seeds: base 6.33, merged 4.80-4.81 nats per answer token, near this model's floor
    # (about 4.5: LoRA leaves the small tied embedding and the final norm as they are). Trained on the same
    # chats without the thought block that ends the served prompt, the merged model scores 5.52-5.63: the
    # bound sits between the two.
    assert tuned < base - 1.1, f"served answers: base loss {base:.3f}, merged {tuned:.3f}"
