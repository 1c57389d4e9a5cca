"""JAX's persistent compilation cache, for the pods that compile: training (with its evaluation)
and the merge.

A training pod spends much of its start compiling (the 31B step takes minutes) and a Spot pod
starts again after every preemption. With `compilation_cache_dir` set (TrainConfig, MergeConfig:
a local path or gs://), each program that took at least `MIN_COMPILE_SECONDS` to compile is
written there, and a later process that compiles the same program reads it instead: a restarted
attempt, a resumed run, the next run of the same shapes and recipe.

What finds an entry is JAX's cache key (jax/_src/cache_key.py, `get`, the same in JAX 0.10 and
0.11), a hash of: the program as StableHLO without source locations (every shape, dtype, sharding
and constant, so the sequence length, micro-batch, LoRA rank, remat policy and attention path, and
also the learning-rate schedule's figures and the dropout rate, which the step holds as
constants), the jaxlib version, the platform and its version (libtpu's on a TPU, CUDA's on a GPU),
XLA_FLAGS and LIBTPU_INIT_ARGS, the compile options, and the devices' kind and topology. A change
to any of them compiles anew; the entries it no longer matches stay on disk, unused.

An entry that cannot be read (truncated, not what JAX wrote) costs a compile, never the run: JAX
warns and compiles (jax/_src/compiler.py, `_cache_read`) while `jax_raise_persistent_cache_errors`
is off, its default. JAX never writes over an existing entry (jax/_src/lru_cache.py, `put`), so
such a file costs that compile on every run until it is deleted.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass

import jax
from etils import epath
from jax.experimental.compilation_cache import compilation_cache as jax_cache

log = logging.getLogger("gemma_workloads.compilation_cache")

# Programs compiled faster than this are not written (JAX's default threshold, kept deliberately).
# On the tiny model on CPU the step and the LoRA set-up took 17.9 of 19.1 s of compiling; the other
# 57 programs took 1.1 s together: caching them too saved about 0.6 s and wrote 57 more files, each
# a request of its own on gs://.
MIN_COMPILE_SECONDS = 1.0

# jax.monitoring events (jax/_src/compiler.py, compilation_cache.py; JAX 0.10 and 0.11)
_REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
_HITS = "/jax/compilation_cache/cache_hits"
_SAVED = "/jax/compilation_cache/compile_time_saved_sec"


@dataclass
class CacheUse:
    """What one process did with the cache."""

    directory: str
    entries_before: int = 0
    looked_up: int = 0  # programs compiled or read while the cache was on
    read: int = 0  # of which found in it
    seconds_saved: float = 0.0  # the read programs' compile times, less the reads
    written: int = 0  # entries new in the directory at the end

    def on_event(self, event: str, **_) -> None:
        if event == _REQUESTS:
            self.looked_up += 1
        elif event == _HITS:
            self.read += 1

    def on_duration(self, event: str, duration_secs: float, **_) -> None:
        if event == _SAVED:
            self.seconds_saved += duration_secs

    def summary(self) -> str:
        return (
            f"compilation cache {self.directory}: {self.read} of {self.looked_up} programs read "
            f"({self.seconds_saved:.1f} s of compiling saved), {self.written} entries written "
            f"({self.entries_before + self.written} in all; programs compiled in under {MIN_COMPILE_SECONDS:g} s "
            "are not cached)"
        )

    @classmethod
    def from_log(cls, log_text: str) -> CacheUse | None:
        """The last summary in a pod's log, read back."""
        found = _SUMMARY.findall(log_text)
        if not found:
            return None
        directory, read, looked_up, saved, written, total = found[-1]
        return cls(directory, int(total) - int(written), int(looked_up), int(read), float(saved), int(written))


_SUMMARY = re.compile(
    r"compilation cache (\S+): (\d+) of (\d+) programs read \(([\d.]+) s of compiling saved\), "
    r"(\d+) entries written \((\d+) in all"
)


_SETTINGS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
_active: CacheUse | None = None


@contextlib.contextmanager
def persistent(directory: str | None) -> Iterator[CacheUse | None]:
    """Compile through the cache in `directory` (None: leave JAX's settings as they are), and log
    what was read and written at the end. The settings before are restored on the way out, so a
    process that runs several workloads gives each its own cache."""
    global _active
    if not directory:
        yield None
        return
    before = {name: getattr(jax.config, name) for name in _SETTINGS}
    use = _active = CacheUse(directory, entries_before=len(entries(directory)))
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    jax_cache.reset_cache()  # JAX opens its cache once per process: a directory set earlier would stay
    _listen(use, on=True)
    try:
        yield use
    finally:
        _listen(use, on=False)
        _active = None
        for name, value in before.items():
            jax.config.update(name, value)
        jax_cache.reset_cache()
        use.written = len(entries(directory)) - use.entries_before
        log.info("%s", use.summary())


def entries(directory: str) -> list[str]:
    """The names of the cache's entries (JAX writes `<key>-cache` files; jax/_src/lru_cache.py)."""
    path = epath.Path(directory)
    return sorted(p.name for p in path.glob("*-cache")) if path.exists() else []


def listen_again() -> None:
    """Count again: Tunix's trainer clears every jax.monitoring listener of the process when it
    closes (tunix/sft/metrics_logger.py, `MetricsLogger.close`), and evaluation compiles after it."""
    if _active is not None:
        _listen(_active, on=True)


def _listen(use: CacheUse, *, on: bool) -> None:
    """(Re)register or remove the listeners of `use`, whether or not someone cleared them."""
    with contextlib.suppress(AssertionError, ValueError):  # JAX asserts that a listener it removes is there
        jax.monitoring.unregister_event_listener(use.on_event)
    with contextlib.suppress(AssertionError, ValueError):
        jax.monitoring.unregister_event_duration_listener(use.on_duration)
    if on:
        jax.monitoring.register_event_listener(use.on_event)
        jax.monitoring.register_event_duration_secs_listener(use.on_duration)
