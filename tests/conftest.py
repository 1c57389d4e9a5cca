"""Fixtures shared by every test package."""

import kmock
import pytest_asyncio

from gemma_operator.devcluster.apiserver import ApiServer


@pytest_asyncio.fixture
async def apiserver():
    """The in-process Kubernetes API over real HTTP, with the built-in kinds and our CRDs."""
    async with ApiServer() as api, kmock.Server(api):
        api.register_defaults()
        yield api
