"""A pod of the cpu profile, run on this machine: what a kubelet does, for one container.

The image is a virtual environment (its bin directory first on PATH), mounts are folders with
path translation (volumes.py), the container port is moved to a free host port (pods share this
machine's network), probes are run against it, and the pod's status is written the way the
kubelet writes it (pkg/kubelet/status, pkg/kubelet/kubelet_pods.go): phase, the pod's addresses and
start time, its conditions with their transition times, and the container's state, exit code and
termination message.
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
from gemma_devcluster.node_status import ADDRESS
from gemma_operator.clock import now, timestamp

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
    uid: str = ""
    grace: float = 30.0  # the pod's terminationGracePeriodSeconds
    ready: bool = False
    restarts: int = 0
    started_at: str = field(default_factory=lambda: timestamp(now()))  # this run of the container
    pod_started_at: str = ""  # the pod's status.startTime: its first run, kept across restarts
    finished: dict[str, Any] | None = None  # the terminated state, fixed once the process ends
    restart_at: float | None = None  # a crashed container of a Deployment pod waits until then
    since: dict[str, tuple[str, str]] = field(default_factory=dict)  # condition -> (status, since when)

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
        local = cls(
            meta["namespace"],
            meta["name"],
            container,
            group,
            mounts,
            env,
            bin_dir,
            host_port,
            uid=meta.get("uid", ""),
            grace=float(pod["spec"].get("terminationGracePeriodSeconds", 30)),
            ready=not container.get("readinessProbe"),
        )
        local.pod_started_at = local.started_at
        return local

    def restarted(
        self, pod: dict[str, Any], node: Node, config_maps: dict[str, dict], secrets: dict[str, dict]
    ) -> LocalPod:
        """The container started again in place (restartPolicy Always), the pod's history kept."""
        again = LocalPod.start(pod, node, config_maps, secrets)
        again.restarts, again.pod_started_at, again.since = self.restarts + 1, self.pod_started_at, self.since
        return again

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
            state: dict[str, Any] = {"running": {"startedAt": self.started_at}}
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
                    "containerID": self.container_id,
                }
            state = {"terminated": self.finished}
            phase = "Succeeded" if code == 0 else "Failed"
        ready = code is None and self.ready
        last: dict[str, Any] = {}
        if self.restart_at is not None:  # crashed, waiting to run again in place
            phase = "Running"
            last = {"terminated": self.finished}
            state = {
                "waiting": {"reason": "CrashLoopBackOff", "message": f"back-off restarting failed container {name}"}
            }
        terminal = phase in ("Succeeded", "Failed")
        unready = (
            ("PodCompleted", "") if terminal else ("ContainersNotReady", f"containers with unready status: [{name}]")
        )
        return {
            "phase": phase,
            **addresses(self.pod_started_at),
            "conditions": [
                self._condition("PodReadyToStartContainers", True),
                self._condition("Initialized", True),
                self._condition("Ready", ready, *unready),
                self._condition("ContainersReady", ready, *unready),
            ],
            "containerStatuses": [
                {
                    "name": name,
                    "ready": ready,
                    "started": code is None,
                    "restartCount": self.restarts,
                    "state": state,
                    "lastState": last,
                    "image": self.container["image"],
                    "imageID": "",
                    "containerID": self.container_id,
                }
            ],
        }

    @property
    def container_id(self) -> str:
        return f"local://{self.group.proc.pid}"

    def _condition(self, kind: str, true: bool, reason: str = "", message: str = "") -> dict[str, Any]:
        """A pod condition, its lastTransitionTime the moment its status last changed."""
        status = str(true)
        if self.since.get(kind, ("",))[0] != status:
            self.since[kind] = (status, timestamp(now()))
        out = {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": self.since[kind][1]}
        return out | ({"reason": reason, "message": message} if not true and reason else {})


def addresses(started: str) -> dict[str, Any]:
    """Where the pod is: this machine, its processes on the host's network."""
    ips = [{"ip": ADDRESS}]
    return {"hostIP": ADDRESS, "hostIPs": ips, "podIP": ADDRESS, "podIPs": ips, "startTime": started}


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


def waiting_status(container: dict[str, Any], reason: str, message: str) -> dict[str, Any]:
    """A pod whose container cannot start (ErrImagePull, CreateContainerConfigError): Pending, with the
    reason the kubelet gives."""
    t, name = timestamp(now()), container["name"]
    unready = {"reason": "ContainersNotReady", "message": f"containers with unready status: [{name}]"}
    return {
        "phase": "Pending",
        **addresses(t),
        "conditions": [
            {"type": "PodReadyToStartContainers", "status": "True", "lastProbeTime": None, "lastTransitionTime": t},
            {"type": "Initialized", "status": "True", "lastProbeTime": None, "lastTransitionTime": t},
            {"type": "Ready", "status": "False", "lastProbeTime": None, "lastTransitionTime": t, **unready},
            {"type": "ContainersReady", "status": "False", "lastProbeTime": None, "lastTransitionTime": t, **unready},
        ],
        "containerStatuses": [
            {
                "name": name,
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}},
                "lastState": {},
                "image": container["image"],
                "imageID": "",
            }
        ],
    }


def log_text(pod: LocalPod, lines: int = 500) -> str:
    text = pod.mounts.untranslate(pod.group.log_tail(lines))
    return text + "\n" if text else ""
