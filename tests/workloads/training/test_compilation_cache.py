"""JAX's persistent compilation cache through the training CLI: a second run of the same config
reads the programs the first one compiled, and entries that cannot be read cost a compile, not
the run (gemma_workloads.compilation_cache)."""

from pathlib import Path

import pytest

from gemma_workloads.compilation_cache import CacheUse, entries
from gemma_workloads.config import EXIT_OK
from tests.workloads.training.test_train import Ended, make_config, run_cli

# JAX logs each read at WARNING with jax_log_compiles (jax/_src/compiler.py, log_persistent_cache_hit).
LOG_COMPILES = {"JAX_LOG_COMPILES": "1"}


def cache_use(ended: Ended) -> CacheUse:
    """What the run did with the cache, from its summary line."""
    use = CacheUse.from_log(ended.stderr)
    assert use is not None, ended.stderr[-2000:]
    return use


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, tiny_sharded):
    """The same config run twice through the CLI with one cache directory, a fresh one."""
    tmp = tmp_path_factory.mktemp("cached")
    cache = tmp / "jax-cache"
    config = make_config(tmp, str(tiny_sharded.path), steps=2, warmup_steps=0, compilation_cache_dir=str(cache))
    config = config.model_copy(update={"dataset": config.dataset.model_copy(update={"eval_fraction": 0.0})})
    first = run_cli(config, tmp, "first", env=LOG_COMPILES)
    written = entries(str(cache))
    second = run_cli(config.model_copy(update={"output_dir": str(tmp / "again")}), tmp, "second", env=LOG_COMPILES)
    return config, first, written, second


@pytest.mark.slow
def test_the_second_run_reads_the_programs_the_first_compiled(two_runs):
    config, first, written, second = two_runs
    assert first.code == second.code == EXIT_OK, second.stderr
    assert any(name.startswith("jit_train_step-") for name in written), written
    cold, warm = cache_use(first), cache_use(second)
    assert (cold.read, cold.written) == (0, len(written)), "a fresh cache: nothing to read"
    assert (warm.read, warm.written) == (len(written), 0), "every entry of the first run read back, none written again"
    assert "Persistent compilation cache hit for 'jit_train_step'" in second.stderr
    assert [p.loss for p in second.progress] == [p.loss for p in first.progress], "the same program, the same steps"


@pytest.mark.slow
def test_entries_that_cannot_be_read_cost_a_compile_not_the_run(two_runs, tmp_path):
    """Truncated and garbage entries (a write cut short, a disk error), in place: with JAX 0.10.2
    the cache's path is part of every key (JAX hashes the compile options, which name the GPU
    autotuning cache inside it: jax/_src/compiler.py, `get_compile_options`), so a copy elsewhere
    would simply miss. JAX warns and compiles (jax/_src/compiler.py, `_cache_read`); the steps are
    those of the intact cache."""
    config, first, written, _ = two_runs
    for name in written:
        entry = Path(config.compilation_cache_dir) / name
        data = entry.read_bytes()
        entry.write_bytes(data[: len(data) // 2] if name.startswith("jit_train_step-") else b"not an executable" * 100)
    ended = run_cli(config.model_copy(update={"output_dir": str(tmp_path / "out")}), tmp_path, "broken")
    assert ended.code == EXIT_OK, ended.stderr
    assert "Error reading persistent compilation cache entry for 'jit_train_step'" in ended.stderr
    assert cache_use(ended).read == 0, "nothing read: every entry was compiled again"
    assert entries(config.compilation_cache_dir) == written, "JAX never writes over an entry, a broken one included"
    assert [p.loss for p in ended.progress] == [p.loss for p in first.progress]
