"""What the API server itself allows, for operator_scale.py to hold the operator against, in the
same run and on the same server:

- bare pairs: a client creating the training ConfigMap + Job of each fine-tune, nothing else (the
  objects the operator exists to make);
- the same writes: a client making every write the operator's first reconcile makes, with nothing
  watched, planned or decided: the user's CR itself, its children (with their owner reference),
  its first status (the operator's own JSON patch, with the status the operator wrote in its
  run) and the phase Event. An operator cannot be faster than the writes it must make; this is
  that floor.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from gemma_operator import api
from gemma_operator.children import serving_objects, training_objects
from gemma_operator.children.common import owner_reference
from gemma_operator.kube import Kube, status_patch
from gemma_operator.plan import plan_finetune, plan_serve
from gemma_operator.settings import OperatorSettings


async def in_parallel(jobs: list[Callable[[], Awaitable[None]]], concurrency: int) -> float:
    """Run the jobs on `concurrency` workers, in order; the seconds it took."""
    queue = list(reversed(jobs))

    async def worker() -> None:
        while queue:
            await queue.pop()()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start


def children_of(cr: dict, settings: OperatorSettings) -> list[dict]:
    """The children the operator's first reconcile of `cr` creates, without their owner reference
    (it needs the uid the CR's creation gives): planned before any clock starts."""
    meta = cr["metadata"]
    if cr["kind"] == api.FINETUNE.kind:
        return training_objects(plan_finetune(meta["name"], meta["namespace"], cr["spec"], settings), settings)
    return serving_objects(plan_serve(meta["name"], meta["namespace"], cr["spec"], settings), settings)


async def bare_pairs(kube: Kube, crs: list[dict], concurrency: int) -> float:
    """Seconds for a bare client to create each fine-tune's ConfigMap + Job (the CRs aside)."""
    settings = OperatorSettings()
    pairs = [children_of(cr, settings) for cr in crs if cr["kind"] == api.FINETUNE.kind]

    def create(objects: list[dict]) -> Callable[[], Awaitable[None]]:
        async def job() -> None:
            for obj in objects:
                await kube.create(obj)

        return job

    return await in_parallel([create(objects) for objects in pairs], concurrency)


async def same_writes(kube: Kube, crs: list[dict], concurrency: int, statuses: dict[str, dict]) -> float:
    """Seconds for a bare client to make every write of the operator's first reconcile of each CR
    (`statuses`: the status the operator wrote, by kind), the CR's own creation included."""
    settings = OperatorSettings()

    def writes(cr: dict, children: list[dict]) -> Callable[[], Awaitable[None]]:
        async def job() -> None:
            made = await kube.create(cr)
            meta = made["metadata"]
            owner = owner_reference(api.KINDS[cr["kind"]], meta["name"], meta["uid"])
            for child in children:
                await kube.create({**child, "metadata": {**child["metadata"], "ownerReferences": [owner]}})
            status = statuses[cr["kind"]]
            ops = status_patch({}, status, meta["resourceVersion"])
            await kube.patch_json(cr["kind"], meta["namespace"], meta["name"], ops, status=True)
            await kube.event(made, "Normal", status.get("phase") or "Pending", status.get("message") or "")

        return job

    return await in_parallel([writes(cr, children_of(cr, settings)) for cr in crs], concurrency)
