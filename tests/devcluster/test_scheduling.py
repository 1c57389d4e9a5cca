"""The local node's scheduling decisions against the rules of kube-scheduler's filter plugins
(pkg/scheduler/framework/plugins: nodeunschedulable, tainttoleration, nodeaffinity, noderesources)."""

import pytest

from gemma_devcluster.scheduling import fit_error, schedules

NODE = {
    "metadata": {"name": "n", "labels": {"kubernetes.io/os": "linux", "pool": "cpu", "cores": "8"}},
    "spec": {},
    "status": {"allocatable": {"cpu": "2", "memory": "8Gi", "pods": "110"}},
}


def pod(**spec):
    return {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}], **spec}}


def node(**spec):
    return {**NODE, "spec": spec}


def test_cpu_and_memory_requests_share_the_machine_but_a_missing_resource_is_insufficient():
    big = pod(containers=[{"name": "c", "image": "i", "resources": {"requests": {"cpu": "64", "memory": "1Ti"}}}])
    assert fit_error(big, NODE) is None
    chips = pod(containers=[{"name": "c", "image": "i", "resources": {"limits": {"google.com/tpu": "4", "cpu": "1"}}}])
    assert fit_error(chips, NODE) == "0/1 nodes are available: 1 Insufficient google.com/tpu."
    two = pod(
        initContainers=[{"name": "i", "image": "i", "resources": {"requests": {"example.com/fpga": "1"}}}],
        containers=[{"name": "c", "image": "i", "resources": {"requests": {"google.com/tpu": "4"}}}],
    )
    # NodeResourcesFit names every insufficient resource; FitError sorts the reasons.
    assert (
        fit_error(two, NODE)
        == "0/1 nodes are available: 1 Insufficient example.com/fpga, 1 Insufficient google.com/tpu."
    )


@pytest.mark.parametrize(
    ("requirement", "fits"),
    [
        ({"key": "pool", "operator": "In", "values": ["cpu", "x"]}, True),
        ({"key": "pool", "operator": "NotIn", "values": ["cpu"]}, False),
        ({"key": "pool", "operator": "Exists"}, True),
        ({"key": "gpu", "operator": "DoesNotExist"}, True),
        ({"key": "cores", "operator": "Gt", "values": ["4"]}, True),
        ({"key": "cores", "operator": "Lt", "values": ["4"]}, False),
    ],
)
def test_required_node_affinity_operators(requirement, fits):
    term = {"nodeSelectorTerms": [{"matchExpressions": [requirement]}]}
    p = pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": term}})
    assert (fit_error(p, NODE) is None) == fits


def test_node_selector_then_affinity_terms_are_ored():
    assert fit_error(pod(nodeSelector={"pool": "tpu"}), NODE) == (
        "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
    )
    terms = [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["tpu"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]},
    ]
    p = pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}})
    assert fit_error(p, NODE) is None


def test_taints_and_cordons_come_before_affinity():
    tainted = node(taints=[{"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}])
    both = pod(nodeSelector={"pool": "tpu"})
    assert (
        fit_error(both, tainted)
        == "0/1 nodes are available: 1 node(s) had untolerated taint {google.com/tpu: present}."
    )
    tolerant = pod(tolerations=[{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}])
    assert fit_error(tolerant, tainted) is None
    assert fit_error(pod(), node(taints=[{"key": "k", "effect": "PreferNoSchedule"}])) is None, "only scores"
    assert fit_error(both, node(unschedulable=True)) == "0/1 nodes are available: 1 node(s) were unschedulable."


def test_only_unbound_pending_pods_of_the_default_scheduler_are_placed():
    assert schedules({**pod(schedulerName="default-scheduler"), "status": {"phase": "Pending"}})
    assert not schedules(pod(nodeName="other"))
    assert not schedules(pod(schedulerName="kueue-scheduler"))
    assert not schedules(pod(schedulingGates=[{"name": "wait"}]))
    assert not schedules({**pod(), "metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"}})
