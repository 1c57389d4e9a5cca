"""Add-ons a cluster may lack or have too old, against the real operator: a condition naming the
fix, never a create retried forever; the resource moves on once the add-on is installed."""

from __future__ import annotations

from gemma_operator import prometheus_metrics
from gemma_operator.children import serving, training
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune, serve
from tests.support.operator import settled

NS = "default"
JOBSET = ("jobset.x-k8s.io/v1alpha2", "jobsets", "JobSet")
LWS = ("leaderworkerset.x-k8s.io/v1", "leaderworkersets", "LeaderWorkerSet")
PODMONITOR = ("monitoring.coreos.com/v1", "podmonitors")


def jobset_schema(message_patterns: bool) -> dict:
    """Enough of JobSet's CRD schema to tell its version: onJobFailureMessagePatterns came with
    v0.10.0 (kubernetes-sigs/jobset#1033, api/jobset/v1alpha2/jobset_types.go FailurePolicyRule)."""
    rule = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "action": {"type": "string"},
            "onJobFailureReasons": {"type": "array", "items": {"type": "string"}},
        },
    }
    if message_patterns:
        rule["properties"]["onJobFailureMessagePatterns"] = {"type": "array", "items": {"type": "string"}}
    rules = {"rules": {"type": "array", "items": rule}}
    spec = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {"failurePolicy": {"type": "object", "properties": rules}},
    }
    return {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {"spec": spec}}


async def dependency(cluster, kind: str, name: str, status: str, has: str = "", lacks: str | None = None) -> dict:
    """Wait for DependencyMissing=`status` whose message names `has` and no longer names `lacks`."""

    async def check():
        obj = await cluster.get(kind, NS, name)
        conds = {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions") or []}
        c = conds.get("DependencyMissing") or {}
        text = c.get("message", "")
        return obj if c.get("status") == status and has in text and not (lacks and lacks in text) else None

    return await cluster.wait_for(check, message=f"{kind} {name} DependencyMissing={status} {has!r} without {lacks!r}")


async def warnings(cluster, reason: str) -> list[dict]:
    return [e for e in await cluster.kube.list("Event", NS) if e["reason"] == reason]


def errors(kind: str) -> float:
    return prometheus_metrics.RECONCILES.labels(kind, "error")._value.get()


async def test_a_missing_or_old_jobset_holds_multi_host_training_with_a_condition(apiserver, cluster, operator):
    apiserver.unregister(*JOBSET[:2])
    failed_before = errors("GemmaFineTune")
    b = finetune("big").tpu("v5p", "2x2x2")
    name = training.names(plan_finetune(b.name, NS, b.spec, OperatorSettings()))[0]
    await cluster.apply(b.obj())
    ft = await dependency(cluster, "GemmaFineTune", "big", "True", "JobSet >= v0.10.0 is required for multi-host")
    assert ft["status"]["phase"] == "Pending" and "not installed" in ft["status"]["message"]
    for _ in range(2):  # reconciled twice more: still one Warning, no failed reconcile
        await settled(cluster, operator, "GemmaFineTune", NS, "big")
    assert len(await warnings(cluster, "DependencyMissing")) == 1 and errors("GemmaFineTune") == failed_before

    apiserver.register(*JOBSET, subresources={"status"}, schema=jobset_schema(message_patterns=False))
    await dependency(cluster, "GemmaFineTune", "big", "True", "an older version is installed")
    assert await cluster.get("JobSet", NS, name) is None, "an old JobSet would restart application errors forever"

    apiserver.register(*JOBSET, subresources={"status"}, schema=jobset_schema(message_patterns=True))
    js = await cluster.wait_for(lambda: cluster.get("JobSet", NS, name), message="JobSet once installed")
    assert js["spec"]["failurePolicy"]["rules"][0]["onJobFailureMessagePatterns"]
    await dependency(cluster, "GemmaFineTune", "big", "False")
    assert errors("GemmaFineTune") == failed_before


async def test_serving_waits_for_lws_and_monitors_follow_what_is_installed(apiserver, cluster, operator):
    apiserver.unregister(*LWS[:2])
    apiserver.unregister(*PODMONITOR)
    b = serve("mon").tpu("v6e", "4x4").set("metrics", {"podMonitor": True, "podMonitoring": True})
    await cluster.apply(b.obj())
    gsv = await dependency(cluster, "GemmaServe", "mon", "True", "LeaderWorkerSet")
    assert gsv["status"]["phase"] == "Pending" and "prometheus-operator" in gsv["status"]["message"]
    assert await cluster.get("PodMonitoring", NS, "mon-vllm") is None, "nothing is created while the server cannot be"

    apiserver.register(*LWS, subresources={"status", "scale"})
    await cluster.wait_for(lambda: cluster.get("LeaderWorkerSet", NS, "mon-vllm"), message="LeaderWorkerSet")
    pm = await cluster.wait_for(lambda: cluster.get("PodMonitoring", NS, "mon-vllm"), message="PodMonitoring")
    assert pm["spec"]["selector"]["matchLabels"][serving.ROLE_LABEL] == "leader"
    assert pm["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s"}]
    # Until LeaderWorkerSet is seen, the condition names both add-ons; the reconcile that sees it
    # writes the PodMonitor-only condition and the phase it implies in one status write.
    gsv = await dependency(
        cluster, "GemmaServe", "mon", "True", "metrics.podMonitor: it is not installed", lacks="LeaderWorkerSet"
    )
    assert gsv["status"]["phase"] == "Deploying", "a missing PodMonitor CRD does not hold serving"

    await cluster.kube.patch("GemmaServe", NS, "mon", {"spec": {"tpu": {"topology": "2x4"}}})
    await cluster.wait_for(lambda: cluster.get("Deployment", NS, "mon-vllm"), message="Deployment")
    await cluster.wait_for(lambda: _selects_every_server(cluster), message="PodMonitoring follows the servers")

    no_monitors = {"podMonitor": False, "podMonitoring": False}
    await cluster.kube.patch("GemmaServe", NS, "mon", {"spec": {"metrics": no_monitors}})
    await cluster.wait_for(lambda: _absent(cluster, "PodMonitoring", "mon-vllm"), message="PodMonitoring removed")
    await dependency(cluster, "GemmaServe", "mon", "False")


async def _selects_every_server(cluster):
    pm = await cluster.get("PodMonitoring", NS, "mon-vllm")
    return pm and serving.ROLE_LABEL not in pm["spec"]["selector"]["matchLabels"]


async def _absent(cluster, kind, name):
    return await cluster.get(kind, NS, name) is None
