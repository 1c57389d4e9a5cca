"""`gemma-tpu dev` end to end: the same code path as `make demo`, asserted on the final state,
on what `kubectl wait` sees meanwhile, and on every demo answer asked again of the live servers."""

import asyncio

import pytest
import yaml

from gemma_devcluster import dev
from gemma_devcluster.client import NodeKube
from tests.support.demo import (
    KUBECTL,
    Printed,
    arguments,
    ask_live_servers,
    check_outcome,
    kubectl_wait_ready,
    until,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("vllm_python"),
]


async def test_dev_trains_merges_serves_and_answers_every_question_right(tmp_path, capsys):
    workdir = tmp_path / "demo"
    stop = asyncio.Event()
    demo = asyncio.create_task(dev.run(arguments(workdir), stop))
    try:
        printed = Printed(capsys)
        await until(lambda: printed.has(Printed.APPLIED), demo, "the quickstart applied")
        config = workdir / "kubeconfig"
        if KUBECTL:  # where kubectl is installed, it waits for both kinds while the demo trains
            waited = await asyncio.to_thread(kubectl_wait_ready, config, tmp_path)
            assert waited.returncode == 0, waited.stderr
            assert waited.stdout.count("condition met") == 2, waited.stdout
        await until(lambda: printed.has(Printed.ANSWERED), demo, "answers")
        url = yaml.safe_load(config.read_text())["clusters"][0]["cluster"]["server"]
        asked = await ask_live_servers(NodeKube.local(url, user_agent="gemma-tpu-tests"))
        await until(lambda: printed.has(Printed.BENCHMARK), demo, "the serving benchmark's figures")
    finally:
        stop.set()
        out = await demo
    check_outcome(out, asked)
    # The answers wait for no benchmark: printed first, whichever poll above saw them.
    assert printed.text.index(Printed.ANSWERED) < printed.text.index(Printed.BENCHMARK)
