"""What `gemma-tpu dev` prints while the pipeline runs: a `kubectl get -w`-like table of both
kinds, one line per change, with a progress bar for training."""

from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO


def bar(step: int, total: int | None, width: int = 20) -> str:
    if not total:
        return f"step {step}"
    done = min(width, int(width * step / total))
    return f"[{'#' * done}{'.' * (width - done)}] {step}/{total}"


def describe(obj: dict[str, Any]) -> str:
    """The interesting part of a CR's status, in one line."""
    st = obj.get("status") or {}
    progress = st.get("progress") or {}
    if st.get("phase") == "Training" and progress:
        loss = f" loss {progress['loss']:.3f}" if progress.get("loss") is not None else ""
        tps = f" {progress['tokensPerSecond']:.0f} tok/s" if progress.get("tokensPerSecond") else ""
        return bar(progress.get("step", 0), progress.get("totalSteps")) + loss + tps
    return st.get("message") or ""


@dataclass
class Table:
    out: TextIO = field(default_factory=lambda: sys.stdout)
    started: float = field(default_factory=time.monotonic)
    last: dict[str, tuple] = field(default_factory=dict)
    phases: dict[str, dict[str, float]] = field(default_factory=dict)  # name -> phase -> first seen (s)

    def header(self) -> None:
        print(f"{'TIME':>7}  {'RESOURCE':<34} {'PHASE':<16} DETAIL", file=self.out, flush=True)

    def update(self, objs: list[dict[str, Any]]) -> None:
        for obj in objs:
            name = f"{obj['kind'].lower()}/{obj['metadata']['name']}"
            phase = (obj.get("status") or {}).get("phase") or "-"
            detail = describe(obj)
            now = time.monotonic() - self.started
            self.phases.setdefault(name, {}).setdefault(phase, now)
            if self.last.get(name) != (phase, detail):
                self.last[name] = (phase, detail)
                print(f"{now:6.1f}s  {name:<34} {phase:<16} {detail}", file=self.out, flush=True)

    def durations(self) -> list[tuple[str, str, float]]:
        """(resource, phase, seconds spent in it) from the first time each phase was seen."""
        rows = []
        for name, seen in self.phases.items():
            ordered = sorted(seen.items(), key=lambda kv: kv[1])
            for (phase, t0), (_, t1) in itertools.pairwise(ordered):
                rows.append((name, phase, t1 - t0))
        return rows
