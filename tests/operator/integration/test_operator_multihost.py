"""A multi-host fine-tune through the real operator: its JobSet is created, suspended, replaced."""

from gemma_operator.children import training
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune

NS = "default"


def workload_name(b) -> str:
    return training.names(plan_finetune(b.name, NS, b.spec, OperatorSettings()))[0]


async def test_multi_host_jobset_is_suspended_and_replaced_by_a_new_run(operator, cluster):
    b = finetune("wide").tpu("v5p", "2x2x2")
    first = workload_name(b)
    await cluster.apply(b.obj())
    jobset = await cluster.wait_for(lambda: cluster.get("JobSet", NS, first), message="JobSet")
    assert jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] == 2
    assert await cluster.get("Job", NS, first) is None, "a multi-host slice is a JobSet, not a Job"

    await cluster.kube.patch("GemmaFineTune", NS, "wide", {"spec": {"suspend": True}})
    await cluster.wait_for(lambda: _suspended(cluster, first), message="JobSet suspended")
    await cluster.phase("GemmaFineTune", NS, "wide", "Suspended")

    await cluster.kube.patch("GemmaFineTune", NS, "wide", {"spec": {"suspend": False, "training": {"steps": 200}}})
    second = workload_name(finetune("wide").tpu("v5p", "2x2x2").training(steps=200))
    await cluster.wait_for(lambda: cluster.get("JobSet", NS, second), message="the new run's JobSet")
    await cluster.wait_for(lambda: _gone(cluster, first), message="the old run's JobSet deleted")


async def _suspended(cluster, name):
    return (await cluster.get("JobSet", NS, name))["spec"].get("suspend") is True


async def _gone(cluster, name):
    return await cluster.get("JobSet", NS, name) is None
