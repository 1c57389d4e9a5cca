"""Live progress for the operator: `Progress` lines on stdout and `progress.json` in the output.

A Tunix training hook: the trainer reports each optimizer step's mean loss once the step has
finished (one step late, so it never waits on the device), which makes the wall time between two
reports the time of one step. The first step includes compilation and is left out of throughput.
"""

from __future__ import annotations

import sys
import time

from etils import epath
from tunix.sft import hooks

from gemma_workloads.config import Progress, join
from gemma_workloads.metrics import mfu

PROGRESS_FILE = "progress.json"


class ProgressReporter(hooks.TrainingHooks):
    def __init__(self, *, total_steps: int, log_every: int, output_dir: str, tokens_in_step: dict[int, int],
                 flops_per_token: float, devices: int, peak_tflops: float | None, primary: bool):
        self.total_steps, self.log_every, self.primary = total_steps, log_every, primary
        self.path = epath.Path(join(output_dir, PROGRESS_FILE))
        self.tokens_in_step = tokens_in_step  # filled by the data feed as it hands out micro-batches
        self.flops_per_token, self.devices, self.peak = flops_per_token, devices, peak_tflops
        self.history: list[Progress] = []
        self.loss: float | None = None
        self.eval_loss: float | None = None
        self._start: tuple[float, int] | None = None  # (time, tokens) when the clock started
        self._window: tuple[float, int] | None = None  # the same at the last report
        self._tokens = 0

    def tokens_per_second(self, since: tuple[float, int] | None = None) -> float | None:
        since = since or self._start
        if since is None or self._tokens == since[1]:
            return None
        return (self._tokens - since[1]) / (time.perf_counter() - since[0])

    def on_train_step_end(self, train_ctx, train_step: int, train_loss: float) -> None:
        now = time.perf_counter()
        self.loss = float(train_loss)
        if self._start is None:
            self._start = self._window = (now, 0)
        else:
            self._tokens += self.tokens_in_step.pop(train_step, 0)
        if train_step % self.log_every == 0 or train_step >= self.total_steps:
            self.report(train_step)

    def report(self, step: int) -> None:
        rate = self.tokens_per_second(self._window)
        self._window = (time.perf_counter(), self._tokens)
        progress = Progress(step=step, total_steps=self.total_steps, loss=self.loss, tokens_per_second=rate,
                            mfu=mfu(rate, self.flops_per_token, self.devices, self.peak) if rate else None,
                            eval_loss=self.eval_loss)
        self.history.append(progress)
        if self.primary:
            print(progress.line(), file=sys.stdout, flush=True)
            self.path.write_text(progress.model_dump_json(exclude_none=True))

    def on_eval_step_end(self, train_ctx, eval_loss: float) -> None:
        self.eval_loss = float(train_ctx.metrics_logger.get_metric_history(train_ctx.metrics_prefix, "loss", "eval")[-1])

    def on_train_start(self, train_ctx) -> None:
        pass

    def on_train_end(self, train_ctx) -> None:
        pass

    def on_train_step_start(self, train_ctx) -> None:
        pass

    def on_eval_step_start(self, train_ctx) -> None:
        pass
