"""JSONL training data: read, check, and tokenise with the checkpoint's own tokenizer.

Every line is checked at start-up, before a TPU second is spent: a bad line stops the run with
the file, the line number and what is wrong (or, with `skip_invalid`, is counted and reported).
Each example is tokenised as the server will tokenise the same request, and loss goes only on
what the model should learn to write: each assistant turn of a chat, after the prompt vLLM's chat
endpoint would send for it, with its closing end-of-turn token (so the model learns to stop); the
completion of a prompt-completion pair (plus EOS); all of a plain text (plus EOS); for a
preference pair, the chosen and the rejected answer, each rendered after the same prompt as a chat
answer is.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from etils import epath

from gemma_workloads.config import DatasetConfig
from gemma_workloads.input_files import InputError

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")
# Message fields the chat template would render into the prompt in ways not trained here.
UNTRAINED_FIELDS = {
    "reasoning": "thinking is",
    "reasoning_content": "thinking is",
    "thinking": "thinking is",
    "tool_calls": "tool calls are",
}


class DataError(InputError):
    """The dataset (or the tokenizer files it needs) cannot be used; the message says where."""


@dataclass(frozen=True)
class Example:
    """One tokenised example: ids and which of them are trained on."""

    tokens: np.ndarray  # int32 [n]
    loss_mask: np.ndarray  # bool [n]
    line: int = 0  # the dataset line it came from (0: unknown); a chat line may give several examples

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
    """The checkpoint's tokenizer.json, chat template and special tokens, read as the server reads them.

    Text is tokenised as transformers, and so vLLM, tokenises a prompt: tokenizer.json's own
    post-processor decides which special tokens are added. `add_bos_token` in tokenizer_config.json
    is not read: transformers 5 drops it when tokenizer.json exists (`_from_pretrained` in
    transformers/tokenization_utils_base.py). The chat template is rendered like transformers does
    (sandboxed Jinja, trim_blocks and lstrip_blocks).
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
        self.bos_id = self._id("bos_token") if self.special["bos_token"] else None
        self.eos_id = self._id("eos_token")
        self.control_ids = {i for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special}
        generation_file = root / "generation_config.json"
        stops = json.loads(generation_file.read_text()).get("eos_token_id") if generation_file.exists() else None
        # vLLM stops at the tokenizer's EOS and at generation_config.json's eos_token_id
        # (SamplingParams.update_from_generation_config in vllm/sampling_params.py).
        self.stop_ids = {self.eos_id, *([stops] if isinstance(stops, int) else stops or [])}
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
        return self.tokenizer.encode(text, add_special_tokens=special).ids

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

    def chat(self, messages: list[dict]) -> list[Example]:
        """One sequence per assistant turn with content: the prompt the server sends for it (the
        template's rendering of the conversation before it, with the generation prompt), not
        trained, then the turn's content (trimmed, as the template shows it) and the end-of-turn
        token, trained. A turn whose prompt extends the previous sequence joins it (templates that
        render a conversation as a growing prefix); otherwise it starts a sequence of its own."""
        sequences: list[tuple[list[int], list[bool]]] = []
        for i, message in enumerate(messages):
            content = message["content"].strip()
            if message["role"] != "assistant" or not content:
                continue
            prompt, answer = self._prompt_and_answer(messages[:i], content, f"messages[{i}].content")
            if not sequences or prompt[: len(sequences[-1][0])] != sequences[-1][0]:
                sequences.append(([], []))
            tokens, mask = sequences[-1]
            mask += [False] * (len(prompt) - len(tokens)) + [True] * (len(answer) + 1)
            tokens += prompt[len(tokens) :] + answer + [self.end_of_turn_id]
        return [Example(np.asarray(tokens, np.int32), np.asarray(mask, bool)) for tokens, mask in sequences]

    def answer(self, messages: list[dict], content: str, where: str) -> Example:
        """One trained answer to a conversation: the server's prompt for it (the template's rendering
        with the generation prompt), not trained, then the answer (trimmed) and the end-of-turn
        token, trained. `where` names the answer's field in errors."""
        prompt, answer = self._prompt_and_answer(messages, content.strip(), where)
        tokens = prompt + answer + [self.end_of_turn_id]
        mask = np.r_[np.zeros(len(prompt), bool), np.ones(len(answer) + 1, bool)]
        return Example(np.asarray(tokens, np.int32), mask)

    def _prompt_and_answer(self, messages: list[dict], content: str, where: str) -> tuple[list[int], list[int]]:
        prompt = self._encode(self.render(messages, generation_prompt=True), special=False)
        answer = self._encode(content, special=False)
        control = [self.tokenizer.id_to_token(t) for t in answer if t in self.control_ids]
        if control:
            raise ValueError(
                f"{where} contains {control[0]!r}, a control token of the chat format: an answer must be "
                "plain text (thinking is not trained: the server prompts with it off)"
            )
        return prompt, answer

    @functools.cached_property
    def end_of_turn_id(self) -> int:
        """The token that ends a model turn: what the template writes right after an answer."""
        answer = "The answer."
        text = self.render([{"role": "user", "content": "A question?"}, {"role": "assistant", "content": answer}])
        after = text[text.rindex(answer) + len(answer) :]
        ids = self._encode(after, special=False)
        if not ids or ids[0] not in self.control_ids:
            raise DataError(
                f"the chat template ends a model turn with {after[:24]!r}, not with a special token, "
                "so the model cannot be taught where its answer ends"
            )
        if ids[0] not in self.stop_ids:
            log.warning(
                "the chat template ends a model turn with %r, where vLLM does not stop (it stops at ids %s: "
                "tokenizer_config.json's eos_token and generation_config.json's eos_token_id): served "
                "answers will run on past it",
                self.tokenizer.id_to_token(ids[0]),
                sorted(self.stop_ids),
            )
        return ids[0]

    def render(self, messages: list[dict], *, generation_prompt: bool = False) -> str:
        if self.chat_template is None:
            raise DataError(
                "the chat format needs a chat template: the checkpoint has no chat_template.jinja "
                "and no chat_template in tokenizer_config.json"
            )
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

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
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


def _messages(row: dict, key: str = "messages", *, answered: bool = True) -> list[dict]:
    """The chat messages of `row[key]`, checked; `answered`: at least one assistant turn has content."""
    messages = row[key]
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"field {key!r} must be a non-empty list")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not {"role", "content"} <= set(message):
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content'")
        if message["role"] not in ROLES:
            hint = " (tool calls and their results are not trained)" if message["role"] == "tool" else ""
            raise ValueError(f"messages[{i}].role is {message['role']!r}; expected one of {list(ROLES)}{hint}")
        untrained = [f for f in UNTRAINED_FIELDS if message.get(f)]
        if untrained:
            raise ValueError(
                f"messages[{i}] has {untrained[0]!r}: {UNTRAINED_FIELDS[untrained[0]]} not trained "
                "(the server prompts with thinking off and no tools); leave the field out"
            )
        if not isinstance(message["content"], str):
            raise ValueError(f"messages[{i}].content must be a string (only text is supported)")
    if answered and not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
        raise ValueError("no assistant message with content: nothing to train on")
    return messages


def _preference(row: dict) -> None:
    """A prompt (a user turn, or the conversation so far ending with a user turn) and two different
    answers to it."""
    if isinstance(row["prompt"], str):
        _string(row, "prompt")
    elif _messages(row, "prompt", answered=False)[-1]["role"] != "user":
        raise ValueError("field 'prompt': the conversation must end with a user turn (the one answered)")
    chosen, rejected = _string(row, "chosen"), _string(row, "rejected")
    if chosen.strip() == rejected.strip():
        raise ValueError("fields 'chosen' and 'rejected' are the same answer: the pair prefers nothing")


def _prompt_messages(row: dict) -> list[dict]:
    prompt = row["prompt"]
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt


def _pair(codec: TextCodec, row: dict) -> list[Example]:
    """The chosen and the rejected answer, each after the same prompt: [chosen, rejected]."""
    messages = _prompt_messages(row)
    return [codec.answer(messages, row[key], f"field {key!r}") for key in ("chosen", "rejected")]


# format -> (required fields, check of their values, encoder)
FORMATS: dict[str, tuple[tuple[str, ...], Callable[[dict], object], Callable[[TextCodec, dict], list[Example]]]] = {
    "chat": (("messages",), _messages, lambda codec, row: codec.chat(row["messages"])),
    "prompt-completion": (
        ("prompt", "completion"),
        lambda row: (_string(row, "prompt", empty_ok=True), _string(row, "completion")),
        lambda codec, row: [codec.prompt_completion(row["prompt"], row["completion"])],
    ),
    "text": (("text",), lambda row: _string(row, "text"), lambda codec, row: [codec.text(row["text"])]),
    # Two examples a line, the chosen answer first (training.pairs keeps them together).
    "preference": (("prompt", "chosen", "rejected"), _preference, _pair),
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
                invalid(
                    config,
                    skipped,
                    number,
                    f"byte 0x{raw[e.start]:02x} at column {e.start + 1} is not UTF-8 (save the file as UTF-8)",
                )
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
            out.items.extend(replace(e, line=number) for e in encode(codec, row))
        except DataError:
            raise
        except Exception as e:  # noqa: BLE001 (a template may raise anything; the line is what matters)
            invalid(config, out.skipped, number, str(e))
    if not out.items:
        raise no_usable_examples(config, out.skipped)
    if not config.chat and codec.bos_id is not None and any(e.tokens[0] != codec.bos_id for e in out.items):
        bos = codec.special["bos_token"]
        log.warning(
            "%s: rows are trained without %s: this tokenizer adds none, nor does vLLM's /v1/completions to "
            "the same text; Gemma was pretrained with it first, so start both rows and requests with the "
            "text %s",
            config.path,
            bos,
            bos,
        )
    if out.skipped:
        log.warning(
            "skipped %d invalid line(s) of %s (skip_invalid): %s",
            len(out.skipped),
            config.path,
            "; ".join(out.skipped[:5]) + (" ..." if len(out.skipped) > 5 else ""),
        )
    return out
