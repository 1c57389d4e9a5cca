"""Live progress for the operator: `Progress` lines on stdout and `progress.json` in the output.

A Tunix training hook. The trainer reports a step's loss one step late, when the next step has
been dispatched (TPUs) or already run (CPUs run it synchronously), so the hook's own call times do
not say which steps are done. At each report it therefore waits for every dispatched step and
counts the tokens of the steps finished since the previous report. What runs before the first
report (compilation) is left out of throughput; the last report gives the run's average.
A step whose loss or gradient norm is not finite stops the run (`NonFiniteStep`).
"""

from __future__ import annotations

import math
import sys
import time

import jax
from etils import epath
from flax import nnx
from tunix.sft import hooks

from gemma_workloads.config import Progress, join
from gemma_workloads.training.flops import mfu

PROGRESS_FILE = "progress.json"


class NonFiniteStep(RuntimeError):
    """A step's loss or gradient is NaN or infinite: nothing after it can be trusted."""


class ProgressReporter(hooks.TrainingHooks):
    def __init__(
        self,
        *,
        total_steps: int,
        log_every: int,
        output_dir: str,
        tokens_in_step: dict[int, int],
        flops_per_token: float,
        devices: int,
        peak_tflops: float | None,
        primary: bool,
    ):
        self.total_steps, self.log_every, self.primary = total_steps, log_every, primary
        self.path = epath.Path(join(output_dir, PROGRESS_FILE))
        self.tokens_in_step = tokens_in_step  # filled by the data feed as it hands out micro-batches
        self.flops_per_token, self.devices, self.peak = flops_per_token, devices, peak_tflops
        self.history: list[Progress] = []
        self.loss: float | None = None
        self.eval_loss: float | None = None
        self._tokens = 0  # tokens of finished steps
        self._now = 0.0  # time of the last report
        self._start: tuple[float, int] | None = None  # (time, tokens) at the first report
        self._window: tuple[float, int] | None = None  # the same at the last report

    def tokens_per_second(self, since: tuple[float, int] | None = None) -> float | None:
        since = since or self._start
        if since is None or self._tokens == since[1]:
            return None
        return (self._tokens - since[1]) / (self._now - since[0])

    def on_train_step_end(self, train_ctx, train_step: int, train_loss: float) -> None:
        self.loss = float(train_loss)
        grad_norm = float(
            train_ctx.metrics_logger.get_metric_history(train_ctx.metrics_prefix, "grad_norm", "train")[-1]
        )
        if not (math.isfinite(self.loss) and math.isfinite(grad_norm)):
            raise NonFiniteStep(
                f"step {train_step}: the loss is {self.loss} and the gradient norm {grad_norm}; training stopped. "
                "Micro-batches that were not finite were not applied, so the checkpoints hold finite weights. "
                "Try a lower learning_rate, or model_dtype float32 to compare"
            )
        last = train_step >= self.total_steps
        if self._start is not None and train_step % self.log_every and not last:
            return
        jax.block_until_ready(nnx.state(train_ctx.model, nnx.LoRAParam))  # every dispatched step is done
        self._now = time.perf_counter()
        done = [s for s in self.tokens_in_step if s <= train_ctx.train_steps]
        self._tokens += sum(self.tokens_in_step.pop(s) for s in done)
        if self._start is None:
            self._start = self._window = (self._now, self._tokens)
        rate = self.tokens_per_second(None if last else self._window)
        self._window = (self._now, self._tokens)
        self.report(train_step, rate)

    def report(self, step: int, rate: float | None) -> None:
        progress = Progress(
            step=step,
            total_steps=self.total_steps,
            loss=self.loss,
            tokens_per_second=rate,
            mfu=mfu(rate, self.flops_per_token, self.devices, self.peak) if rate else None,
            eval_loss=self.eval_loss,
        )
        self.history.append(progress)
        if self.primary:
            print(progress.line(), file=sys.stdout, flush=True)
            self.path.write_text(progress.model_dump_json(exclude_none=True))

    def on_eval_step_end(self, train_ctx, eval_loss: float) -> None:
        self.eval_loss = float(
            train_ctx.metrics_logger.get_metric_history(train_ctx.metrics_prefix, "loss", "eval")[-1]
        )

    def on_train_start(self, train_ctx) -> None:
        pass

    def on_train_end(self, train_ctx) -> None:
        pass

    def on_train_step_start(self, train_ctx) -> None:
        pass

    def on_eval_step_start(self, train_ctx) -> None:
        pass
