"""How a greedy answer is scored against a row's expected answer.

Both sides are compared whitespace-normalised (runs of spaces, tabs and newlines are one space,
none at the ends): a tokenizer may decode a leading space or a trailing newline the row does not
write. `regexMatch` searches the answer as decoded (`re.search`: anchor the pattern to match the
whole answer). A metric is reported only over the rows it applies to; with none, not at all.
"""

from __future__ import annotations

import re


def normalise(text: str) -> str:
    return " ".join(text.split())


def exact_match(answer: str, expected: str) -> bool:
    return normalise(answer) == normalise(expected)


def contains(answer: str, expected: str) -> bool:
    return normalise(expected) in normalise(answer)


def regex_match(answer: str, pattern: str) -> bool:
    return re.search(pattern, answer) is not None


def hits(answer: str, expected: str | None, pattern: str | None) -> dict[str, bool]:
    """The match metrics that apply to a row, and whether its answer scores on each."""
    out = {}
    if expected is not None:
        out["exactMatch"] = exact_match(answer, expected)
        out["contains"] = contains(answer, expected)
    if pattern is not None:
        out["regexMatch"] = regex_match(answer, pattern)
    return out


def rates(per_row: list[dict[str, bool]]) -> dict[str, tuple[float, int]]:
    """Each metric's share of hits over the rows it applies to, and that number of rows."""
    out = {}
    for name in ("exactMatch", "contains", "regexMatch"):
        scored = [h[name] for h in per_row if name in h]
        if scored:
            out[name] = (sum(scored) / len(scored), len(scored))
    return out
