"""Status conditions in the metav1.Condition shape, shared by both kinds and by their health."""

from __future__ import annotations

import datetime
from typing import Any

from gemma_operator.clock import timestamp


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
    out.append(
        {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": since,
            "observedGeneration": generation,
        }
    )
    return sorted(out, key=lambda c: c["type"])


def condition(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)
