"""The operator as its own process, `gemma-tpu operator`, as it runs in its pod: it reads KUBECONFIG
(a ServiceAccount token, install.py) and its settings file, and says it is up on its liveness endpoint.
Its log goes to a file beside the demo's other files."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from gemma_devcluster import processes
from gemma_operator.settings import OperatorSettings

STOP_SECONDS = 10  # SIGTERM, then SIGKILL: kopf stops its watches and exits in about a second
# What the operator's process inherits: where Python finds the project (a checkout run without
# installing it), and no more than processes.start gives every process.
PASSED_ON = ("PYTHONPATH",)


class OperatorFailed(RuntimeError):
    """The operator exited or did not come up; the message ends with its last log lines."""


@dataclass
class OperatorProcess:
    group: processes.ProcessGroup
    log_path: Path

    def stop(self) -> None:
        self.group.stop(timeout=STOP_SECONDS)


def _live(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


async def start(
    kubeconfig: Path, settings: OperatorSettings, folder: Path, timeout: float = 90, namespaces: Sequence[str] = ()
) -> OperatorProcess:
    """Start the operator against the server of `kubeconfig`, watching `namespaces` (every one when
    none), and return once it is live."""
    folder.mkdir(parents=True, exist_ok=True)
    settings_file = folder / "operator-settings.yaml"
    settings_file.write_text(yaml.safe_dump(settings.model_dump(mode="json", exclude_defaults=True)))
    liveness = f"http://127.0.0.1:{processes.free_port()}/healthz"
    command = [sys.executable, "-m", "gemma_operator.cli", "operator", "--settings", str(settings_file)]
    command += ["--liveness", liveness, "--metrics-port", "0", *(f"--namespace={ns}" for ns in namespaces)]
    env = {k: os.environ[k] for k in PASSED_ON if k in os.environ} | {"KUBECONFIG": str(kubeconfig)}
    log_path = folder / "operator.log"
    group = processes.start(command, env, bin_dir=Path(sys.executable).parent, log_path=log_path, cwd=folder)
    running = OperatorProcess(group, log_path)
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(_live, liveness):
        if group.poll() is not None or time.monotonic() > deadline:
            running.stop()
            what = f"exited with {group.poll()}" if group.poll() is not None else f"not live after {timeout:.0f} s"
            raise OperatorFailed(f"the operator {what}; its log ({log_path}) ends:\n{group.log_tail(30)}")
        await asyncio.sleep(0.2)
    return running
