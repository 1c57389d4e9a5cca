"""JSONL training data: read, check, and tokenise with the checkpoint's own tokenizer.

Every line is checked at start-up, before a TPU second is spent: a bad line stops the run with
the file, the line number and what is wrong (or, with `skip_invalid`, is counted and reported).
Loss goes only on what the model should learn to write: the assistant turns of a chat (their
closing end-of-turn token included, so the model learns to stop), the completion of a
prompt-completion pair (plus EOS), and all of a plain text (plus EOS).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from etils import epath

from gemma_workloads.config import DatasetConfig
from gemma_workloads.input_files import InputError

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")


class DataError(InputError):
    """The dataset (or the tokenizer files it needs) cannot be used; the message says where."""


@dataclass(frozen=True)
class Example:
    """One tokenised example: ids and which of them are trained on."""

    tokens: np.ndarray  # int32 [n]
    loss_mask: np.ndarray  # bool [n]

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class Examples:
    """What came out of a dataset file, with what was left out and why."""

    items: list[Example]
    skipped: list[str] = field(default_factory=list)  # invalid lines (only with skip_invalid)


def _special(config: dict, name: str) -> str | None:
    value = config.get(name)
    return value.get("content") if isinstance(value, dict) else value


class TextCodec:
    """The checkpoint's tokenizer.json, chat template and special tokens.

    The chat template is rendered like transformers does (sandboxed Jinja, trim_blocks and
    lstrip_blocks), so the token stream is the one the released model saw in training.
    """

    def __init__(self, model_path: str):
        from tokenizers import Tokenizer

        root = epath.Path(model_path)
        try:
            self.tokenizer = Tokenizer.from_str((root / "tokenizer.json").read_text())
        except FileNotFoundError:
            raise DataError(f"{root / 'tokenizer.json'} not found: the checkpoint must carry its tokenizer") from None
        config_file = root / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.exists() else {}
        self.special = {n: _special(config, n) for n in ("bos_token", "eos_token", "pad_token", "unk_token")}
        self.add_bos = bool(config.get("add_bos_token", False))
        self.bos_id = self._id("bos_token") if self.special["bos_token"] else None
        self.eos_id = self._id("eos_token")
        template_file = root / "chat_template.jinja"
        template = template_file.read_text() if template_file.exists() else config.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        self.chat_template = template

    def _id(self, name: str) -> int:
        token = self.special[name]
        token_id = self.tokenizer.token_to_id(token) if token else None
        if token_id is None:
            raise DataError(f"tokenizer_config.json: {name} {token!r} is not in tokenizer.json")
        return token_id

    def _encode(self, text: str, *, special: bool) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=special).ids
        if special and self.add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids = [self.bos_id, *ids]
        return ids

    def text(self, text: str) -> Example:
        ids = self._encode(text, special=True) + [self.eos_id]
        mask = np.ones(len(ids), bool)
        mask[0] = False  # nothing predicts the first token
        return Example(np.asarray(ids, np.int32), mask)

    def prompt_completion(self, prompt: str, completion: str) -> Example:
        prompt_ids = self._encode(prompt, special=True)
        completion_ids = self._encode(completion, special=False) + [self.eos_id]
        mask = np.r_[np.zeros(len(prompt_ids), bool), np.ones(len(completion_ids), bool)]
        return Example(np.asarray(prompt_ids + completion_ids, np.int32), mask)

    def chat(self, messages: list[dict]) -> Example:
        """Render the conversation; train on the characters each assistant turn adds after the
        generation prompt, found by rendering the conversation's growing prefixes."""
        full = self.render(messages)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self.render(messages[:i], generation_prompt=True)
            after = self.render(messages[: i + 1])
            if not (after.startswith(before) and full.startswith(after)):
                raise ValueError("the chat template does not render this conversation as a growing prefix, "
                                 "so the assistant's tokens cannot be told apart")
            spans.append((len(before), len(after)))
        encoding = self.tokenizer.encode(full, add_special_tokens=False)
        starts = np.asarray([start for start, _ in encoding.offsets], np.int64)
        mask = np.zeros(len(starts), bool)
        for lo, hi in spans:
            mask |= (starts >= lo) & (starts < hi)
        return Example(np.asarray(encoding.ids, np.int32), mask)

    def render(self, messages: list[dict], *, generation_prompt: bool = False) -> str:
        if self.chat_template is None:
            raise DataError("the chat format needs a chat template: the checkpoint has no chat_template.jinja "
                            "and no chat_template in tokenizer_config.json")
        return compiled_template(self.chat_template).render(
            messages=messages, add_generation_prompt=generation_prompt, **self.special
        )


_TEMPLATES: dict[str, Any] = {}


def compiled_template(source: str):
    if source not in _TEMPLATES:
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = raise_exception
        _TEMPLATES[source] = env.from_string(source)
    return _TEMPLATES[source]


# ---------------------------------------------------------------------------- validation


def _string(row: dict, key: str, *, empty_ok: bool = False) -> str:
    value = row[key]
    if not isinstance(value, str):
        raise ValueError(f"field {key!r} must be a string, got {type(value).__name__}")
    if not empty_ok and not value.strip():
        raise ValueError(f"field {key!r} is empty")
    return value


def _messages(row: dict) -> list[dict]:
    messages = row["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError("field 'messages' must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not {"role", "content"} <= set(message):
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content'")
        if message["role"] not in ROLES:
            raise ValueError(f"messages[{i}].role is {message['role']!r}; expected one of {list(ROLES)}")
        if not isinstance(message["content"], str):
            raise ValueError(f"messages[{i}].content must be a string (only text is supported)")
    if not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
        raise ValueError("no assistant message with content: nothing to train on")
    return messages


# format -> (required fields, check of their values, encoder)
FORMATS = {
    "chat": (("messages",), _messages, lambda codec, row: codec.chat(row["messages"])),
    "prompt-completion": (
        ("prompt", "completion"),
        lambda row: (_string(row, "prompt", empty_ok=True), _string(row, "completion")),
        lambda codec, row: codec.prompt_completion(row["prompt"], row["completion"]),
    ),
    "text": (("text",), lambda row: _string(row, "text"), lambda codec, row: codec.text(row["text"])),
}


def parse_line(line: str, fmt: str) -> dict:
    """One JSONL line as a row of `fmt`: a JSON object with the format's fields, of the right types."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON ({e})") from None
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    fields, check, _ = FORMATS[fmt]
    missing = [f for f in fields if f not in row]
    if missing:
        raise ValueError(f"format {fmt!r} needs field(s) {list(fields)}; missing {missing}, found {sorted(row)}")
    check(row)
    return row


def rows(config: DatasetConfig, skipped: list[str]) -> Iterator[tuple[int, dict]]:
    """(line number, row) of each usable line. Lines are decoded one at a time, so a byte that is
    not UTF-8 is one bad line (file:line), which `skip_invalid` skips like any other: a bad line
    raises DataError, or with `skip_invalid` is added to `skipped`."""
    path = epath.Path(config.path)
    if path.is_dir():
        raise DataError(f"dataset {config.path} is a folder: dataset.path must name the JSONL file")
    try:
        f = path.open("rb")
    except FileNotFoundError:
        raise DataError(f"dataset {config.path} not found") from None
    with f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
                if line.strip():
                    yield number, parse_line(line, config.format)
            except UnicodeDecodeError as e:
                invalid(config, skipped, number, f"byte 0x{raw[e.start]:02x} at column {e.start + 1} is not UTF-8 "
                                                 "(save the file as UTF-8)")  # fmt: skip
            except ValueError as e:
                invalid(config, skipped, number, str(e))


def invalid(config: DatasetConfig, skipped: list[str], number: int, problem: str) -> None:
    """A bad line: fatal, or counted with `skip_invalid`."""
    problem = f"{config.path}:{number}: {problem}"
    if not config.skip_invalid:
        raise DataError(problem)
    skipped.append(problem)


def no_usable_examples(config: DatasetConfig, skipped: list[str]) -> DataError:
    count = f" ({len(skipped)} invalid)" if skipped else ""
    return DataError(f"dataset {config.path} has no usable examples{count}")


def read_examples(config: DatasetConfig, codec: TextCodec) -> Examples:
    """Every line of the JSONL file, tokenised; raise DataError on the first bad one."""
    out = Examples([])
    encode = FORMATS[config.format][2]
    for number, row in rows(config, out.skipped):
        try:
            out.items.append(encode(codec, row))
        except DataError:
            raise
        except Exception as e:  # noqa: BLE001 (a template may raise anything; the line is what matters)
            invalid(config, out.skipped, number, str(e))
    if not out.items:
        raise no_usable_examples(config, out.skipped)
    if out.skipped:
        log.warning("skipped %d invalid line(s) of %s (skip_invalid): %s", len(out.skipped), config.path,
                    "; ".join(out.skipped[:5]) + (" ..." if len(out.skipped) > 5 else ""))
    return out
