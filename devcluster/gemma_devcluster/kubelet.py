"""A pod of the cpu profile, run on this machine: what a kubelet does, for one container.

The image is a virtual environment (its bin directory first on PATH), mounts are folders with
path translation (volumes.py), the container port is moved to a free host port (pods share this
machine's network), probes are run against it, and the pod's status is written the way the
kubelet writes it: phase, conditions, container state, exit code and termination message.
"""

from __future__ import annotations

import base64
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gemma_devcluster import processes, volumes
from gemma_operator.clock import now, timestamp

TPU_RESOURCE = "google.com/tpu"
TERMINATION_MESSAGE_LIMIT = 4096
HOST_PORT_ANNOTATION = "gemma-tpu.dev/host-port"


class PodStartError(Exception):
    """The pod cannot start here; `reason` is the container waiting reason Kubernetes would show."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class Node:
    """What this machine offers pods: images (image -> bin dir of a venv) and volume claims."""

    workdir: Path
    images: dict[str, Path]
    claims: dict[str, Path]


def unschedulable(pod: dict[str, Any]) -> str | None:
    """Why no node here can take the pod (it asks for TPUs), or None."""
    for c in pod["spec"]["containers"]:
        if TPU_RESOURCE in ((c.get("resources") or {}).get("limits") or {}):
            return f"0/1 nodes are available: 1 Insufficient {TPU_RESOURCE}. (the local node has no TPU)"
    return None


@dataclass
class LocalPod:
    namespace: str
    name: str
    container: dict[str, Any]
    group: processes.ProcessGroup
    mounts: volumes.Mounts
    env: dict[str, str]
    bin_dir: Path
    host_port: int | None
    ready: bool = False
    restarts: int = 0
    started_at: str = field(default_factory=lambda: timestamp(now()))
    finished: dict[str, Any] | None = None  # the terminated state, fixed once the process ends
    restart_at: float | None = None  # a crashed container of a Deployment pod waits until then

    # ------------------------------------------------------------------ start

    @classmethod
    def start(
        cls,
        pod: dict[str, Any],
        node: Node,
        config_maps: dict[str, dict],
        secrets: dict[str, dict],
        routes: dict[str, str] | None = None,
    ) -> LocalPod:
        """Start the pod's container; `routes` (services.routes) is the cluster DNS it sees."""
        meta = pod["metadata"]
        [container] = pod["spec"]["containers"]
        bin_dir = node.images.get(container["image"])
        if bin_dir is None:
            raise PodStartError(
                "ErrImagePull",
                f"image {container['image']!r} is not available on the local node (it has {sorted(node.images)})",
            )
        workdir = node.workdir / "pods" / meta["namespace"] / meta["name"]
        try:
            mounts = volumes.materialize(pod, container, workdir, node.claims, config_maps, secrets)
            env = {
                k: mounts.translate(v)
                for k, v in processes.resolve_env(container.get("env") or [], _secret_values(secrets)).items()
            }
        except (volumes.VolumeError, KeyError) as e:
            raise PodStartError("CreateContainerConfigError", str(e).strip("'\"")) from None
        command = mounts.translate_all([*(container.get("command") or []), *(container.get("args") or [])])
        command = [_route(arg, routes or {}) for arg in command]
        host_port = None
        ports = container.get("ports") or []
        if ports:
            # Pods share this machine's network: the container port moves to a free host port.
            port = ports[0]["containerPort"]
            host_port = processes.free_port()
            command = [_swap_port(arg, port, host_port) for arg in command]
        group = processes.start(command, env, bin_dir=bin_dir, log_path=workdir / "log", cwd=workdir)
        return cls(
            meta["namespace"],
            meta["name"],
            container,
            group,
            mounts,
            env,
            bin_dir,
            host_port,
            ready=not container.get("readinessProbe"),
        )

    # ------------------------------------------------------------------ running

    def exit_code(self) -> int | None:
        code = self.group.poll()
        if code is not None and code < 0:
            return 128 - code  # killed by signal N: 128 + N, as the container runtime reports it
        return code

    def probe(self, kind: str) -> bool | None:
        """Run the container's `kind` probe once: True/False, or None when it has none."""
        spec = self.container.get(kind)
        if not spec:
            return None
        if "httpGet" in spec:
            url = f"http://127.0.0.1:{self.host_port}{spec['httpGet'].get('path', '/')}"
            try:
                with urllib.request.urlopen(url, timeout=spec.get("timeoutSeconds", 1)) as resp:
                    return 200 <= resp.status < 400
            except (urllib.error.URLError, OSError, ValueError):
                return False
        if "exec" in spec:
            command = self.mounts.translate_all(spec["exec"]["command"])
            env = {**self.env, "PATH": f"{self.bin_dir}:/usr/bin:/bin"}
            try:
                return (
                    subprocess.run(
                        command, env=env, capture_output=True, timeout=spec.get("timeoutSeconds", 1)
                    ).returncode
                    == 0
                )
            except subprocess.TimeoutExpired:
                return False
        return None

    def stop(self, grace: float) -> None:
        self.group.stop(timeout=grace)

    # ------------------------------------------------------------------ status

    def termination_message(self, code: int) -> str:
        path = self.mounts.paths.get(self.container.get("terminationMessagePath") or volumes.TERMINATION_LOG)
        text = path.read_text(errors="replace") if path and path.exists() else ""
        if not text.strip() and code != 0 and self.container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            text = "\n".join(self.group.log_tail(80).splitlines())[-2048:]
        return self.mounts.untranslate(text)[:TERMINATION_MESSAGE_LIMIT]

    def status(self) -> dict[str, Any]:
        code = self.exit_code()
        name = self.container["name"]
        if code is None:
            state = {"running": {"startedAt": self.started_at}}
            phase = "Running"
        else:
            if self.finished is None:
                reason = "Completed" if code == 0 else ("Error" if code < 128 else "Killed")
                self.finished = {
                    "exitCode": code,
                    "reason": reason,
                    "message": self.termination_message(code),
                    "startedAt": self.started_at,
                    "finishedAt": timestamp(now()),
                }
            state = {"terminated": self.finished}
            phase = "Succeeded" if code == 0 else "Failed"
        ready = code is None and self.ready
        last: dict[str, Any] = {}
        if self.restart_at is not None:  # crashed, waiting to run again in place
            phase = "Running"
            last = {"lastState": {"terminated": self.finished}}
            state = {
                "waiting": {"reason": "CrashLoopBackOff", "message": f"back-off restarting failed container {name}"}
            }
        return {
            "phase": phase,
            "podIP": "127.0.0.1",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": str(ready)},
                {"type": "ContainersReady", "status": str(ready)},
            ],
            "containerStatuses": [
                {
                    "name": name,
                    "ready": ready,
                    "restartCount": self.restarts,
                    "state": state,
                    "image": self.container["image"],
                    **last,
                }
            ],
        }


def _route(arg: str, routes: dict[str, str]) -> str:
    """An argument with every Service address the cluster DNS knows replaced (longest first)."""
    for address in sorted(routes, key=len, reverse=True):
        arg = arg.replace(address, routes[address])
    return arg


def _swap_port(arg: str, port: int, host_port: int) -> str:
    return f"--port={host_port}" if arg == f"--port={port}" else arg


def _secret_values(secrets: dict[str, dict]) -> dict[tuple[str, str], str]:
    return {
        (name, key): base64.b64decode(value).decode()
        for name, s in secrets.items()
        for key, value in (s.get("data") or {}).items()
    }


def waiting_status(container: str, reason: str, message: str, scheduled: bool = True) -> dict[str, Any]:
    """A pod that cannot run: Pending, with the reason Kubernetes would give."""
    conditions = [
        {
            "type": "PodScheduled",
            "status": "True" if scheduled else "False",
            **({} if scheduled else {"reason": "Unschedulable", "message": message}),
        }
    ]
    return {
        "phase": "Pending",
        "conditions": conditions,
        "containerStatuses": [
            {
                "name": container,
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}},
            }
        ]
        if scheduled
        else [],
    }


def log_text(pod: LocalPod, lines: int = 500) -> str:
    text = pod.mounts.untranslate(pod.group.log_tail(lines))
    return text + "\n" if text else ""
