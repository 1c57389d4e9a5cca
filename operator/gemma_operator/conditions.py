"""Status conditions in the metav1.Condition shape, shared by both kinds and by their health."""

from __future__ import annotations

import datetime
from typing import Any, Literal

from gemma_operator import api
from gemma_operator.clock import timestamp


def set_condition(
    conditions: list[api.Condition],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    generation: int,
    at: datetime.datetime,
) -> list[api.Condition]:
    """Conditions in the metav1.Condition shape; lastTransitionTime moves only on a flip."""
    value: Literal["True", "False"] = "True" if status else "False"
    out = [c for c in conditions if c.type != type_]
    previous = find(conditions, type_)
    since = previous.last_transition_time if previous and previous.status == value else timestamp(at)
    out.append(
        api.Condition(
            type=type_,
            status=value,
            reason=reason,
            message=message,
            last_transition_time=since,
            observed_generation=generation,
        )
    )
    return sorted(out, key=lambda c: c.type)


def find(conditions: list[api.Condition], type_: str) -> api.Condition | None:
    """The condition of that type in a typed status."""
    return next((c for c in conditions if c.type == type_), None)


def condition(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    """The condition of that type in an object as read (another resource's, or a child's)."""
    return next((c for c in conditions or [] if c.get("type") == type_), None)
