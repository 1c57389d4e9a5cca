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
