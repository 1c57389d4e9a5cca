"""`gemma-tpu operator` typed by hand, with no flags: it must watch, not wait for its poller.

kopf pauses every watch when peering is mandatory and its peering CRD is absent
(kopf `_core/reactor/orchestration.py`, `adjust_tasks`: `peering_missing` is turned on when
`settings.peering.mandatory` and no peering resource is served); the operator then moved only
on its 30 s poller. No cluster has that CRD unless it is installed on purpose.
"""

from __future__ import annotations

import logging
import time

import pytest

from gemma_devcluster.apiserver import write_kubeconfig
from gemma_operator import log_filters
from gemma_operator.children import training
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune
from tests.support.process import ENTRYPOINT, running, stop, until

pytestmark = pytest.mark.slow
NS = "default"
PROMPTLY = 10  # seconds; the poller's default period is 30 s


async def test_operator_without_flags_watches_and_creates_the_job_promptly(apiserver, cluster, tmp_path):
    assert OperatorSettings().progress_poll_seconds >= 3 * PROMPTLY, "the poller alone would also be prompt"
    config, log = write_kubeconfig(tmp_path / "kubeconfig", str(apiserver.url)), tmp_path / "operator.log"
    with running([str(ENTRYPOINT), "operator"], config, log) as proc:
        await until(lambda: _started(log), 60, "the operator's startup", log)
        b = finetune("by-hand").tpu("v5p", "2x2x1")
        job = training.names(plan_finetune(b.name, NS, b.spec, OperatorSettings()))[0]
        applied = time.monotonic()
        await cluster.apply(b.obj())
        await cluster.job(NS, job, timeout=PROMPTLY)
        await cluster.job_running(NS, job)
        await cluster.phase("GemmaFineTune", NS, "by-hand", "Training", timeout=PROMPTLY)
        took = time.monotonic() - applied
        await stop(proc, log)
    text = log.read_text()
    assert "Pausing the watch-stream" not in text, text[-3000:]
    assert took < 2 * PROMPTLY


def _started(log) -> bool:
    return "Initial authentication has finished" in log.read_text() if log.exists() else False


def test_paused_watches_are_reported_at_warning(caplog):
    """kopf logs the pause at DEBUG (`_cogs/clients/watching.py`, `streaming_block`)."""
    log_filters.install(handlers=[])
    watching = logging.getLogger("kopf._cogs.clients.watching")
    with caplog.at_level(logging.INFO):
        watching.debug("Pausing the watch-stream for gemmafinetunes cluster-wide (blockers: peering CRD is missing).")
        watching.debug("Starting the watch-stream for gemmafinetunes cluster-wide.")
    assert [(r.levelname, r.getMessage()[:26]) for r in caplog.records] == [("WARNING", "Pausing the watch-stream f")]


def test_retries_of_a_starting_api_server_are_info_and_others_stay_errors(caplog):
    """kopf logs each retried request at ERROR (`_cogs/clients/api.py`, `request`); the answers of an API
    server that is starting (a watch cache filling, routes not yet installed) are not errors."""
    caplog.handler.addFilter(log_filters.ServerWarmingUp())
    api_log = logging.getLogger("kopf._cogs.clients.watching")
    with caplog.at_level(logging.INFO):
        api_log.error(
            "Request attempt #5/7 failed; will retry: GET /apis/gemma-tpu.dev/v1alpha1/gemmaserves "
            "-> APITooManyRequestsError('storage is (re)initializing', {'code': 429})"
        )
        api_log.error(
            "Request attempt #4/7 failed; will retry: GET /apis/apps/v1/deployments -> APIServerError("
            "'the request has been made before all known HTTP paths have been installed, please try again')"
        )
        api_log.error("Request attempt #1/7 failed; will retry: GET /api/v1/configmaps -> ClientConnectorError()")
    assert [r.levelname for r in caplog.records] == ["INFO", "INFO", "ERROR"]
    assert caplog.records[0].getMessage().startswith("the API server is starting; Request attempt #5/7")


def test_kopf_says_each_handler_succeeded_no_more_and_still_warns(caplog):
    """kopf logs every handler's success at INFO through its per-object logger `kopf.objects`
    (`_core/actions/execution.py`, `execute_handler_once`): one line per watch event."""
    log_filters.install(handlers=[])
    objects = logging.getLogger("kopf.objects")
    with caplog.at_level(logging.INFO):
        objects.info("Handler 'register.<locals>.fine_tune_event' succeeded.")
        objects.warning("Handler 'register.<locals>.fine_tune_event' failed temporarily: boom")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "Handler 'register.<locals>.fine_tune_event' failed temporarily: boom")
    ]
