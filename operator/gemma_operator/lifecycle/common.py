"""What both lifecycles share: what they observe of their resource, the Decision they return and
the skeleton of a decision."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from gemma_operator import api, pod_creation, reasons
from gemma_operator.addons import Missing
from gemma_operator.conditions import find, set_condition
from gemma_operator.health import kstatus_conditions
from gemma_operator.status import read, written


@dataclass
class ResourceView:
    """The custom resource as observed; each lifecycle's view adds its plan and children."""

    name: str
    namespace: str
    generation: int
    status: dict[str, Any]  # as read from the API: decide() reads it into its typed model
    problems: list[str]  # why the spec is invalid; empty when it is valid
    owner: dict[str, Any] | None  # the ownerReference its children carry
    now: datetime.datetime
    missing: list[Missing] = field(default_factory=list)  # add-ons the spec needs that the cluster lacks
    refusal: pod_creation.Refusal | None = None  # why the API server refuses the current workload's pods


Status = TypeVar("Status", api.GemmaFineTuneStatus, api.GemmaServeStatus)


@dataclass
class Decision(Generic[Status]):
    """What to do: the status decided, typed, and the children to create, patch and delete."""

    status_model: Status
    create: list[dict] = field(default_factory=list)
    patch: list[tuple[str, str, dict]] = field(default_factory=list)  # (kind, name, merge patch)
    delete: list[dict] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)

    @property
    def status(self) -> dict[str, Any]:
        """The status as the operator writes it (its JSON form: `status.written`)."""
        return written(self.status_model)


def set_cond(view: ResourceView, st: Status, type_: str, value: bool, reason: str, message: str) -> None:
    st.conditions = set_condition(st.conditions, type_, value, reason, message, view.generation, view.now)


def _held_by_missing_addons(view: ResourceView, st: Status, d: Decision[Status]) -> bool:
    """The DependencyMissing condition, with a Warning Event when it appears or changes; True when
    an add-on the resource cannot do without is missing (it then waits, Pending, creating nothing)."""
    text = "; ".join(m.message for m in view.missing)
    before = find(st.conditions, reasons.DEPENDENCY_MISSING)
    if text and (before is None or before.status != "True" or before.message != text):
        d.events.append(("Warning", reasons.DEPENDENCY_MISSING, text))
    if text or before:
        set_cond(
            view,
            st,
            reasons.DEPENDENCY_MISSING,
            bool(text),
            reasons.DEPENDENCY_MISSING if text else reasons.SATISFIED,
            text,
        )
    if any(m.blocking for m in view.missing):
        st.phase, st.message = reasons.PENDING, text
        return True
    return False


def _pods_refused(view: ResourceView, st: Status, d: Decision[Status]) -> None:
    """The PodsCreated condition: False with the API server's refusal (and one Warning Event when
    it appears or changes), True again once pods exist. The phase stays: the cause may go away by
    itself (a quota freed, a ServiceAccount created), and the workload's controller keeps trying."""
    before = find(st.conditions, reasons.PODS_CREATED)
    if view.refusal is None:
        if before is not None and before.status == "False":
            set_cond(view, st, reasons.PODS_CREATED, True, reasons.PODS_CREATED, "no pod of the workload is refused")
        return
    text = view.refusal.describe()
    if before is None or before.status != "False" or before.message != text:
        d.events.append(("Warning", reasons.POD_CREATION_FAILED, text))
    set_cond(view, st, reasons.PODS_CREATED, False, reasons.POD_CREATION_FAILED, text)
    if st.phase in (reasons.PENDING, reasons.DEPLOYING):
        st.message = text


def decide_with(
    view: ResourceView,
    status_type: type[Status],
    advance: Callable[[Decision[Status]], None],
    invalid: Callable[[Status, str], None],
) -> Decision[Status]:
    """The previous status read into its model, observedGeneration, the InvalidSpec condition, the
    lifecycle's own step, the Ready, Reconciling and Stalled conditions that follow from it, and an
    Event (Warning when Failed) whenever the phase changes."""
    st = read(status_type, view.status)
    d = Decision(st)
    before = st.phase
    st.observed_generation = view.generation
    if view.problems:
        message = "; ".join(view.problems)
        set_cond(view, st, reasons.INVALID_SPEC, True, reasons.INVALID_SPEC, message)
        invalid(st, message)
    else:
        set_cond(view, st, reasons.INVALID_SPEC, False, reasons.VALID, "")
        if not _held_by_missing_addons(view, st, d):
            advance(d)
            _pods_refused(view, st, d)
    for type_, value, reason, message in kstatus_conditions(st):
        set_cond(view, st, type_, value, reason, message)
    phase = st.phase or reasons.PENDING
    if st.phase != before or not before:
        d.events.append(("Warning" if phase == reasons.FAILED else "Normal", phase, st.message or phase))
    return d
