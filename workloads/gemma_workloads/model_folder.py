"""A Hugging Face Gemma 4 folder, checked before anything is loaded from it.

Copies that reach a cluster break in a few ways: a config of another architecture, files cut
short by an interrupted copy, Git LFS pointer files in place of the weights, a damaged tokenizer.
Each is found here from the small files and the shards' headers, with no weight read (so gs://
folders are checked without a download), and reported with the file, the place in it and the fix.
"""

from __future__ import annotations

import re

from etils import epath

from gemma_workloads.input_files import COPY_AGAIN, InputError, read_json
from gemma_workloads.safetensors_io import INDEX, BaseCheckpoint, open_checkpoint

# config.json's `model_type` of Gemma 4 (transformers' models/gemma4/configuration_gemma4.py).
GEMMA4_MODEL_TYPES = ("gemma4", "gemma4_text")
# The text config's fields that model_loader.tunix_config reads without a default, and their JSON types.
REQUIRED_FIELDS: dict[str, type] = {
    "vocab_size": int,
    "hidden_size": int,
    "intermediate_size": int,
    "num_hidden_layers": int,
    "num_attention_heads": int,
    "head_dim": int,
    "num_key_value_heads": int,
    "layer_types": list,
}
LAYER_TYPES = ("sliding_attention", "full_attention")
# The text decoder's keys, released (`model.language_model.`) or text-only (`model.`) layout.
_EMBED = re.compile(r"model\.(?:language_model\.)?embed_tokens\.weight")
_LAYER = re.compile(r"model\.(?:language_model\.)?layers\.(\d+)\..+")
CHAT_TEMPLATE = "chat_template.jinja"
READ = ("config.json", INDEX, "tokenizer_config.json")  # JSON files the checks below parse
DIFFERENT_MODELS = "the weights and config.json are of different models"


def check_model_folder(path: str, *, chat: bool = False, weights: bool = True) -> None:
    """Raise InputError for the first broken part of the folder; `chat`: the run needs a chat
    template; not `weights`: the shards are not there yet (a download to come), only the index is read."""
    root = epath.Path(path)
    if not root.exists():
        raise InputError(f"model folder {path} does not exist")
    if not root.is_dir():
        raise InputError(
            f"{path} is a file: the model path must be the model's folder (config.json, *.safetensors, tokenizer.json)"
        )
    text = check_config(root)
    if weights:
        check_weights(open_checkpoint(path), text, root / "config.json")
    elif (root / INDEX).exists():
        read_json(root / INDEX)
    check_tokenizer(root, chat=chat)
    for other in sorted(set(root.glob("*.json")) - {root / n for n in (*READ, "tokenizer.json")}):
        read_json(other)  # generation_config.json and the like: served with the model


def check_config(root: epath.Path) -> dict:
    """config.json of a Gemma 4 model, with every field the loader needs; its text config."""
    path = root / "config.json"
    if not path.exists():
        raise InputError(f"{path} is missing: the model folder must hold the model's config.json; {COPY_AGAIN}")
    config = read_json(path)
    if not isinstance(config, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(config).__name__}; {COPY_AGAIN}")
    model_type = config.get("model_type")
    if model_type not in GEMMA4_MODEL_TYPES:
        raise InputError(
            f"{path}: model_type {model_type!r} (architectures {config.get('architectures')}) is not "
            f"Gemma 4 ({' or '.join(GEMMA4_MODEL_TYPES)}): point the model path at a Gemma 4 checkpoint"
        )
    text, prefix = (config["text_config"], "text_config.") if "text_config" in config else (config, "")
    if not isinstance(text, dict):
        raise InputError(f"{path}: field text_config must be an object; {COPY_AGAIN}")
    for name, kind in REQUIRED_FIELDS.items():
        value = text.get(name)
        if value is None:
            raise InputError(f"{path}: field {prefix}{name} is missing; a Gemma 4 config.json has it")
        if not isinstance(value, kind) or isinstance(value, bool) or (isinstance(value, int) and value < 1):
            raise InputError(f"{path}: field {prefix}{name} is {value!r}; expected a positive {kind.__name__}")
    layers = text["layer_types"]
    if unknown := sorted({str(t) for t in layers} - set(LAYER_TYPES)):
        raise InputError(f"{path}: field {prefix}layer_types has {unknown}; allowed: {list(LAYER_TYPES)}")
    if len(layers) != text["num_hidden_layers"]:
        raise InputError(
            f"{path}: field {prefix}layer_types has {len(layers)} entries for "
            f"num_hidden_layers {text['num_hidden_layers']}"
        )
    return text


def check_weights(weights: BaseCheckpoint, text: dict, config_path: epath.Path) -> None:
    """The shards hold the model config.json describes: its embedding's shape and every decoder
    layer, no more (the loader would otherwise fail mid-load on a mismatched copy)."""
    embed = next((t for t in weights.tensors if _EMBED.fullmatch(t.name)), None)
    if embed is None:
        raise InputError(
            f"{weights.path}: no tensor model.embed_tokens.weight (or model.language_model.embed_tokens"
            ".weight): not the weights of a Gemma 4 model"
        )
    expected = (text["vocab_size"], text["hidden_size"])
    if embed.shape != expected:
        raise InputError(
            f"{embed.file}: tensor {embed.name} is {list(embed.shape)}, but {config_path} gives "
            f"vocab_size x hidden_size {list(expected)}: {DIFFERENT_MODELS}"
        )
    layers = {int(m.group(1)) for t in weights.tensors if (m := _LAYER.fullmatch(t.name))}
    n = text["num_hidden_layers"]
    if missing := sorted(set(range(n)) - layers):
        raise InputError(
            f"{weights.path}: no tensors for decoder layer(s) {missing[:8]} of the {n} in {config_path}: "
            f"the copy is incomplete, or {DIFFERENT_MODELS}"
        )
    if extra := sorted(i for i in layers if i >= n):
        raise InputError(
            f"{weights.path}: tensors for decoder layer(s) {extra[:8]} beyond the {n} in {config_path}: "
            f"{DIFFERENT_MODELS}"
        )


def check_tokenizer(root: epath.Path, *, chat: bool) -> None:
    """tokenizer.json loads, tokenizer_config.json parses, and the chat template compiles."""
    from tokenizers import Tokenizer

    path = root / "tokenizer.json"
    if not path.exists():
        raise InputError(f"{path} is missing: the model folder must carry its tokenizer; {COPY_AGAIN}")
    try:
        tokenizer = Tokenizer.from_str(path.read_bytes().decode("utf-8"))
    except Exception as e:  # noqa: BLE001 (the tokenizers library raises its own exception type)
        raise InputError(f"{path}: not a tokenizer the tokenizers library can load ({e}); {COPY_AGAIN}") from None
    config_path = root / "tokenizer_config.json"
    config = read_json(config_path) if config_path.exists() else {}
    template_path = root / CHAT_TEMPLATE
    if template_path.exists():
        check_template(template_path.read_text(), str(template_path))
    elif isinstance(config.get("chat_template"), str):
        check_template(config["chat_template"], f"{config_path}: field chat_template")
    elif chat:
        raise InputError(
            f"{root}: the chat format needs a chat template, and there is no {CHAT_TEMPLATE} and no "
            "chat_template in tokenizer_config.json: use a model with one, or another dataset format"
        )
    for name in ("bos_token", "eos_token"):
        token = config.get(name)
        token = token.get("content") if isinstance(token, dict) else token
        if token is not None and tokenizer.token_to_id(token) is None:
            raise InputError(f"{config_path}: field {name} {token!r} is not a token of {path}")


def check_template(source: str, where: str) -> None:
    """A chat template that compiles, or the line of its first syntax error."""
    from jinja2 import TemplateSyntaxError

    from gemma_workloads.data import compiled_template

    try:
        compiled_template(source)
    except TemplateSyntaxError as e:
        raise InputError(f"{where}:{e.lineno}: chat template syntax error: {e.message}; {COPY_AGAIN}") from None
