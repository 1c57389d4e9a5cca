"""Run a rendered vLLM container as a local process, the way a kubelet would run it.

The CPU serving tests and benchmarks start exactly the command, args and env that
`children.vllm.vllm_container` renders, so they check the operator's command line, not a copy.
Standard library only: this runs next to the operator, never in its pods.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gemma_operator.children.vllm import VllmLaunch, vllm_container

_INHERITED_ENV = ("HOME", "TMPDIR")


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def resolve_env(env: list[dict], secrets: Mapping[tuple[str, str], str]) -> dict[str, str]:
    """Container env entries to values, reading `secretKeyRef`s from (secret, key) -> value."""
    values = {}
    for entry in env:
        if "value" in entry:
            values[entry["name"]] = entry["value"]
            continue
        ref = entry["valueFrom"]["secretKeyRef"]
        if (ref["name"], ref["key"]) not in secrets:
            raise KeyError(f"env {entry['name']}: no key {ref['key']!r} in secret {ref['name']!r}")
        values[entry["name"]] = secrets[ref["name"], ref["key"]]
    return values


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
class VllmProcess:
    """A started server: its process group, address and log."""

    proc: subprocess.Popen
    base_url: str
    log_path: Path
    started: float

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

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

    def stop(self, timeout: float = 30) -> None:
        """Stop the whole process group (vLLM forks engine workers), then wait until it is gone."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and group_alive(self.proc.pid):
                self.proc.poll()  # reap the leader, so that it does not linger as a zombie
                time.sleep(0.2)
            if not group_alive(self.proc.pid):
                break
        self.proc.wait(timeout=5)


def group_alive(pgid: int) -> bool:
    """Whether any process is left in the group (zombies of other parents included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def start(
    command: list[str],
    args: list[str],
    env: Mapping[str, str],
    *,
    port: int,
    bin_dir: Path,
    log_path: Path,
) -> VllmProcess:
    """Start the container command in its own session, with `bin_dir` (a venv's) first on PATH.

    `bin_dir` plays the image: the rendered `python3` is whichever comes first on PATH. Like a
    container, the process sees only `env` plus a home and a temporary directory: nothing of the
    caller's environment (a stray VLLM_* variable, say) changes what is tested.
    """
    inherited = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
    full_env = {**inherited, **env, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"}
    started = time.monotonic()
    log = log_path.open("wb")
    try:
        proc = subprocess.Popen(
            [*command, *args], env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    finally:
        log.close()
    return VllmProcess(proc, f"http://127.0.0.1:{port}", log_path, started)


def start_rendered(
    launch: VllmLaunch, *, bin_dir: Path, log_path: Path, secrets: Mapping[tuple[str, str], str] | None = None
) -> VllmProcess:
    """Start exactly the container the operator renders for `launch`, on `launch.port`."""
    command, args, env = vllm_container(launch)
    values = resolve_env(env, secrets or {})
    return start(command, args, values, port=launch.port, bin_dir=bin_dir, log_path=log_path)
