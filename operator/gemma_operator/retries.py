"""Failed reconciles run again, whatever the resource's phase, after a back-off.

kopf does not retry `on.event` handlers, and the poller only revisits resources in an active
phase: without this, one fault seen by the one reconcile that notices a change (a pod that died
under a Ready GemmaServe) would leave the status saying what no longer holds. The delay doubles
with each consecutive failure of the same resource, from BASE up to CAP seconds, and is never
shorter than the API server's Retry-After. A reconcile that succeeds, for whatever reason it
ran, resets the back-off and makes a pending retry unnecessary.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable

from gemma_operator.kube import ApiError

BASE, CAP = 0.5, 30.0  # seconds


def delay(failures: int, error: BaseException) -> float:
    """Seconds before retrying after the `failures`-th consecutive failure."""
    backoff = min(CAP, BASE * 2 ** max(0, failures - 1))
    retry_after = error.retry_after if isinstance(error, ApiError) else None
    return max(backoff, min(CAP, retry_after or 0.0))


class Retries:
    """One pending retry per resource, at most."""

    def __init__(self) -> None:
        self._failures: dict[Hashable, int] = {}
        self._pending: dict[Hashable, asyncio.Task] = {}

    def failed(self, key: Hashable, error: BaseException, run: Callable[[], Awaitable[None]]) -> float:
        """Schedule `run` after the back-off; returns the delay chosen."""
        self._failures[key] = failures = self._failures.get(key, 0) + 1
        wait = delay(failures, error)
        if key not in self._pending:
            self._pending[key] = asyncio.create_task(self._later(key, wait, run))
        return wait

    def succeeded(self, key: Hashable) -> None:
        self._failures.pop(key, None)
        self.forget(key)

    def forget(self, key: Hashable) -> None:
        task = self._pending.pop(key, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def cancel_all(self) -> None:
        for key in list(self._pending):
            self.forget(key)

    async def _later(self, key: Hashable, wait: float, run: Callable[[], Awaitable[None]]) -> None:
        await asyncio.sleep(wait)
        self._pending.pop(key, None)
        await run()


POLL_BACKOFF_CAP = 60.0  # seconds between attempts at most, while the API cannot be reached


class Outage:
    """A background task's view of API failures: logged when they start and when they end, not at
    every attempt, with a pause that doubles while they last."""

    def __init__(self, task: str, log: logging.Logger) -> None:
        self.task, self.log, self.failures = task, log, 0

    def pause(self, period: float) -> float:
        return period if not self.failures else min(POLL_BACKOFF_CAP, period * 2**self.failures)

    def failed(self, error: ApiError) -> None:
        if not self.failures:
            self.log.warning("%s cannot reach the API, retrying with back-off: %s", self.task, error)
        self.failures += 1

    def recovered(self) -> None:
        if self.failures:
            self.log.warning("%s reaches the API again after %d failed attempt(s)", self.task, self.failures)
        self.failures = 0
