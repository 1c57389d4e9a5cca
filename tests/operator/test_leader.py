"""Lease leader election against the in-process API, time moved by hand."""

import asyncio
import threading

import kubernetes

from gemma_operator.leader import Elector


class Clock:
    """Monotonic seconds that move when the test says, or by `step` at every reading."""

    def __init__(self, step: float = 0.0) -> None:
        self.now, self.step = 1000.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def elector(apiserver, identity: str, clock: Clock) -> Elector:
    cfg = kubernetes.client.Configuration()
    cfg.host = str(apiserver.url).rstrip("/")
    return Elector(kubernetes.client.ApiClient(cfg), "ops", "lead", identity, lease_seconds=15, clock=clock)


async def test_a_silent_leader_is_replaced_once_its_lease_expires(apiserver):
    clock = Clock()
    a, b = elector(apiserver, "a", clock), elector(apiserver, "b", clock)
    attempt = lambda e: asyncio.to_thread(e.try_acquire_or_renew)  # noqa: E731
    assert await attempt(a) and await attempt(a), "the first candidate leads and renews"
    assert not await attempt(b)
    clock.now += 14
    assert not await attempt(b), "14 s after b first saw a's renewal the lease still holds"
    clock.now += 2
    assert await attempt(b), "a went silent: b takes over after lease duration"
    assert not await attempt(a), "a finds b renewed the lease after its own write"
    lease = apiserver.objects[(apiserver.resource_of("coordination.k8s.io/v1", "leases"), "ops", "lead")]["spec"]
    assert lease["holderIdentity"] == "b" and lease["leaseTransitions"] == 1


async def test_concurrent_candidates_get_one_leader(apiserver):
    clock = Clock()
    candidates = [elector(apiserver, f"c{i}", clock) for i in range(4)]
    won = await asyncio.gather(*(asyncio.to_thread(c.try_acquire_or_renew) for c in candidates))
    assert sum(won) == 1


async def test_a_leader_that_cannot_renew_steps_down_and_release_hands_over(apiserver):
    clock = Clock()
    a, b = elector(apiserver, "a", clock), elector(apiserver, "b", clock)
    assert await asyncio.to_thread(a.try_acquire_or_renew)
    await asyncio.to_thread(a.release)
    assert await asyncio.to_thread(b.try_acquire_or_renew), "a released lease is taken at once"

    lost = []
    a.retry_seconds, clock.step = 0.01, 1.0  # b holds the lease: every renewal of a fails, time passes
    await asyncio.wait_for(asyncio.to_thread(a.keep, lambda: lost.append(True), threading.Event(), deadline=3), 5)
    assert lost == [True], "a stepped down once its renew deadline passed"
