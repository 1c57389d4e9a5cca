"""What a reconcile reads, declared as data: each lifecycle says what its decision needs, the
controller reads it (reconcile.py) in the order declared, and a read may depend on what an earlier
one found (a workload's pods are read once the workload exists). Each read is a frozen value, so
what it found is looked up by the read itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from gemma_operator import pod_creation
from gemma_operator.addons import Missing
from gemma_workloads.config import Progress

T = TypeVar("T")


class Read(Generic[T]):
    """A read whose result is a T."""


@dataclass(frozen=True)
class Get(Read[dict | None]):
    """One object of the CR's namespace, None when absent. The objects read this way are also what
    the decision's writes are compared with."""

    kind: str
    name: str


@dataclass(frozen=True)
class Pods(Read[list[dict]]):
    """The pods `selector` matches, once `owner` exists (none while it does not)."""

    owner: Get
    selector: str


@dataclass(frozen=True)
class ProgressLog(Read[Progress | None]):
    """The latest progress line of the coordinating training pod's log, while the workload runs."""

    workload: Get
    pods: Pods
    container: str


@dataclass(frozen=True)
class Refusal(Read[pod_creation.Refusal | None]):
    """Why the API server refuses the workload's pods (its namespace's FailedCreate Events, read
    only while it has fewer pods than it runs)."""

    workload: Get
    pods: Pods


@dataclass(frozen=True)
class Listed(Read[list[dict]]):
    """The objects of these kinds that `selector` matches, each with its kind; a kind whose CRD is
    not installed has none."""

    kinds: tuple[str, ...]
    selector: str


@dataclass(frozen=True)
class AddOns(Read[list[Missing]]):
    """The add-ons of `wanted` (kind, True when the resource cannot do without) the cluster lacks."""

    wanted: tuple[tuple[str, bool], ...]


class Found:
    """What the reads of one reconcile found, by read."""

    def __init__(self) -> None:
        self._found: dict[Read[Any], Any] = {}

    def __setitem__(self, read: Read[T], value: T) -> None:
        self._found[read] = value

    def __getitem__(self, read: Read[T]) -> T:
        return cast(T, self._found[read])

    def objects(self) -> dict[tuple[str, str], dict | None]:
        """Every object read by kind and name (None: absent)."""
        return {(r.kind, r.name): v for r, v in self._found.items() if isinstance(r, Get)}
