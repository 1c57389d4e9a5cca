"""Children changed behind the operator's back are brought back to what it rendered."""

import json

from gemma_operator.children import merge, training
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune, serve

NS = "default"


async def test_a_lost_merge_job_comes_back_with_its_config_as_rendered(operator, cluster):
    b = finetune("ft").tpu("v5p")
    p = await finish_fine_tune_until_merging(cluster, b)
    name = merge.name(p)
    want = (await cluster.get("ConfigMap", NS, name))["data"]
    await cluster.kube.patch("ConfigMap", NS, name, {"data": {"merge.json": "{}"}})
    await cluster.kube.delete("Job", NS, name)
    await cluster.job(NS, name)
    await cluster.wait_for(lambda: _data_is(cluster, name, want), message="merge config restored")
    assert json.loads(want["merge.json"])["step"] == 100


async def finish_fine_tune_until_merging(cluster, b):
    """Train to success and stop while merging (finish_fine_tune would finish the merge too)."""
    p = plan_finetune(b.name, NS, b.spec, OperatorSettings())
    train = training.names(p)[0]
    await cluster.apply(b.obj())
    await cluster.job(NS, train)
    await cluster.job_running(NS, train)
    await cluster.job_succeeded(
        NS, train, {"status": "succeeded", "step": 100, "checkpoint": f"{p.run_dir}/checkpoints/100"}
    )
    await cluster.job(NS, merge.name(p))
    await cluster.phase("GemmaFineTune", NS, b.name, "Merging")
    return p


async def _data_is(cluster, name, data):
    return (await cluster.get("ConfigMap", NS, name))["data"] == data


async def test_a_service_that_lost_its_labels_gets_them_back(operator, cluster):
    await cluster.apply(serve("chat").obj())
    svc = await cluster.wait_for(lambda: cluster.get("Service", NS, "chat-vllm"), message="Service")
    labels = svc["metadata"]["labels"]
    await cluster.kube.patch("Service", NS, "chat-vllm", {"metadata": {"labels": {k: None for k in labels}}})
    await cluster.wait_for(lambda: _labels_are(cluster, labels), message="Service labels restored")


async def _labels_are(cluster, labels):
    return (await cluster.get("Service", NS, "chat-vllm"))["metadata"].get("labels") == labels


async def test_a_running_job_and_its_config_changed_by_others_are_put_back(operator, cluster):
    b = finetune("ft").tpu("v5p")
    train = training.names(plan_finetune(b.name, NS, b.spec, OperatorSettings()))[0]
    await cluster.apply(b.obj())
    job = await cluster.job(NS, train)
    await cluster.job_running(NS, train)
    await cluster.phase("GemmaFineTune", NS, "ft", "Training")
    labels = job["metadata"]["labels"]
    want = (await cluster.get("ConfigMap", NS, train))["data"]
    # Its watch follows the Job by its controller ownerReference: a Job without the label still wakes it.
    await cluster.kube.patch("Job", NS, train, {"metadata": {"labels": {"app.kubernetes.io/managed-by": None}}})
    await cluster.wait_for(lambda: _job_labels_are(cluster, train, labels), message="the Job's labels restored")
    await cluster.kube.patch("ConfigMap", NS, train, {"data": {"train.json": "{}"}})
    await cluster.wait_for(lambda: _data_is(cluster, train, want), message="the training config restored")
    assert (await cluster.get("GemmaFineTune", NS, "ft"))["status"]["attempt"] == 1, "nothing was re-run"


async def _job_labels_are(cluster, name, labels):
    return (await cluster.get("Job", NS, name))["metadata"].get("labels") == labels
