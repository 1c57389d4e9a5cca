"""Container commands run as local processes, the way a kubelet runs them.

Each process gets its own session (so the whole group can be signalled, as a container's
processes are), only the environment it was given plus a home and a temporary directory, and an
"image": a virtual environment whose bin directory comes first on PATH, so the rendered `python`
is that environment's. Standard library only.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_INHERITED_ENV = ("HOME", "TMPDIR")


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


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


def group_alive(pgid: int) -> bool:
    """Whether any process is left in the group (zombies of other parents included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class ProcessGroup:
    """A started container process: its group, its log, when it started."""

    proc: subprocess.Popen
    log_path: Path
    started: float

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM the whole group, SIGKILL what is left after `timeout`, wait until it is gone."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and group_alive(self.proc.pid):
                self.proc.poll()  # reap the leader, so that it does not linger as a zombie
                time.sleep(0.1)
            if not group_alive(self.proc.pid):
                break
        self.proc.wait(timeout=5)


def start(
    command: list[str], env: Mapping[str, str], *, bin_dir: Path, log_path: Path, cwd: Path | None = None
) -> ProcessGroup:
    """Start `command` in its own session with `bin_dir` first on PATH and only `env` (+ home, tmp)."""
    inherited = {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}
    full_env = {**inherited, **env, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"}
    started = time.monotonic()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd
        )
    return ProcessGroup(proc, log_path, started)
