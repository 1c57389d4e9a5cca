"""The local runner plays the kubelet: env from Secrets, PATH from the image, the group stopped whole."""

import sys
import time
from pathlib import Path

import pytest

from gemma_devcluster import local_vllm

BIN_DIR = Path(sys.executable).parent


def test_env_values_and_secret_refs_are_resolved():
    env = [{"name": "A", "value": "1"}, {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    assert local_vllm.resolve_env(env, {("s", "k"): "v"}) == {"A": "1", "KEY": "v"}
    with pytest.raises(KeyError, match="no key 'k' in secret 's'"):
        local_vllm.resolve_env(env, {})


def test_a_server_that_dies_reports_its_log_and_saw_only_its_env(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_STRAY", "from the caller")
    script = "import os, sys; print('boom', os.environ['FLAG'], os.environ.get('VLLM_STRAY')); sys.exit(3)"
    proc = local_vllm.start(
        ["python3", "-c", script],
        [],
        {"FLAG": "on"},
        port=local_vllm.free_port(),
        bin_dir=BIN_DIR,
        log_path=tmp_path / "log",
    )
    with pytest.raises(RuntimeError, match=r"exited with 3:\nboom on None"):
        proc.wait_ready("m", timeout=30)


def test_stop_ends_the_whole_process_group(tmp_path):
    # The leader ignores SIGTERM and its child outlives it, like a stuck engine worker.
    script = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); print('up', flush=True); "
        "time.sleep(600)"
    )
    proc = local_vllm.start(
        ["python3", "-c", script], [], {}, port=local_vllm.free_port(), bin_dir=BIN_DIR, log_path=tmp_path / "log"
    )
    while "up" not in proc.log_tail():
        assert proc.proc.poll() is None, proc.log_tail()
        time.sleep(0.05)
    proc.stop(timeout=2)
    assert not local_vllm.group_alive(proc.proc.pid)
    assert proc.proc.returncode == -9
