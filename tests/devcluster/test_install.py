"""What `gemma-tpu dev` installs on a real API server is what the chart installs by default: the
operator's ServiceAccount in the chart's namespace, bound to a ClusterRole of the chart's rules, and
workload ServiceAccounts that mount no token."""

from gemma_devcluster import install
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
