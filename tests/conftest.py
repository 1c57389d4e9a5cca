"""Fixtures shared by every test package: the in-process API (fast) and a real control plane."""

import os
import uuid
from pathlib import Path

import kmock
import pytest
import pytest_asyncio

from gemma_devcluster import control_plane as real
from gemma_devcluster.apiserver import ApiServer
from tests.support import tiers
from tests.support.cluster import Cluster

CRDS = Path(__file__).resolve().parents[1] / "manifests" / "crds"
# XLA's CPU backend with LLVM at -O0 and without its expensive passes (the second is what the training
# pods run with, settings.training_env): the tests' tiny programs compile in about half the CPU time and
# run a little slower, a trade every test that compiles wins. Set before any test process starts JAX;
# the subprocesses inherit it, and the tests that set their own XLA_FLAGS add to it.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):  # pytest-xdist's workers inherit it
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()
MARK = "control_plane"  # every test that talks to the real API server carries it (pytest_collection_modifyitems)


@pytest_asyncio.fixture
async def apiserver():
    """The in-process Kubernetes API over real HTTP, with the built-in kinds and our CRDs."""
    async with ApiServer() as api, kmock.Server(api):
        api.register_defaults()
        yield api


@pytest_asyncio.fixture
async def cluster(apiserver):
    """The test's client of that API, playing the cluster's own controllers."""
    return Cluster(apiserver)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory):
    """A real kube-apiserver and kube-controller-manager (Kubernetes 1.36), started once per test process,
    with both CRDs installed by server-side apply and every request in its audit log. Without the binaries the test is skipped, saying how
    to get them, or fails where every tier is required (tests/support/tiers.py)."""
    try:
        real.scripts_dir()
    except real.ControlPlaneMissing as e:
        tiers.unavailable(str(e))
    state = tmp_path_factory.mktemp("control-plane")
    with real.running(state, audit=True, controllers=(real.STATEFULSET_CONTROLLER,)) as plane:
        plane.kubectl("apply", "--server-side", "-f", str(CRDS))
        plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRDS))
        plane.restart_controller_manager()  # so that its garbage collector knows our kinds from now on
        yield plane


def _controller(plane: real.ControlPlane, name: str) -> dict[str, str]:
    try:
        return real.start_controller(plane, name)
    except real.ControlPlaneMissing as e:
        tiers.unavailable(str(e))


@pytest.fixture(scope="session")
def jobset_controller(control_plane):
    """The real JobSet controller (v0.12.0) beside this process's control plane, started on first use."""
    return _controller(control_plane, "jobset")


@pytest.fixture(scope="session")
def lws_controller(control_plane):
    """The real LeaderWorkerSet controller (v0.10.0) beside this process's control plane (whose
    kube-controller-manager runs the StatefulSet controller LWS needs), started on first use."""
    return _controller(control_plane, "lws")


@pytest.fixture(scope="session")
def vllm_python():
    """The interpreter of the vLLM environment, as production runs vLLM from its own image."""
    return tiers.vllm_python()


@pytest.fixture(scope="session")
def kubectl_path():
    return tiers.kubectl()


@pytest.fixture
def namespace(control_plane):
    """A fresh namespace of the real API server, deleted (without waiting) after the test."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    control_plane.create_namespace(name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


# The folders whose tests train, merge, compile XLA programs or start vLLM; `make test-fast` leaves them out.
ML_FOLDERS = ("tests/workloads/training/", "tests/workloads/merging/", "tests/serving/", "tests/e2e/")
# The whole pipeline runs (a cluster, training, merge, vLLM): twice the time pyproject's `timeout` gives a test.
PIPELINE_FOLDER, PIPELINE_TIMEOUT = "tests/e2e/", 1200


def pytest_collection_modifyitems(items):
    for item in items:
        if "control_plane" in getattr(item, "fixturenames", ()):
            item.add_marker(MARK)
        if item.nodeid.startswith(ML_FOLDERS):
            item.add_marker("ml")
        if item.nodeid.startswith(PIPELINE_FOLDER) and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(PIPELINE_TIMEOUT))
        if item.get_closest_marker(MARK):  # its reports carry it: a keyword would also match the folder's name
            item.user_properties.append(("tier", MARK))


def pytest_terminal_summary(terminalreporter):
    """The real-API-server tier's own count, so that a run shows it was not skipped."""
    counts: dict[str, int] = {}
    for outcome in ("passed", "failed", "skipped", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            if ("tier", MARK) in getattr(report, "user_properties", ()) and report.when in ("call", "setup"):
                if outcome == "passed" and report.when != "call":
                    continue
                counts[outcome] = counts.get(outcome, 0) + 1
    if counts:
        line = ", ".join(f"{n} {outcome}" for outcome, n in counts.items())
        terminalreporter.write_line(f"real control plane (kube-apiserver 1.36): {line}")
