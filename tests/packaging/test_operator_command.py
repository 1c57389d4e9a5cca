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
from gemma_operator import runner
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
    runner.warn_when_watches_pause()
    watching = logging.getLogger("kopf._cogs.clients.watching")
    with caplog.at_level(logging.INFO):
        watching.debug("Pausing the watch-stream for gemmafinetunes cluster-wide (blockers: peering CRD is missing).")
        watching.debug("Starting the watch-stream for gemmafinetunes cluster-wide.")
    assert [(r.levelname, r.getMessage()[:26]) for r in caplog.records] == [("WARNING", "Pausing the watch-stream f")]
