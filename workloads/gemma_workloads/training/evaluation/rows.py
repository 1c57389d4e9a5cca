"""The rows an evaluation scores: read and tokenised by the training data code, so the tokens
scored are exactly the tokens trained on (chat template, special tokens and answer masks alike).

A row is one line of the eval JSONL (or of the held-out split of the dataset). All of its
examples are scored for loss; a chat or prompt-completion row is also answered by greedy
generation from the prompt of its last trained answer, and the answer scored against:

- chat `{messages, expected_regex?}`: the last assistant turn's content (trimmed, as trained);
  the prompt is the conversation before it, rendered with the generation prompt;
- prompt-completion `{prompt, completion, expected_regex?}`: the completion;
- text `{text}`: loss only (there is no prompt to answer);
- preference `{prompt, chosen, rejected, expected?, expected_regex?}`: the loss of the chosen
  answer, and the log-probability margin of chosen over rejected; answered only where `expected`
  or `expected_regex` is given.

`expected_regex` (optional, a Python regular expression) is searched for in the answer.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace

import numpy as np

from gemma_workloads.config import DatasetConfig, EvaluationConfig
from gemma_workloads.data import FORMATS, DataError, Example, TextCodec, invalid, no_usable_examples, rows

log = logging.getLogger(__name__)

REGEX_FIELD = "expected_regex"
EXPECTED_FIELD = "expected"  # a preference row's answer to match (the other formats' is their answer)


@dataclass(frozen=True)
class EvalRow:
    line: int
    examples: list[Example]  # scored for loss, as training tokenises the line
    prompt: np.ndarray | None  # int32: what greedy generation continues; None: a text row
    prompt_text: str  # the prompt as the predictions file shows it
    expected: str | None  # the answer to match exactly or contain
    expected_regex: str | None
    rejected: Example | None = None  # a preference row's rejected answer (examples holds the chosen one)


def check_regex(row: dict, fmt: str) -> str | None:
    """The row's `expected_regex`, checked: a string that compiles, on a row with a prompt."""
    if fmt == "preference" and EXPECTED_FIELD in row and not isinstance(row[EXPECTED_FIELD], str):
        raise ValueError(f"field {EXPECTED_FIELD!r} must be a string, got {type(row[EXPECTED_FIELD]).__name__}")
    if REGEX_FIELD not in row:
        return None
    pattern = row[REGEX_FIELD]
    if fmt == "text":
        raise ValueError(
            f"field {REGEX_FIELD!r}: text rows have no prompt to answer; use the chat or "
            "prompt-completion format for generated answers"
        )
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"field {REGEX_FIELD!r} must be a non-empty string, got {pattern!r}")
    try:
        re.compile(pattern)
    except re.error as e:
        raise ValueError(f"field {REGEX_FIELD!r}: {pattern!r} is not a valid regular expression ({e})") from None
    return pattern


def eval_dataset(dataset: DatasetConfig, evaluation: EvaluationConfig) -> DatasetConfig:
    """The eval file read as the training data are: same format, length and skipping rules."""
    return dataset.model_copy(update={"path": evaluation.path, "eval_fraction": 0.0, "packing": False})


def _last_prompt(example: Example) -> np.ndarray:
    """The tokens before the example's last trained span: the prompt of its last answer."""
    trained = np.flatnonzero(example.loss_mask)
    start = trained[-1]
    while start > 0 and example.loss_mask[start - 1]:
        start -= 1
    return example.tokens[:start]


def _row(number: int, row: dict, fmt: str, codec: TextCodec, examples: list[Example]) -> EvalRow:
    regex = check_regex(row, fmt)
    if fmt == "text":
        return EvalRow(number, examples, None, "", None, None)
    prompt = _last_prompt(examples[-1])
    if not len(prompt):  # an empty prompt, with no BOS: nothing to answer
        return EvalRow(number, examples, None, "", None, None)
    if fmt == "preference":
        chosen, rejected = examples
        expected = row.get(EXPECTED_FIELD)
        if expected is None and regex is None:  # nothing to match an answer against: not answered
            return EvalRow(number, [chosen], None, "", None, None, rejected)
        text = codec.tokenizer.decode(prompt.tolist(), skip_special_tokens=False)
        return EvalRow(number, [chosen], prompt, text, expected, regex, rejected)
    if fmt == "chat":
        expected = next(
            m["content"] for m in reversed(row["messages"]) if m["role"] == "assistant" and m["content"].strip()
        )
        text = codec.tokenizer.decode(prompt.tolist(), skip_special_tokens=False)
        return EvalRow(number, examples, prompt, text, expected.strip(), regex)
    return EvalRow(number, examples, prompt, row["prompt"], row["completion"], regex)


def read_rows(
    dataset: DatasetConfig, codec: TextCodec, evaluation: EvaluationConfig, lines: set[int] | None = None
) -> list[EvalRow]:
    """The first `max_rows` usable rows of `dataset` (of `lines` only, when given), each checked to
    leave room for `max_new_tokens` within `max_seq_len`. Examples longer than `max_seq_len` are
    left out, as training leaves them out."""
    out: list[EvalRow] = []
    skipped: list[str] = []
    encode = FORMATS[dataset.format][2]
    too_long = 0
    for number, row in rows(dataset, skipped):
        if lines is not None and number not in lines:
            continue
        try:
            examples = [replace(e, line=number) for e in encode(codec, row)]
            kept = [e for e in examples if len(e) <= dataset.max_seq_len]
            too_long += len(examples) - len(kept)
            if not kept or (dataset.format == "preference" and len(kept) < len(examples)):
                continue
            item = _row(number, row, dataset.format, codec, kept)
        except DataError:
            raise
        except Exception as e:  # noqa: BLE001 (as in training: the line is what matters)
            invalid(dataset, skipped, number, str(e))
            continue
        if item.prompt is not None and len(item.prompt) + evaluation.max_new_tokens > dataset.max_seq_len:
            raise DataError(
                f"{dataset.path}:{number}: the prompt of {len(item.prompt)} tokens plus "
                f"evaluation.max_new_tokens {evaluation.max_new_tokens} exceeds dataset.max_seq_len "
                f"{dataset.max_seq_len}: lower max_new_tokens or raise max_seq_len"
            )
        out.append(item)
        if len(out) == evaluation.max_rows:
            break
    if too_long:
        log.warning(
            "evaluation: left out %d example(s) of %s longer than max_seq_len %d",
            too_long,
            dataset.path,
            dataset.max_seq_len,
        )
    if not out:
        raise no_usable_examples(dataset, skipped)
    return out
