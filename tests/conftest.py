"""Fixtures shared by every test package."""

import kmock
import pytest_asyncio

from gemma_devcluster.apiserver import ApiServer
from tests.support.cluster import Cluster


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
