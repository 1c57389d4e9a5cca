"""SIGTERM: stop at the next consistent point, with a final checkpoint if the grace period allows.

Kubernetes sends SIGTERM (spot reclaim, maintenance, eviction) and SIGKILLs the pod
`terminationGracePeriodSeconds` later. A checkpoint is consistent only between optimizer steps
(gradient accumulation keeps a partial sum in the optimizer state), so the run finishes the
optimizer step it is in and saves, when the measured step and save times say that fits in what is
left of the grace period; otherwise it stops at once and the latest periodic checkpoint stands.
Either way the process exits with EXIT_PREEMPTED, which the operator retries.

On a multi-host slice every host must stop at the same step and save together, so the decision
comes from JAX's preemption sync point (JAX's distributed runtime receives the notice) and the
grace-period estimate, which hosts could disagree on, is not used.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class Preempted(Exception):
    """Raised to leave the training loop at once, without another checkpoint."""


class Preemption:
    """Whether a stop was requested, and whether work of a given length still fits before SIGKILL."""

    def __init__(self, grace_seconds: float, *, multi_host: bool):
        self.grace_seconds = grace_seconds
        self.multi_host = multi_host
        self.signalled_at: float | None = None
        self._previous: Callable[[int, FrameType | None], Any] | int | None = None  # the SIGTERM handler replaced

    def __enter__(self) -> Preemption:
        if not self.multi_host:  # there, JAX's runtime listens for the notice itself
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def _on_sigterm(self, signum, frame) -> None:
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()
            log.warning("SIGTERM: stopping at the next optimizer step (grace period %.0f s)", self.grace_seconds)

    def requested(self, step: int) -> bool:
        """Single host: SIGTERM was received. Multi-host: call at optimizer-step boundaries only,
        with the same step on every host."""
        if self.multi_host:
            return ocp.multihost.reached_preemption(step)
        return self.signalled_at is not None

    def fits(self, seconds: float) -> bool:
        if self.multi_host or self.signalled_at is None:
            return True
        return time.monotonic() - self.signalled_at + seconds <= self.grace_seconds
