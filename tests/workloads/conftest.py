"""Shared fixtures: tiny Gemma 4 checkpoints made once per session."""

import numpy as np
import pytest

from gemma_workloads import tiny


@pytest.fixture(scope="session")
def tiny_sharded(tmp_path_factory) -> tiny.TinyCheckpoint:
    """Text-only layout (`model.` keys), tensors interleaved over 3 shards."""
    return tiny.write_checkpoint(tmp_path_factory.mktemp("tiny-sharded"), shards=3)


@pytest.fixture(scope="session")
def tiny_single(tmp_path_factory) -> tiny.TinyCheckpoint:
    """Released-checkpoint key layout (`model.language_model.`), one model.safetensors."""
    return tiny.write_checkpoint(
        tmp_path_factory.mktemp("tiny-single"), shards=1, prefix="model.language_model.", seed=1
    )


@pytest.fixture(scope="session")
def token_ids() -> np.ndarray:
    """A batch twice the sliding window (16), so both attention kinds are exercised."""
    rng = np.random.default_rng(0)
    return rng.integers(6, 370, size=(2, 32)).astype(np.int32)


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
    """One persistent JAX compilation cache for the session, shared with the training
    subprocesses: each distinct program compiles once (tens of seconds on two cores)."""
    import jax

    settings = {
        "jax_compilation_cache_dir": str(tmp_path_factory.mktemp("jax-cache")),
        "jax_persistent_cache_min_compile_time_secs": 0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }
    with pytest.MonkeyPatch.context() as env:
        for name, value in settings.items():
            jax.config.update(name, value)
            env.setenv(name.upper(), str(value))
        yield settings
