"""The operator as the chart deploys it, on the real control plane: the chart's ServiceAccount, roles and
settings applied, and `gemma-tpu operator` in its own process with a token the API server issued to that
ServiceAccount (never the admin's)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gemma_devcluster.processes import free_port
from tests.support.chart import objects, one
from tests.support.cluster import PATIENCE
from tests.support.process import chart_command, http_status, running
from tests.support.real_cluster import RealCluster

NOT_APPLIED = {"Deployment", "ServiceMonitor", "CustomResourceDefinition"}  # the test runs the process itself


@dataclass
class Operator:
    user: str  # how the API server's audit log names it
    log: Path
    health_port: int


def install_chart(plane, namespace: str, values: dict) -> tuple[dict, str]:
    """Apply the chart's objects for a release in `namespace` (workloads there too); (values, its ServiceAccount)."""
    values = {
        "workloads": {"namespaces": [namespace]},
        "metrics": {"port": free_port()},
        "healthPort": free_port(),
    } | values
    rendered = objects(values, namespace)
    plane.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "-",
        stdin=yaml.safe_dump_all([o for o in rendered if o["kind"] not in NOT_APPLIED]),
    )
    account = one(rendered, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    # The server's authorizer learns new bindings from its watch a moment later; an operator pod starts long
    # after its roles exist, so the process waits for what it will be allowed to do (never a first 403).
    user = f"system:serviceaccount:{namespace}:{account}"
    checks = [("watch", "gemmafinetunes.gemma-tpu.dev", None), ("create", "jobs.batch", namespace)]
    if values.get("replicas", 1) > 1:
        checks.append(("get", "leases.coordination.k8s.io/gemma-tpu-operator-leader", namespace))
    deadline = time.monotonic() + PATIENCE
    for verb, resource, ns in checks:
        args = ["auth", "can-i", verb, resource, "--as", user, *(["-n", ns] if ns else ["-A"])]
        while plane.kubectl(*args, check=False).stdout.strip() != "yes":
            assert time.monotonic() < deadline, f"{user} may still not {verb} {resource}"
            time.sleep(0.1)
    return values, account


@contextlib.contextmanager
def operator_process(plane, namespace: str, workdir: Path, values: dict, **env: str) -> Iterator[Operator]:
    values, account = install_chart(plane, namespace, values)
    workdir.mkdir(parents=True, exist_ok=True)
    config = plane.service_account_kubeconfig(namespace, account, workdir / "kubeconfig")
    log = workdir / "operator.log"
    with running(chart_command(values, workdir, namespace), config, log, **env):
        yield Operator(f"system:serviceaccount:{namespace}:{account}", log, values["healthPort"])


@pytest.fixture
def operator(control_plane, namespace, tmp_path) -> Iterator[Operator]:
    """One operator replica, cluster-wide as the chart's defaults have it, ready (its /healthz answers)."""
    with operator_process(control_plane, namespace, tmp_path / "operator", {}) as op:
        deadline = time.monotonic() + PATIENCE
        while http_status(f"http://127.0.0.1:{op.health_port}/healthz") != 200:
            assert time.monotonic() < deadline, f"the operator's /healthz never answered:\n{op.log.read_text()[-3000:]}"
            time.sleep(0.1)
        yield op


@pytest.fixture
def cluster(control_plane, namespace) -> Iterator[RealCluster]:
    with control_plane.client() as client:
        yield RealCluster(client, namespace)
