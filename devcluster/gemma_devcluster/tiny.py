"""A tiny, randomly initialised Gemma 4 checkpoint and a small learnable dataset, made locally.

There is no model hub here, so tests and the local demo build their own model: Hugging Face
layout (config.json, sharded safetensors + index, tokenizer.json with a Gemma-4-style chat
template), the same files a real `google/gemma-4-*` checkpoint has, at a size that trains in
seconds on a CPU. It has one sliding and one global layer, with K=V on the global layer, so every
code path of the 31B model is exercised. Only numpy, safetensors and tokenizers are needed, and
transformers for the optional vision tower, which makes it the release's whole shape.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>", "<|channel>", "<channel|>"]
PAD_ID, EOS_ID, BOS_ID, UNK_ID, TURN_START_ID, TURN_END_ID, CHANNEL_START_ID, CHANNEL_END_ID = range(8)

# Gemma 4's turn format (`<|turn>role\n...<turn|>\n`, the assistant's role named `model`) with the
# instruction checkpoints' handling of thinking, as the 31B release behaves with thinking off (its
# default): the generation prompt ends with an empty thought block; model turns in the history
# have none, any thought block in them is dropped and their content trimmed. So the prompt an
# answer follows is not a prefix of the conversation rendered with that answer. Tool calling and
# the thinking-on system marker of the released template are left out.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{% set content = message['content'] %}"
    "{% if role == 'model' and '<channel|>' in content %}{% set content = content.split('<channel|>')[-1] %}{% endif %}"
    "{{ '<|turn>' + role + '\n' + content | trim + '<turn|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|turn>model\n' }}"
    "{% if not enable_thinking | default(false) %}{{ '<|channel>thought\n<channel|>' }}{% endif %}"
    "{% endif %}"
)


@dataclass(frozen=True)
class TinyConfig:
    """Sizes of the tiny model. embed_dim must differ from every head size (a tunix loader rule)."""

    vocab_size: int = 512
    hidden_size: int = 96
    intermediate_size: int = 192
    num_attention_heads: int = 4
    head_dim: int = 32
    num_key_value_heads: int = 2
    global_head_dim: int = 64
    num_global_key_value_heads: int = 1
    sliding_window: int = 16
    layer_types: tuple[str, ...] = ("sliding_attention", "full_attention")
    max_position_embeddings: int = 4096
    final_logit_softcapping: float = 30.0
    attention_k_eq_v: bool = True
    init_std: float = 0.02  # transformers' initializer_range
    # The (tied) embedding's scale bounds how sharp the logits can get: at 0.02 and this width
    # they stay within a few units, LoRA cannot change that, and a fine-tune cannot get confident.
    embed_std: float = 0.02

    def hf_config(self, dtype: str = "float32") -> dict:
        """config.json of the text-only model (Gemma4ForCausalLM)."""
        return {
            "architectures": ["Gemma4ForCausalLM"],
            "model_type": "gemma4_text",
            "vocab_size": self.vocab_size,
            "vocab_size_per_layer_input": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": len(self.layer_types),
            "num_attention_heads": self.num_attention_heads,
            "head_dim": self.head_dim,
            "num_key_value_heads": self.num_key_value_heads,
            "global_head_dim": self.global_head_dim,
            "num_global_key_value_heads": self.num_global_key_value_heads,
            "attention_k_eq_v": self.attention_k_eq_v,
            "sliding_window": self.sliding_window,
            "layer_types": list(self.layer_types),
            "hidden_size_per_layer_input": 0,
            "num_kv_shared_layers": 0,
            "max_position_embeddings": self.max_position_embeddings,
            "final_logit_softcapping": self.final_logit_softcapping,
            "hidden_activation": "gelu_pytorch_tanh",
            "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "full_attention": {
                    "partial_rotary_factor": 0.25,
                    "rope_theta": 1000000.0,
                    "rope_type": "proportional",
                },
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
            },
            "tie_word_embeddings": True,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "enable_moe_block": False,
            "use_double_wide_mlp": False,
            "pad_token_id": PAD_ID,
            "eos_token_id": EOS_ID,
            "bos_token_id": BOS_ID,
            "dtype": dtype,
        }

    def tensor_shapes(self, prefix: str = "model.") -> dict[str, tuple[int, ...]]:
        """Every tensor of the checkpoint, in HF's [out, in] layout, in a stable order."""
        d, f = self.hidden_size, self.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {f"{prefix}embed_tokens.weight": (self.vocab_size, d)}
        for i, kind in enumerate(self.layer_types):
            full = kind == "full_attention"
            hd = self.global_head_dim if full else self.head_dim
            kvh = self.num_global_key_value_heads if full else self.num_key_value_heads
            layer = f"{prefix}layers.{i}."
            shapes[layer + "layer_scalar"] = (1,)
            shapes[layer + "self_attn.q_proj.weight"] = (self.num_attention_heads * hd, d)
            shapes[layer + "self_attn.k_proj.weight"] = (kvh * hd, d)
            if not (full and self.attention_k_eq_v):
                shapes[layer + "self_attn.v_proj.weight"] = (kvh * hd, d)
            shapes[layer + "self_attn.o_proj.weight"] = (d, self.num_attention_heads * hd)
            shapes[layer + "self_attn.q_norm.weight"] = (hd,)
            shapes[layer + "self_attn.k_norm.weight"] = (hd,)
            shapes[layer + "mlp.gate_proj.weight"] = (f, d)
            shapes[layer + "mlp.up_proj.weight"] = (f, d)
            shapes[layer + "mlp.down_proj.weight"] = (d, f)
            for norm in ("input", "post_attention", "pre_feedforward", "post_feedforward"):
                shapes[layer + f"{norm}_layernorm.weight"] = (d,)
        shapes[f"{prefix}norm.weight"] = (d,)
        return shapes


def random_tensors(config: TinyConfig, seed: int = 0, prefix: str = "model.") -> dict[str, np.ndarray]:
    """Random float32 weights: projections ~ N(0, init_std), the embedding ~ N(0, embed_std),
    norms and scalars near 1."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in config.tensor_shapes(prefix).items():
        if name.endswith("layer_scalar"):
            value = rng.uniform(0.5, 1.5, shape)
        elif len(shape) == 1:
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            std = config.embed_std if name.endswith("embed_tokens.weight") else config.init_std
            value = std * rng.standard_normal(shape)
        tensors[name] = value.astype(np.float32)
    return tensors


def write_safetensors(tensors: dict[str, np.ndarray], out: Path, shards: int, dtype: str = "float32") -> None:
    """Write HF-style shards (model-0000i-of-0000N + index) or a single model.safetensors."""
    from safetensors.numpy import save_file

    cast = _numpy_dtype(dtype)
    names = list(tensors)
    if shards <= 1:
        save_file(
            {n: tensors[n].astype(cast) for n in names}, str(out / "model.safetensors"), metadata={"format": "pt"}
        )
        return
    groups = [names[i::shards] for i in range(shards)]  # interleaved: a layer spans several files
    weight_map, total = {}, 0
    for i, group in enumerate(groups, start=1):
        fname = f"model-{i:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n].astype(cast) for n in group}
        save_file(part, str(out / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in group})
        total += sum(t.nbytes for t in part.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _numpy_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return {"float32": np.float32, "float16": np.float16}[dtype]


# ---------------------------------------------------------------------------- data


COUNTRIES = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Egypt": "Cairo",
    "Peru": "Lima",
    "Kenya": "Nairobi",
    "Canada": "Ottawa",
}
QUESTIONS = [
    "What is the capital of {c}?",
    "Name the capital city of {c}.",
    "Which city is the capital of {c}?",
    "Tell me the capital of {c}.",
]


def qa_pairs() -> list[tuple[str, str]]:
    """Every (question, answer) the dataset draws from: each phrasing of each country."""
    return [(q.format(c=c), f"The capital of {c} is {city}.") for c, city in COUNTRIES.items() for q in QUESTIONS]


def examples(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """(question, answer) pairs with a pattern a tiny model learns in a few dozen steps."""
    rng = random.Random(seed)
    pairs = qa_pairs()
    rng.shuffle(pairs)
    return [pairs[i % len(pairs)] for i in range(n)]


def demo_questions() -> list[tuple[str, str]]:
    """One question per country, the phrasings in turn, with the dataset's answer: what the local
    demo asks the served model and what its fine-tune is evaluated on."""
    pairs = qa_pairs()
    return [pairs[c * len(QUESTIONS) + c % len(QUESTIONS)] for c in range(len(COUNTRIES))]


def wrong_answer(answer: str) -> str:
    """The answer with the next country's capital: what a preference pair rejects."""
    cities = list(COUNTRIES.values())
    city = next(c for c in cities if answer.endswith(f" {c}."))
    return answer.replace(f" {city}.", f" {cities[(cities.index(city) + 1) % len(cities)]}.")


def write_dataset(
    path: str | Path, fmt: str = "chat", n: int = 64, seed: int = 0, pairs: list[tuple[str, str]] | None = None
) -> Path:
    """A JSONL dataset in one of the formats the training workload reads: `n` examples drawn
    with `seed`, or exactly `pairs` (an eval set: the answer is the expected answer)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for question, answer in examples(n, seed) if pairs is None else pairs:
            row: dict[str, Any]
            if fmt == "chat":
                row = {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}
            elif fmt == "prompt-completion":  # <bos> written out: the tokenizer adds none (data.py)
                row = {"prompt": f"<bos>Q: {question}\nA:", "completion": f" {answer}"}
            elif fmt == "text":
                row = {"text": f"<bos>Q: {question}\nA: {answer}"}
            elif fmt == "preference":  # the right capital preferred to the next country's
                row = {"prompt": question, "chosen": answer, "rejected": wrong_answer(answer)}
            else:
                raise ValueError(f"unknown dataset format {fmt!r}")
            f.write(json.dumps(row) + "\n")
    return path


# ---------------------------------------------------------------------------- tokenizer


def build_tokenizer(vocab_size: int, seed: int = 0):
    """A byte-level BPE tokenizer trained on the tiny corpus (any text still tokenizes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [f"{q}\n{a}\nQ: {q}\nA: {a}\nuser\nmodel\n" for q, a in examples(256, seed)]
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return tokenizer


def write_tokenizer(out: Path, vocab_size: int) -> None:
    tokenizer = build_tokenizer(vocab_size)
    assert tokenizer.get_vocab_size() <= vocab_size, "tokenizer larger than the embedding"
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<bos>",
                "eos_token": "<eos>",
                "pad_token": "<pad>",
                "unk_token": "<unk>",
                # Declared, but transformers 5 ignores it when tokenizer.json exists (it follows that
                # file's post-processor, here none): vLLM adds no <bos> to a completion's prompt.
                "add_bos_token": True,
                "add_eos_token": False,
                "model_max_length": 4096,
                "extra_special_tokens": SPECIAL_TOKENS[4:],
            },
            indent=2,
        )
    )


# ---------------------------------------------------------------------------- checkpoint


@dataclass
class TinyCheckpoint:
    """What `write_checkpoint` made."""

    path: Path
    config: TinyConfig
    shards: int
    files: list[str] = field(default_factory=list)


def write_checkpoint(
    out: str | Path,
    config: TinyConfig = TinyConfig(),
    *,
    shards: int = 2,
    dtype: str = "float32",
    seed: int = 0,
    prefix: str = "model.",
    vision: TinyVisionConfig | None = None,
) -> TinyCheckpoint:
    """Write a complete HF model directory. `prefix="model.language_model."` gives the key layout
    of the released (multimodal) checkpoints; the default is the text-only layout. With `vision`,
    it is the release's whole shape: a Gemma4ForConditionalGeneration whose vision tower sits
    beside `model.language_model.` (the text weights are the same as without it, seed for seed)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors, hf_config = random_tensors(config, seed, prefix), config.hf_config(dtype)
    if vision is not None:
        towers, hf_config = vision_tower(config, vision, seed, dtype)
        tensors = {**random_tensors(config, seed, "model.language_model."), **towers}
    write_safetensors(tensors, out, shards, dtype)
    (out / "config.json").write_text(json.dumps(hf_config, indent=2))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS_ID, "eos_token_id": [EOS_ID, TURN_END_ID], "pad_token_id": PAD_ID}, indent=2)
    )
    write_tokenizer(out, config.vocab_size)
    return TinyCheckpoint(out, config, shards, sorted(p.name for p in out.iterdir()))


# ---------------------------------------------------------------------------- vision tower

# The release's tensors beside `model.language_model.`: 356 of its 1,188.
VISION_PREFIXES = ("model.vision_tower.", "model.embed_vision.")


@dataclass(frozen=True)
class TinyVisionConfig:
    """A one-layer vision tower (transformers' Gemma4VisionConfig fields): a few thousand parameters."""

    hidden_size: int = 32
    intermediate_size: int = 64
    num_hidden_layers: int = 1
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    head_dim: int = 16
    patch_size: int = 4
    pooling_kernel_size: int = 2
    position_embedding_size: int = 64


def vision_tower(
    config: TinyConfig, vision: TinyVisionConfig, seed: int = 0, dtype: str = "float32"
) -> tuple[dict[str, np.ndarray], dict]:
    """(vision tensors, config.json) of a Gemma4ForConditionalGeneration that transformers builds
    and saves itself, so names, shapes and config are the ones it writes for the release."""
    import tempfile

    import torch
    from safetensors.numpy import load_file
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig, Gemma4VisionConfig

    text = {k: v for k, v in config.hf_config(dtype).items() if k not in ("architectures", "model_type", "dtype")}
    hf = Gemma4Config(text_config=Gemma4TextConfig(**text), vision_config=Gemma4VisionConfig(**asdict(vision)))
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        Gemma4ForConditionalGeneration(hf).save_pretrained(tmp)
        tensors = {
            k: v
            for f in sorted(Path(tmp).glob("*.safetensors"))
            for k, v in load_file(f).items()
            if k.startswith(VISION_PREFIXES)
        }
        saved = json.loads((Path(tmp) / "config.json").read_text())
    return tensors, {**saved, "dtype": dtype}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a tiny random Gemma 4 checkpoint and dataset.")
    parser.add_argument("out", help="model directory to create")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dataset", help="also write a JSONL dataset here")
    parser.add_argument("--format", default="chat", choices=["chat", "prompt-completion", "text"])
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--eval-dataset", help="also write the demo's questions, one per country, as an eval set here")
    parser.add_argument("--vision", action="store_true", help="the release's shape, with a tiny vision tower")
    parser.add_argument(
        "--embed-std",
        type=float,
        default=TinyConfig.embed_std,
        help="scale of the embedding (larger lets a fine-tune reach confident answers)",
    )
    args = parser.parse_args(argv)
    vision = TinyVisionConfig() if args.vision else None
    config = TinyConfig(embed_std=args.embed_std)
    ckpt = write_checkpoint(args.out, config, shards=args.shards, dtype=args.dtype, seed=args.seed, vision=vision)
    print(json.dumps({"model": str(ckpt.path), "files": ckpt.files, "config": asdict(ckpt.config)}))
    if args.dataset:
        print(json.dumps({"dataset": str(write_dataset(args.dataset, args.format, args.examples, args.seed))}))
    if args.eval_dataset:
        print(json.dumps({"eval_dataset": str(write_dataset(args.eval_dataset, args.format, pairs=demo_questions()))}))


if __name__ == "__main__":
    main()


# ---------------------------------------------------------------------------- LoRA checkpoint


def lora_shapes(config: TinyConfig, rank: int) -> dict[str, dict[str, tuple[int, ...]]]:
    """Shapes of Qwix's LoRA A and B on every projection (`layers/<i>/attn/q_einsum/w_lora_a`),
    as `lora.apply_lora` makes them, without building the model."""
    d, f, n = config.hidden_size, config.intermediate_size, config.num_attention_heads
    shapes = {}
    for i, kind in enumerate(config.layer_types):
        full = kind == "full_attention"
        hd = config.global_head_dim if full else config.head_dim
        kvh = config.num_global_key_value_heads if full else config.num_key_value_heads
        attn = {"q_einsum": ((d, rank), (rank, n, hd)), "attn_vec_einsum": ((n, hd, rank), (rank, d))}
        if full and config.attention_k_eq_v:
            attn["k_einsum"] = ((d, rank), (rank, kvh, hd))
        else:
            attn["kv_einsum"] = ((d, rank), (rank, 2, kvh, hd))
        mlp = {
            "gate_proj": ((d, rank), (rank, f)),
            "up_proj": ((d, rank), (rank, f)),
            "down_proj": ((f, rank), (rank, d)),
        }
        for part, modules in (("attn", attn), ("mlp", mlp)):
            weight = "w" if part == "attn" else "kernel"
            for module, (a, b) in modules.items():
                shapes[f"layers/{i}/{part}/{module}"] = {f"{weight}_lora_a": a, f"{weight}_lora_b": b}
    return shapes


def write_lora_checkpoint(
    checkpoint_dir: str | Path,
    config: TinyConfig,
    *,
    rank: int,
    alpha: float,
    step: int = 1,
    seed: int = 0,
    std: float = 0.05,
    nan_in: str | None = None,
) -> None:
    """A LoRA checkpoint in the training layout (Orbax step folder with `model_params`, `lora.json`)
    with random non-zero A and B, for models too large to build in a test or benchmark. `nan_in`
    (`layers/0/mlp/up_proj/kernel_lora_b`) gets a NaN, as a diverged run would leave it."""
    import orbax.checkpoint as ocp

    from gemma_workloads.config import LORA_METADATA, LORA_MODULES, LoraMetadata

    rng = np.random.default_rng(seed)
    tree: dict = {}
    for path, params in lora_shapes(config, rank).items():
        node = tree
        for part in path.split("/"):
            node = node.setdefault(part, {})
        node.update({name: (std * rng.standard_normal(shape)).astype(np.float32) for name, shape in params.items()})
        for name in params:
            if f"{path}/{name}" == nan_in:
                node[name].flat[0] = np.nan
    root = Path(checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    meta = LoraMetadata(
        rank=rank, alpha=alpha, target_modules=list(LORA_MODULES), base_model_path="", model_dtype="float32"
    )
    (root / LORA_METADATA).write_text(meta.model_dump_json())
    manager = ocp.CheckpointManager(root, item_handlers={"model_params": ocp.PyTreeCheckpointHandler()})
    manager.save(step, args=ocp.args.Composite(model_params=ocp.args.PyTreeSave(tree)), force=True)
    manager.wait_until_finished()
    manager.close()
