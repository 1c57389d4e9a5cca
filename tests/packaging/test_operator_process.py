"""The operator as the chart runs it, in its own process: health, metrics, and RBAC."""

from __future__ import annotations

import asyncio
import time

import pytest

from gemma_devcluster.apiserver import write_kubeconfig
from gemma_devcluster.processes import free_port
from gemma_operator.children import training
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune
from tests.support.chart import objects, one, role_grants
from tests.support.operator import operator_calls
from tests.support.process import chart_command, http_status, running, scrape, stop, until

pytestmark = pytest.mark.slow
NS = "default"


def sample(samples, name, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def test_metrics_health_and_rbac_of_the_operator_process(apiserver, cluster, tmp_path):
    metrics_port, health_port = free_port(), free_port()
    values = {"metrics": {"port": metrics_port}, "healthPort": health_port}
    service = one(objects(values), "Service")
    assert service["spec"]["ports"][0]["port"] == metrics_port, "the chart exposes the port the operator serves"
    command = chart_command(values, tmp_path)
    config, log = write_kubeconfig(tmp_path / "kubeconfig", str(apiserver.url)), tmp_path / "operator.log"
    with running(command, config, log) as proc:
        await until(lambda: http_status(f"http://127.0.0.1:{health_port}/healthz") == 200, message="/healthz", log=log)

        b = finetune("ft").tpu("v5p", "2x2x1")
        train = training.names(plan_finetune(b.name, NS, b.spec, OperatorSettings()))[0]
        await cluster.apply(b.obj())
        await cluster.job(NS, train)
        await cluster.job_running(NS, train)
        running_since = time.monotonic()
        await cluster.phase("GemmaFineTune", NS, "ft", "Training")
        m = await until(
            lambda: _scraped_with(metrics_port, "gemma_tpu_active_chips", accelerator="v5p"),
            log=log,
            message="active chips",
        )
        assert sample(m, "gemma_tpu_active_chips", accelerator="v5p") == 4, "a v5p-8 slice holds 4 chips"
        assert sample(m, "gemma_tpu_resources", kind="GemmaFineTune", phase="Training") == 1
        assert sample(m, "gemma_tpu_reconciles_total", kind="GemmaFineTune", outcome="ok") >= 2
        assert sample(m, "gemma_tpu_reconcile_seconds_count", kind="GemmaFineTune") >= 2
        assert 0 < sample(m, "gemma_tpu_reconcile_seconds_sum", kind="GemmaFineTune") < 10

        await asyncio.sleep(2.1)  # status times have one-second resolution: let chip-hours accrue
        await cluster.job_succeeded(NS, train, {"status": "succeeded", "step": 100, "checkpoint": "gs://out/ft/ckpt"})
        ran = time.monotonic() - running_since
        ft = await cluster.phase("GemmaFineTune", NS, "ft", "Merging")
        m = await until(
            lambda: _scraped_with(metrics_port, "gemma_tpu_resources", kind="GemmaFineTune", phase="Merging"),
            log=log,
            message="Merging phase gauge",
        )
        assert sample(m, "gemma_tpu_resources", kind="GemmaFineTune", phase="Training") == 0
        assert sample(m, "gemma_tpu_active_chips", accelerator="v5p") == 0, "merging holds no TPU"
        chip_hours = ft["status"]["chipHours"]
        # 4 chips, seen running for at least the 2 s slept, at most for as long as the Job ran
        # (timestamps have one-second resolution).
        assert 4 * 1 / 3600 <= chip_hours <= 4 * (ran + 2) / 3600, (chip_hours, ran)
        assert sample(m, "gemma_tpu_chip_hours_total", accelerator="v5p") == pytest.approx(chip_hours, abs=1e-3)
        await stop(proc, log)

    role = one(objects(), "ClusterRole")
    denied = sorted({c[:3] for c in operator_calls(apiserver) if not role_grants(role, c)})
    assert not denied, f"the operator process made requests its ClusterRole does not grant: {denied}"


def _scraped_with(port, name, **labels):
    samples = scrape(port)
    return samples if sample(samples, name, **labels) else None
