"""What `gemma-tpu dev` installs on a real API server is what the chart installs by default: the
operator's ServiceAccount in the chart's namespace, bound to a ClusterRole of the chart's rules, and
workload ServiceAccounts that mount no token; and the client that installs it rides out a server's
transient answers."""

import kmock
import pytest

from gemma_devcluster import install
from gemma_devcluster.client import NODE_AGENT, RETRY_PAUSES, NodeKube
from gemma_devcluster.faults import BEFORE_WRITE, THROTTLED, FaultyApiServer
from gemma_operator.kube import ApiError
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune, serve
from tests.support.chart import NAMESPACE, objects, one


def test_the_operator_runs_under_the_charts_service_account_and_cluster_role():
    chart = objects()
    mine = {o["kind"]: o for o in install.operator_objects()}
    assert mine["Namespace"]["metadata"]["name"] == install.NAMESPACE == NAMESPACE
    account = one(chart, "ServiceAccount", install.NAME)
    assert (mine["ServiceAccount"]["metadata"]["namespace"], mine["ServiceAccount"]["metadata"]["name"]) == (
        account["metadata"]["namespace"],
        account["metadata"]["name"],
    )
    assert mine["ClusterRole"]["rules"] == one(chart, "ClusterRole")["rules"]
    binding = one(chart, "ClusterRoleBinding")
    assert (mine["ClusterRoleBinding"]["roleRef"], mine["ClusterRoleBinding"]["subjects"]) == (
        binding["roleRef"],
        binding["subjects"],
    )


def test_the_workload_service_accounts_are_the_charts_and_mount_no_token():
    own = finetune("c").obj()
    own["spec"]["serviceAccountName"] = "own"
    settings = OperatorSettings()
    accounts = install.workload_accounts([finetune("a").cpu_tiny().obj(), serve("b").obj(), own], settings)
    assert sorted(a["metadata"]["name"] for a in accounts) == sorted(
        ["own", settings.training_service_account, settings.serving_service_account]
    )
    assert {a["metadata"]["namespace"] for a in accounts} == {"default"}
    chart_accounts = [o for o in objects() if o["kind"] == "ServiceAccount" and o["metadata"]["name"] != install.NAME]
    assert {o["metadata"]["name"] for o in chart_accounts} == {
        settings.training_service_account,
        settings.serving_service_account,
    }
    assert all(a["automountServiceAccountToken"] is False for a in accounts + chart_accounts)


async def test_the_node_and_demo_client_asks_again_after_a_transient_answer():
    # A real API server answers 429 for a moment after a CRD is Established (its storage initialising).
    async with FaultyApiServer(agents=(NODE_AGENT,), retry_after=0) as api, kmock.Server(api):
        api.register_defaults()
        kube = NodeKube.local(str(api.url))
        api.inject(THROTTLED, verb="create", resource="serviceaccounts", times=2)
        api.inject(BEFORE_WRITE, verb="create", resource="serviceaccounts")
        created = await kube.create(install.workload_accounts([serve("b").obj()], OperatorSettings())[0])
        assert created["metadata"]["name"] == OperatorSettings().serving_service_account
        assert sum(api.injected.values()) == 3, "three transient answers, then the write"
        api.inject(THROTTLED, verb="create", resource="serviceaccounts", times=len(RETRY_PAUSES) + 1)
        with pytest.raises(ApiError) as refused:
            await kube.create(
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "x", "namespace": "d"}}
            )
        assert refused.value.status == 429, "a server that keeps refusing is reported"
