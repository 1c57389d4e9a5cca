"""`gemma-tpu operator` as the chart runs it: its own process, the chart's arguments and settings,
against the in-process API server through a kubeconfig."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support.chart import NAMESPACE, objects, one
from tests.support.cluster import PATIENCE

ENTRYPOINT = Path(sys.executable).parent / "gemma-tpu"  # the operator image's ENTRYPOINT


def chart_command(values: dict, workdir: Path, namespace: str = NAMESPACE) -> list[str]:
    """The operator container's command line, its settings ConfigMap written where it is mounted."""
    objs = objects(values, namespace)
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    volume = next(v for v in pod["volumes"] if "configMap" in v)
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])["mountPath"]
    settings = one(objs, "ConfigMap", volume["configMap"]["name"])
    local = workdir / "settings"
    local.mkdir(exist_ok=True)
    for key, text in settings["data"].items():
        (local / key).write_text(text)
    return [str(ENTRYPOINT), *(arg.replace(mount, str(local)) for arg in container["args"])]


@contextlib.contextmanager
def running(command: list[str], config: Path, log: Path, **env: str) -> Iterator[subprocess.Popen]:
    """The process, stopped with SIGTERM (as the kubelet does) if the test has not stopped it."""
    with log.open("w") as out:
        proc = subprocess.Popen(command, env={**os.environ, "KUBECONFIG": str(config), **env}, stdout=out, stderr=out)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def stop(proc: subprocess.Popen, log: Path) -> int:
    proc.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(proc.wait, PATIENCE)
    assert code == 0, f"the operator exited with {code}:\n{log.read_text()[-3000:]}"
    return code


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """Every sample of the metrics endpoint: {(name, labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def until(check, timeout: float = PATIENCE, message: str = "", log: Path | None = None):
    """Poll a blocking check in a thread until it returns something truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        value = await asyncio.to_thread(check)
        if value:
            return value
        await asyncio.sleep(0.1)
    tail = log.read_text()[-3000:] if log and log.exists() else ""
    raise AssertionError(f"timed out waiting for {message}\n{tail}")
