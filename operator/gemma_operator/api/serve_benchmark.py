"""GemmaServe's benchmark: the load measured once per revision and the SLO it is held to (spec), and
the figures and what serving costs at them, and the runs rolled back for missing the SLO (status)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, model_validator

from gemma_operator.api.common import Model, StatusName, StatusRun, Text, Uri

# ---------------------------------------------------------------------------- spec


# The longest benchmark a spec may ask for: it shares the service with real traffic.
MAX_BENCHMARK_SECONDS = 3600
MAX_BENCHMARK_REQUESTS = 10000


class BenchmarkSLO(Model):
    """What a revision must serve under the benchmark's load. Every bound set must hold; each is
    positive. Latencies are the p99 over the benchmark's requests, in milliseconds."""

    ttft_p99_ms: Annotated[
        float | None, Field(gt=0, le=3600000, description="Time to first token, p99, at most this (ms).")
    ] = None
    tpot_p99_ms: Annotated[
        float | None,
        Field(gt=0, le=600000, description="Time per output token after the first, p99, at most this (ms)."),
    ] = None
    itl_p99_ms: Annotated[
        float | None, Field(gt=0, le=600000, description="Inter-token latency, p99, at most this (ms).")
    ] = None
    min_output_tokens_per_second: Annotated[
        float | None, Field(gt=0, description="Output tokens per second over the benchmark, at least this.")
    ] = None

    @model_validator(mode="after")
    def _some_bound(self) -> BenchmarkSLO:
        if None is self.ttft_p99_ms is self.tpot_p99_ms is self.itl_p99_ms is self.min_output_tokens_per_second:
            raise ValueError("slo: set at least one of ttftP99Ms, tpotP99Ms, itlP99Ms or minOutputTokensPerSecond")
        return self


class Benchmark(Model):
    """A load measured once per revision after it becomes Ready, by `vllm bench serve` from the
    serving image, against the service: random prompts of inputLen tokens (or those of promptsUri),
    each answered with outputLen tokens, at most maxConcurrency in flight (and requestRate per
    second, if set)."""

    input_len: Annotated[int, Field(ge=1, le=262144, description="Prompt tokens per request.")] = 256
    output_len: Annotated[int, Field(ge=1, le=262144, description="Output tokens per request (EOS ignored).")] = 128
    num_prompts: Annotated[
        int, Field(ge=1, le=MAX_BENCHMARK_REQUESTS, description="Requests sent in all (unless durationSeconds).")
    ] = 64
    prompts_uri: Annotated[
        Uri | None,
        Field(
            description="A JSONL of prompts to send instead of random ones, one object with a `prompt` field "
            "per line (an evaluation set in the prompt-completion format): gs:// or a path under "
            "spec.storage.mountPath. inputLen is then the prompts' own; each is answered with outputLen tokens.",
        ),
    ] = None
    max_concurrency: Annotated[
        int, Field(ge=1, le=1024, description="Requests in flight at most: bounds the load real traffic competes with.")
    ] = 4
    request_rate: Annotated[
        float | None, Field(gt=0, description="Requests started per second (Poisson); unset: as fast as allowed.")
    ] = None
    duration_seconds: Annotated[
        int | None,
        Field(
            ge=1,
            le=MAX_BENCHMARK_SECONDS,
            description="With requestRate: send requestRate x durationSeconds requests (instead of numPrompts), "
            "so the load lasts about this long; below timeoutSeconds.",
        ),
    ] = None
    timeout_seconds: Annotated[
        int,
        Field(
            ge=30,
            le=MAX_BENCHMARK_SECONDS,
            description="The benchmark Job's deadline (activeDeadlineSeconds); the operator's "
            "benchmark_max_seconds may set a lower limit.",
        ),
    ] = 600
    slo: Annotated[BenchmarkSLO | None, Field(description="What the revision must serve; unset: only measured.")] = None

    @model_validator(mode="after")
    def _duration(self) -> Benchmark:
        if self.duration_seconds is None:
            return self
        if self.request_rate is None:
            raise ValueError("benchmark.durationSeconds needs benchmark.requestRate: it sets how many requests")
        if self.duration_seconds >= self.timeout_seconds:
            raise ValueError(
                f"benchmark.durationSeconds {self.duration_seconds} must be below timeoutSeconds {self.timeout_seconds}"
            )
        if self.requests > MAX_BENCHMARK_REQUESTS:
            raise ValueError(
                f"benchmark.requestRate x durationSeconds is {self.requests} requests: at most {MAX_BENCHMARK_REQUESTS}"
            )
        return self

    @property
    def requests(self) -> int:
        """The requests sent: numPrompts, or requestRate x durationSeconds."""
        if self.duration_seconds is None or self.request_rate is None:
            return self.num_prompts
        return math.ceil(self.request_rate * self.duration_seconds)

    on_miss: Annotated[
        Literal["rollback", "report"],
        Field(
            description="A missed SLO: report (SLOMet False and a Warning Event), or rollback to the previous "
            "run of the fine-tune (the run is rejected until it or the SLO changes)."
        ),
    ] = "report"


# ---------------------------------------------------------------------------- status


class BenchmarkResult(Model):
    """The figures of one benchmark of one revision, and what serving costs at them."""

    revision: Annotated[Text, Field(description="The revision measured.")]
    key: Annotated[Text, Field(description="Hash of the revision and the load: one benchmark per key.")]
    run: Annotated[StatusRun | None, Field(description="The fine-tune run served at that revision.")] = None
    job: Annotated[StatusName | None, Field(description="The benchmark Job.")] = None
    state: Annotated[Literal["Running", "Succeeded", "Failed"], Field(description="Where the benchmark is.")]
    message: Annotated[Text | None, Field(description="Why it failed, or the SLO verdict.")] = None
    ttft_p50_ms: Annotated[float | None, Field(description="Time to first token, median (ms).")] = None
    ttft_p90_ms: Annotated[float | None, Field(description="Time to first token, p90 (ms).")] = None
    ttft_p99_ms: Annotated[float | None, Field(description="Time to first token, p99 (ms).")] = None
    tpot_p50_ms: Annotated[float | None, Field(description="Time per output token, median (ms).")] = None
    tpot_p99_ms: Annotated[float | None, Field(description="Time per output token, p99 (ms).")] = None
    itl_p50_ms: Annotated[float | None, Field(description="Inter-token latency, median (ms).")] = None
    itl_p99_ms: Annotated[float | None, Field(description="Inter-token latency, p99 (ms).")] = None
    output_tokens_per_second: Annotated[float | None, Field(description="Output tokens per second.")] = None
    requests_per_second: Annotated[float | None, Field(description="Requests completed per second.")] = None
    goodput: Annotated[
        float | None, Field(description="Share of requests within the SLO's ttft and tpot bounds (0-1).")
    ] = None
    completed: Annotated[int | None, Field(description="Requests that completed.")] = None
    errors: Annotated[int | None, Field(description="Requests that failed.")] = None
    duration_seconds: Annotated[float | None, Field(description="Wall time of the benchmark.")] = None
    cost_per_hour: Annotated[
        float | None,
        Field(
            description="Serving cost: replicas x chips, GPUs or vCPUs x the price of one an hour (settings), $/hour."
        ),
    ] = None
    cost_per_million_output_tokens: Annotated[
        float | None, Field(description="costPerHour at the measured output tokens per second, $ per 1M tokens.")
    ] = None
    price_basis: Annotated[
        Text | None,
        Field(description="The rate costPerHour is at, and its source: a setting, or a built-in estimate."),
    ] = None
    slo_met: Annotated[bool | None, Field(description="Whether the figures meet spec.benchmark.slo.")] = None


class RejectedRun(Model):
    """A fine-tune run whose revision missed the benchmark's SLO under onMiss: rollback."""

    run: Annotated[StatusRun, Field(description="The rejected run.")]
    revision: Annotated[Text, Field(description="Its revision that was measured.")]
    slo: Annotated[Text, Field(description="Hash of the SLO it missed: a changed SLO tries the run again.")]
    message: Annotated[Text | None, Field(description="The figures that missed.")] = None
