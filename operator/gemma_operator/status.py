"""Status bookkeeping shared by both kinds: conditions, and patches that also remove fields."""

from __future__ import annotations

import datetime
from typing import Any


def now() -> datetime.datetime:
    return datetime.datetime.now(tz=datetime.UTC)


def timestamp(t: datetime.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    generation: int,
    at: datetime.datetime,
) -> list[dict[str, Any]]:
    """Conditions in the metav1.Condition shape; lastTransitionTime moves only on a flip."""
    value = "True" if status else "False"
    out = [dict(c) for c in conditions if c.get("type") != type_]
    previous = next((c for c in conditions if c.get("type") == type_), None)
    since = previous.get("lastTransitionTime") if previous and previous.get("status") == value else timestamp(at)
    out.append({
        "type": type_, "status": value, "reason": reason, "message": message,
        "lastTransitionTime": since, "observedGeneration": generation,
    })  # fmt: skip
    return sorted(out, key=lambda c: c["type"])


def condition(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def diff_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A merge patch turning `old` into `new`: null for every key that disappears."""
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            sub = diff_patch(before, value)
            if sub:
                patch[key] = sub
        elif value != before:
            patch[key] = value
    return patch
