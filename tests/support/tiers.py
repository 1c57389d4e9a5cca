"""One rule for every test tier whose prerequisites a machine may lack: the real control plane and the
controllers beside it, vLLM's environment, kubectl.

Where one is missing the test is skipped, and the reason says how to get it; where GEMMA_REQUIRE_TIERS is
set (`.ci/run` sets it), the same test fails with the same words instead, so that a run that was meant
to hold the project to every tier cannot pass by skipping one. The variable is the project's own: a
fork's CI (GitHub Actions, GitLab CI and CircleCI all set CI=true) skips what its machines lack and stays
green until it opts in.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

REQUIRE = "GEMMA_REQUIRE_TIERS"
VLLM_PYTHON = "GEMMA_VLLM_PYTHON"


def required() -> bool:
    """Whether a missing prerequisite fails the test rather than skipping it."""
    return os.environ.get(REQUIRE, "").strip().lower() not in ("", "0", "false", "no")


def unavailable(reason: str) -> NoReturn:
    """Skip the test for `reason`, or fail it where every tier is required."""
    if required():
        pytest.fail(f"{reason} ({REQUIRE} is set: every tier must run)", pytrace=False)
    pytest.skip(reason)


def vllm_python() -> Path:
    """The interpreter of the vLLM environment (`make test` sets GEMMA_VLLM_PYTHON)."""
    value = os.environ.get(VLLM_PYTHON)
    if not value:
        unavailable(
            f"the vLLM tests need {VLLM_PYTHON}: run `make test`, or `make vllm-venv` and "
            f"{VLLM_PYTHON}=$PWD/.venv-vllm/bin/python"
        )
    path = Path(value)
    assert os.access(path, os.X_OK), f"{VLLM_PYTHON}={value} is not an executable"
    return path


def kubectl() -> str:
    """kubectl on PATH, which the tests that read a cluster as its users do run."""
    found = shutil.which("kubectl")
    if not found:
        unavailable("kubectl is not on PATH: install kubectl 1.32 or newer")
    return found
