"""The serving tests run vLLM from its own environment, as production runs it from its own image."""

import os
from pathlib import Path

import pytest

VLLM_PYTHON_ENV = "GEMMA_VLLM_PYTHON"


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The interpreter of the vLLM environment; `make test` always sets it."""
    value = os.environ.get(VLLM_PYTHON_ENV)
    if not value:
        pytest.skip(
            f"vLLM tests need {VLLM_PYTHON_ENV}: run `make test`, or `make vllm-venv` and "
            f"{VLLM_PYTHON_ENV}=$PWD/.venv-vllm/bin/python"
        )
    path = Path(value)
    assert os.access(path, os.X_OK), f"{VLLM_PYTHON_ENV}={value} is not an executable"
    return path
