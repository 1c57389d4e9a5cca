"""Ctrl-C stops `gemma-tpu dev` cleanly at any time: here while the training pod runs."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GEMMA_TPU = Path(sys.executable).parent / "gemma-tpu"

pytestmark = pytest.mark.slow


def _processes_under(folder: Path) -> list[str]:
    """Command lines of live processes that run in, or name, `folder` (the pods' processes)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if str(folder) in cmdline or cwd.startswith(str(folder)):
            found.append(cmdline)
    return found


def _wait_for_line(proc: subprocess.Popen, pattern: str, seconds: float) -> tuple[re.Match, str]:
    seen, deadline = "", time.monotonic() + seconds
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen += line
        if m := re.search(pattern, line):
            return m, seen
    raise AssertionError(f"no line matching {pattern!r} within {seconds} s; output:\n{seen}")


def test_ctrl_c_while_training_stops_every_process_and_frees_the_port(tmp_path):
    workdir, examples = tmp_path / "demo", tmp_path / "examples"
    examples.mkdir()
    shutil.copy(ROOT / "examples" / "quickstart" / "finetune.yaml", examples)  # no vLLM needed before Ctrl-C
    proc = subprocess.Popen(
        [
            str(GEMMA_TPU),
            "dev",
            "--workdir",
            str(workdir),
            "--vllm-python",
            sys.executable,
            "--timeout",
            "300",
            "--examples",
            str(examples),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        m, _ = _wait_for_line(proc, r"local cluster at http://127\.0\.0\.1:(\d+)", 120)
        port = int(m.group(1))
        _wait_for_line(proc, r"gemmafinetune/tiny-capitals\s+Training", 120)
        assert _processes_under(workdir / "node"), "the training pod runs as a process"

        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr[-2000:]
    assert "stopped" in stderr and "Traceback" not in stderr, stderr[-2000:]
    assert not _processes_under(workdir / "node"), "no pod process outlives the command"
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))  # the API server's port is free again
