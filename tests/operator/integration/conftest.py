import asyncio

import pytest_asyncio

from gemma_operator import runner
from gemma_operator.settings import OperatorSettings


@pytest_asyncio.fixture
async def operator(apiserver):
    """The real kopf operator, in this test's event loop, against the in-process API."""
    settings = OperatorSettings(progress_poll_seconds=0.3)
    stop, ready = asyncio.Event(), asyncio.Event()
    controller, tasks = await runner.spawn(str(apiserver.url), settings, stop, ready)
    await asyncio.wait_for(ready.wait(), 15)
    yield controller
    await runner.stop(tasks, stop)
