"""The chart's roles against the requests the real operator makes in the integration scenarios.

Every operator integration test (tests/operator/integration/test_operator_*.py) is run again against a fresh
in-process API server, which records each request with its User-Agent: the operator's own client
and kopf's are told apart from the tests' client. Both directions are checked: every request is
granted, and every permission granted is used.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib
import inspect
import pkgutil
import tempfile
from pathlib import Path

import pytest

import tests.operator.integration
from gemma_devcluster.apiserver import Call
from gemma_operator import rbac
from tests.support.chart import grants, objects, one, role_grants
from tests.support.cluster import Cluster
from tests.support.operator import api_server, operator, operator_calls

WATCHED = ["default", "lab"]


def scenarios(*names: str) -> list:
    """The operator integration tests, as coroutines taking fixtures by name."""
    found = []
    for mod in pkgutil.iter_modules(tests.operator.integration.__path__):
        if mod.name.startswith("test_operator_"):
            module = importlib.import_module(f"tests.operator.integration.{mod.name}")
            found += [f for n, f in vars(module).items() if n.startswith("test_") and inspect.iscoroutinefunction(f)]
    return [f for f in found if not names or f.__name__ in names]


async def run(scenario, namespaces: list[str] | None = None) -> collections.Counter[Call]:
    params = inspect.signature(scenario).parameters
    async with api_server() as api, contextlib.AsyncExitStack() as stack:
        given = {"apiserver": api, "cluster": Cluster(api)}
        if "operator" in params:
            given["operator"] = await stack.enter_async_context(operator(api, namespaces or ()))
        if "tmp_path" in params:
            given["tmp_path"] = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        await scenario(**{name: given[name] for name in params})
        return operator_calls(api)


def observe(found: list, namespaces: list[str] | None = None) -> collections.Counter[Call]:
    async def all_of_them():
        calls: collections.Counter[Call] = collections.Counter()
        for scenario in found:
            calls.update(await run(scenario, namespaces))
        return calls

    return asyncio.run(all_of_them())


@pytest.fixture(scope="module")
def observed() -> collections.Counter[Call]:
    found = scenarios()
    assert len(found) >= 15, "the operator integration tests were not found"
    return observe(found)


@pytest.fixture(scope="module")
def observed_namespaced() -> collections.Counter[Call]:
    return observe(
        scenarios(
            "test_happy_path_train_merge_succeed",
            "test_serve_waits_deploys_and_rolls_to_a_new_output",
            "test_invalid_spec_schedules_nothing_and_a_fix_recovers",
        ),
        namespaces=["default"],
    )


def _permissions(role: dict) -> list[tuple[str, str, str]]:
    return [
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    ]


def _explain(calls) -> str:
    return "\n".join(
        f"  {c.verb} {c.group or 'core'}/{c.resource} in {c.namespace or 'the cluster'}"
        for c in sorted(set(calls), key=str)
    )


def test_the_cluster_role_grants_every_request_of_the_operator(observed):
    role = one(objects(), "ClusterRole")
    denied = [c for c in observed if not role_grants(role, c)]
    assert not denied, f"the operator makes requests its ClusterRole does not grant:\n{_explain(denied)}"


def test_every_permission_of_the_cluster_role_is_used(observed):
    role = one(objects(), "ClusterRole")
    unused = [
        p
        for p in _permissions(role)
        if not any(grants({"apiGroups": [p[0]], "resources": [p[1]], "verbs": [p[2]]}, c) for c in observed)
    ]
    assert not unused, f"granted but never requested by the operator: {unused}"


def test_the_roles_are_derived_from_the_operators_api_table():
    assert one(objects(), "ClusterRole")["rules"] == rbac.cluster_rules()
    roles = [o for o in objects({"watchNamespaces": WATCHED}) if o["kind"] == "Role"]
    assert [r["metadata"]["namespace"] for r in roles] == WATCHED
    assert all(r["rules"] == rbac.namespaced_rules() for r in roles)


def test_a_namespaced_operator_needs_only_roles_in_its_namespaces(observed_namespaced):
    objs = objects({"watchNamespaces": WATCHED, "crds": {"enabled": False}})
    assert not [o for o in objs if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    roles = [o for o in objs if o["kind"] == "Role"]
    denied = [c for c in observed_namespaced if not any(role_grants(r, c) for r in roles)]
    assert not denied, f"requests no Role grants (cluster-wide ones need a ClusterRole):\n{_explain(denied)}"
    assert {c.namespace for c in observed_namespaced} == {"default"}
