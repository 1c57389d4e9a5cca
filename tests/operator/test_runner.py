"""What runner.py's settings rely on: the operator declares no handler that needs kopf's diff-base
(on.create, on.update, on.resume and the like, daemons and timers), so `runner.NoDiffBase` stores none."""

import kopf

from gemma_operator.kube import Kube
from gemma_operator.reconcile import Controller, register
from gemma_operator.settings import OperatorSettings


def test_no_handler_needs_a_diff_base():
    # kopf builds and diffs the essence only for its changing and spawning handlers
    # (kopf/_core/reactor/processing.py, `_detect_causes`): watching ones get the raw event.
    registry = kopf.OperatorRegistry()
    register(registry, Controller(Kube.from_url("http://127.0.0.1:1"), OperatorSettings()))
    assert registry._changing.get_all_handlers() == []
    assert registry._spawning.get_all_handlers() == []
    assert registry._watching.get_all_handlers(), "the operator's handlers are watching ones"
