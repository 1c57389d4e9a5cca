"""Run a rendered vLLM container as a local process, the way a kubelet would run it.

The CPU serving tests and benchmarks start exactly the command, args and env that
`children.vllm.vllm_container` renders, so they check the operator's command line, not a copy.
Standard library only: this runs next to the operator, never in its pods.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gemma_devcluster import processes
from gemma_devcluster.processes import (
    ProcessGroup,
    free_port,
    group_alive,
    resolve_env,
)
from gemma_operator.children.vllm import VllmLaunch, vllm_container

__all__ = ["VllmProcess", "free_port", "group_alive", "request", "resolve_env", "start", "start_rendered"]


def request(url: str, body: dict | None = None, api_key: str | None = None, timeout: float = 60) -> tuple[int, dict]:
    """GET (or POST `body` as JSON) and return (status, decoded JSON body), errors included."""
    headers = {"Content-Type": "application/json"}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        payload = err.read()
        try:
            return err.code, json.loads(payload or b"{}")
        except json.JSONDecodeError:
            return err.code, {"raw": payload.decode(errors="replace")}


@dataclass
class VllmProcess(ProcessGroup):
    """A started server: its process group, log and address."""

    base_url: str = ""

    def wait_ready(self, served_name: str, api_key: str | None = None, timeout: float = 300) -> float:
        """Seconds from start until `/v1/models` lists `served_name`.

        `/health` answers before the model can serve, so it is not the signal.
        """
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                status, body = request(f"{self.base_url}/v1/models", api_key=api_key, timeout=5)
            except (OSError, json.JSONDecodeError):
                status, body = 0, {}
            if status == 200 and served_name in [m.get("id") for m in body.get("data", [])]:
                return time.monotonic() - self.started
            time.sleep(0.5)
        raise RuntimeError(f"vLLM not ready after {timeout:.0f} s:\n{self.log_tail()}")


def start(
    command: list[str], args: list[str], env: Mapping[str, str], *, port: int, bin_dir: Path, log_path: Path
) -> VllmProcess:
    """Start the container command; `bin_dir` plays the image (see processes.start)."""
    group = processes.start([*command, *args], env, bin_dir=bin_dir, log_path=log_path)
    return VllmProcess(group.proc, group.log_path, group.started, f"http://127.0.0.1:{port}")


def start_rendered(
    launch: VllmLaunch, *, bin_dir: Path, log_path: Path, secrets: Mapping[tuple[str, str], str] | None = None
) -> VllmProcess:
    """Start exactly the container the operator renders for `launch`, on `launch.port`."""
    command, args, env = vllm_container(launch)
    values = resolve_env(env, secrets or {})
    return start(command, args, values, port=launch.port, bin_dir=bin_dir, log_path=log_path)
