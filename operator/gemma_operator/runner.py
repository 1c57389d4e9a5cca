"""Starting the operator: kopf's settings, the API client, the handlers, metrics.

`run()` is `gemma-tpu operator` on a cluster. `spawn()` starts the same operator inside an
existing event loop (tests, `gemma-tpu dev`), against an API at a given URL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import threading
from collections.abc import Collection

import kopf
import kubernetes

from gemma_operator import api, leader, log_filters, prometheus_metrics
from gemma_operator.kube import REQUESTS_IN_FLIGHT, USER_AGENT, Kube
from gemma_operator.reconcile import Controller, register
from gemma_operator.settings import OperatorSettings, load_settings


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf builds every event's "essence" (a deep copy of the object less its status) and diffs it
    with the last one handled, for on.create/on.update handlers and daemons. The operator's handlers
    are all on.event and indexes, which never see a diff (test_runner.py holds it to that): the
    copy was a fifth of kopf's work per event, so none is built or kept."""

    def build(self, *, body: kopf.Body, extra_fields: object = None) -> kopf.BodyEssence:
        return {}

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass


def configure(settings: kopf.OperatorSettings, *, namespaced: bool = False) -> None:
    """kopf settings chosen once, in one place. Peering is left to kopf.run's own arguments
    (standalone unless `--peering NAME`, which kopf makes mandatory: without kopf's peering CRDs
    that pauses every watch)."""
    # The handlers are level-based (on.event), so kopf needs no per-object progress storage;
    # should any be used, keep it in annotations of our own group rather than in status,
    # which the CRD's structural schema would prune.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.persistence.finalizer = f"{api.GROUP}/finalizer"
    settings.posting.level = logging.WARNING  # our own Events say what happened; kopf adds its errors
    settings.watching.server_timeout = 300  # re-establish watches every few minutes
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    # kopf retries a failed request after 1, 1, 2, 3, 5, 8, 13 and 21 s by default: after an outage of
    # a minute its watches came back 13 s after the API did. Retry every 2 s instead; past the last
    # delay a watch gives up and is restarted at once (kopf's infinite_watch), so it never stops.
    settings.networking.error_backoffs = [1, 2, 2, 2, 2, 2]
    # Watching given namespaces needs no cluster-scoped reads: kopf then neither lists namespaces
    # nor watches CRDs (a kind installed later, JobSet say, is seen after a restart).
    settings.scanning.disabled = namespaced


# Young objects are collected every this many allocations (Python's default: 700). A burst of CRs
# allocates and frees bodies by the hundred thousand, and most go by reference counting alone.
GC_YOUNG_THRESHOLD = 10_000


def collect_less() -> None:
    """What start-up built (modules, kopf's registry, the client) lives as long as the process:
    frozen, no collection scans it again. With fewer collections of young objects besides, the
    collector took 0.7 s instead of 2.3 s of a 1,000-CR burst (benchmarks/operator_scale.py)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def _client_from_environment() -> kubernetes.client.ApiClient:
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    client = kubernetes.client.ApiClient()
    client.configuration.connection_pool_maxsize = REQUESTS_IN_FLIGHT
    return client


def run(args: argparse.Namespace) -> int:
    """`gemma-tpu operator`: run until stopped (exit status 1 when leadership was lost, or when a
    task the operator needs died)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.standalone and args.peering:
        logging.error("--standalone and --peering exclude each other")
        return 2
    log_filters.install()
    settings = load_settings(args.settings)
    client = _client_from_environment()
    lease = args.leader_election_lease
    elector = leader.elector_for(client, lease, USER_AGENT) if lease else None
    kube = (
        Kube(client, user_agent=f"{USER_AGENT} ({elector.identity})", write_deadline=elector.write_deadline)
        if elector
        else Kube(client)
    )
    controller = Controller(kube, settings, args.namespace)
    registry = kopf.OperatorRegistry()
    register(registry, controller)
    # A registry of our own has none of kopf's default login handlers: log in as our client does.
    kopf.on.login(registry=registry)(kopf.login_via_client)

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, **_: object) -> None:
        configure(settings, namespaced=bool(args.namespace))
        if args.metrics_port:
            prometheus_metrics.serve(args.metrics_port, args.metrics_address)

    # kopf waits for its stop flag in a thread of its own, which has to end for the process to
    # exit: the flag goes up when leadership is lost, when a needed task dies, and at kopf's cleanup.
    stop_flag, lost, fatal = threading.Event(), threading.Event(), threading.Event()

    @kopf.on.cleanup(registry=registry)
    def lower_the_stop_flag_waiter(**_: object) -> None:
        stop_flag.set()

    def stop_on_fatal() -> None:
        fatal.set()
        stop_flag.set()

    controller.on_fatal = stop_on_fatal
    collect_less()
    with contextlib.suppress(asyncio.CancelledError):  # as kopf.run ends
        asyncio.run(_operate(registry, args, elector, stop_flag, lost))
    return 1 if lost.is_set() or fatal.is_set() else 0


async def _operate(
    registry: kopf.OperatorRegistry,
    args: argparse.Namespace,
    elector: leader.Elector | None,
    stop_flag: threading.Event,
    lost: threading.Event,
) -> None:
    """kopf, once this replica leads when there is a Lease to take; the Lease is renewed in the same loop."""
    async with contextlib.AsyncExitStack() as stack:
        if elector:
            await stack.enter_async_context(leader.leading(elector, args.liveness, stop_flag, lost))
        await kopf.operator(
            registry=registry,
            standalone=args.peering is None,
            peering_name=args.peering,
            liveness_endpoint=args.liveness or None,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            stop_flag=stop_flag,
        )


async def spawn(
    url: str,
    settings: OperatorSettings,
    stop: asyncio.Event,
    ready: asyncio.Event,
    namespaces: Collection[str] = (),
) -> tuple[Controller, Collection[asyncio.Task]]:
    """The operator as tasks of the running loop, talking to the API at `url` (no TLS)."""
    kube = Kube.from_url(url)
    controller = Controller(kube, settings, list(namespaces) or None)
    controller.on_fatal = stop.set
    registry = kopf.OperatorRegistry()
    register(registry, controller)

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, **_: object) -> None:
        configure(settings, namespaced=bool(namespaces))
        settings.watching.server_timeout = 30

    @kopf.on.login(registry=registry)
    def login(**_: object) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=url.rstrip("/"), insecure=True)

    tasks = await kopf.spawn_tasks(
        registry=registry,
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        stop_flag=stop,
        ready_flag=ready,
    )
    return controller, tasks


async def stop(tasks: Collection[asyncio.Task], flag: asyncio.Event) -> None:
    """Stop spawned operator tasks: raise the flag so watchers let go, then cancel what remains
    (kopf.run_tasks would also cancel every other task of the loop, the API server's included)."""
    flag.set()
    await asyncio.sleep(0.1)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
