"""Time as the Kubernetes API writes it: UTC, whole seconds, RFC 3339 with a Z."""

from __future__ import annotations

import datetime


def now() -> datetime.datetime:
    return datetime.datetime.now(tz=datetime.UTC)


def timestamp(t: datetime.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
