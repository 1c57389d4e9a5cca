"""GemmaServe against the real operator: waiting for its fine-tune, deploying, rolling to a new output."""

from gemma_operator.children import merge, serving, training
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from tests.support.builders import finetune, serve
from tests.support.operator import settled

NS = "default"


async def finish_fine_tune(cluster, b):
    p = plan_finetune(b.name, NS, b.spec, OperatorSettings())
    train_name, merge_name = training.names(p)[0], merge.name(p)
    await cluster.job(NS, train_name)
    await cluster.job_running(NS, train_name)
    await cluster.job_succeeded(
        NS, train_name, {"status": "succeeded", "step": 100, "checkpoint": f"{p.run_dir}/checkpoints/100"}
    )
    await cluster.job(NS, merge_name)
    await cluster.job_succeeded(NS, merge_name, {"status": "succeeded", "output": p.merged_dir}, container="merge")
    await cluster.phase("GemmaFineTune", NS, b.name, "Succeeded")
    return p


async def deployment_model(cluster, name):
    dep = await cluster.get("Deployment", NS, name)
    return (
        dep
        and dep["spec"]["template"]["metadata"]["annotations"][
            serving.REVISION_ANNOTATION.replace("revision", "model-uri")
        ]
    )


async def test_serve_waits_deploys_and_rolls_to_a_new_output(operator, cluster):
    ft = finetune("ft").tpu("v5p")
    await cluster.apply(serve("chat").fine_tune("ft").obj())
    gsv = await cluster.phase("GemmaServe", NS, "chat", "WaitingForModel")
    assert "GemmaFineTune ft not found" in gsv["status"]["message"]

    await cluster.apply(ft.obj())
    gsv = await cluster.wait_for(
        lambda: _message_has(cluster, "waiting for GemmaFineTune ft (Pending"), message="waiting on ft"
    )
    assert await cluster.get("Deployment", NS, "chat-vllm") is None, "nothing is deployed before the model exists"

    p1 = await finish_fine_tune(cluster, ft)
    dep = await cluster.wait_for(lambda: cluster.get("Deployment", NS, "chat-vllm"), message="Deployment")
    await cluster.wait_for(lambda: cluster.get("Service", NS, "chat-vllm"), message="Service")
    assert await deployment_model(cluster, "chat-vllm") == p1.merged_dir
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    await cluster.phase("GemmaServe", NS, "chat", "Deploying")
    await cluster.deployment_ready(NS, "chat-vllm")
    gsv = await cluster.phase("GemmaServe", NS, "chat", "Ready")
    st = gsv["status"]
    assert st["modelUri"] == p1.merged_dir and st["readyReplicas"] == 1 and st["servedModelName"] == "chat"
    assert st["endpoint"] == "http://chat-vllm.default.svc:8000/v1" and st["revision"]

    # The fine-tune re-runs: the old output keeps being served until the new one is merged.
    await cluster.kube.patch("GemmaFineTune", NS, "ft", {"spec": {"training": {"steps": 200}}})
    await cluster.phase("GemmaFineTune", NS, "ft", "Pending")
    gsv = await cluster.wait_for(lambda: _model_ready_reason(cluster, "PreviousOutput"), message="PreviousOutput")
    assert gsv["status"]["phase"] == "Ready" and gsv["status"]["modelUri"] == p1.merged_dir
    await settled(cluster, operator, "GemmaServe", NS, "chat")
    assert await deployment_model(cluster, "chat-vllm") == p1.merged_dir

    p2 = await finish_fine_tune(cluster, finetune("ft").tpu("v5p").training(steps=200))
    assert p2.merged_dir != p1.merged_dir
    await cluster.wait_for(lambda: _model_is(cluster, p2.merged_dir), message="rolled to the new output")
    await cluster.phase("GemmaServe", NS, "chat", "Deploying")
    await cluster.deployment_ready(NS, "chat-vllm")
    gsv = await cluster.phase("GemmaServe", NS, "chat", "Ready")
    assert gsv["status"]["modelUri"] == p2.merged_dir and gsv["status"]["revision"] != st["revision"]


async def _message_has(cluster, text):
    gsv = await cluster.get("GemmaServe", NS, "chat")
    return gsv if text in ((gsv or {}).get("status") or {}).get("message", "") else None


async def _model_ready_reason(cluster, reason):
    gsv = await cluster.get("GemmaServe", NS, "chat")
    cond = next((c for c in gsv["status"]["conditions"] if c["type"] == "ModelReady"), {})
    return gsv if cond.get("reason") == reason else None


async def _model_is(cluster, uri):
    return await deployment_model(cluster, "chat-vllm") == uri


async def test_serve_with_a_uri_and_an_invalid_one(operator, cluster):
    await cluster.apply(serve("direct").obj())
    await cluster.wait_for(lambda: cluster.get("Deployment", NS, "direct-vllm"), message="Deployment")
    bad = serve("bad").tpu("v6e", "1x1").set("model", {"hfRepo": "google/gemma-4-31B-it"}).obj()
    await cluster.apply(bad)
    gsv = await cluster.phase("GemmaServe", NS, "bad", "Failed")
    assert "gemma4-31b does not fit v6e-1 (1x1) for serving" in gsv["status"]["message"]
    assert await cluster.get("Deployment", NS, "bad-vllm") is None


async def test_a_rollout_that_never_gets_ready_is_reported(operator, cluster):
    await cluster.apply(serve("stuck").obj())
    dep = await cluster.wait_for(lambda: cluster.get("Deployment", NS, "stuck-vllm"), message="Deployment")
    await cluster.kube.patch(
        "Deployment",
        NS,
        "stuck-vllm",
        {
            "status": {
                "observedGeneration": dep["metadata"]["generation"],
                "replicas": 1,
                "readyReplicas": 0,
                "updatedReplicas": 1,
                "conditions": [
                    {
                        "type": "Progressing",
                        "status": "False",
                        "reason": "ProgressDeadlineExceeded",
                        "message": 'ReplicaSet "stuck-vllm-1" has timed out progressing.',
                    }
                ],
            }
        },
        status=True,
    )
    gsv = await cluster.phase("GemmaServe", NS, "stuck", "Failed")
    cond = next(c for c in gsv["status"]["conditions"] if c["type"] == "Progressing")
    assert cond["status"] == "False" and cond["reason"] == "ProgressDeadlineExceeded"


async def test_multi_host_serving_and_autoscaling_changes(operator, cluster):
    b = serve("big").tpu("v6e", "4x4").set("autoscaling", {"maxReplicas": 3})
    await cluster.apply(b.obj())
    lws = await cluster.wait_for(lambda: cluster.get("LeaderWorkerSet", NS, "big-vllm"), message="LWS")
    await cluster.wait_for(
        lambda: cluster.get("HorizontalPodAutoscaler", NS, "big-vllm"), message="HPA"
    )  # created after the LWS
    await cluster.kube.patch(
        "LeaderWorkerSet",
        NS,
        "big-vllm",
        {"status": {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}},
        status=True,
    )
    gsv = await cluster.phase("GemmaServe", NS, "big", "Ready")
    assert gsv["status"]["readyReplicas"] == 1 and lws["spec"]["leaderWorkerTemplate"]["size"] == 4

    await cluster.kube.patch("GemmaServe", NS, "big", {"spec": {"autoscaling": None, "replicas": 2}})
    await cluster.wait_for(lambda: _absent(cluster, "HorizontalPodAutoscaler", "big-vllm"), message="HPA removed")
    lws = await cluster.wait_for(lambda: _replicas(cluster, 2), message="replicas back under the spec")
    gsv = await cluster.phase("GemmaServe", NS, "big", "Deploying")
    assert gsv["status"]["replicas"] == 2


async def _absent(cluster, kind, name):
    return await cluster.get(kind, NS, name) is None


async def _replicas(cluster, n):
    lws = await cluster.get("LeaderWorkerSet", NS, "big-vllm")
    return lws if lws["spec"].get("replicas") == n else None


async def test_changing_shape_autoscaling_and_monitoring_replaces_what_changed(operator, cluster):
    b = serve("flex").set("autoscaling", {"maxReplicas": 2}).set("metrics", {"podMonitor": True})
    await cluster.apply(b.obj())
    await cluster.wait_for(lambda: cluster.get("Deployment", NS, "flex-vllm"), message="Deployment")
    await cluster.wait_for(lambda: cluster.get("PodMonitor", NS, "flex-vllm"), message="PodMonitor")
    hpa = await cluster.wait_for(lambda: cluster.get("HorizontalPodAutoscaler", NS, "flex-vllm"), message="HPA")
    assert hpa["spec"]["maxReplicas"] == 2

    await cluster.kube.patch("GemmaServe", NS, "flex", {"spec": {"autoscaling": {"maxReplicas": 3}}})
    await cluster.wait_for(lambda: _hpa_max(cluster, 3), message="HPA updated")

    await cluster.kube.patch("GemmaServe", NS, "flex", {"spec": {"tpu": {"topology": "4x4"}}})  # one slice: 4 hosts
    await cluster.wait_for(lambda: cluster.get("LeaderWorkerSet", NS, "flex-vllm"), message="LWS")
    await cluster.wait_for(lambda: _absent(cluster, "Deployment", "flex-vllm"), message="Deployment replaced")
    await cluster.wait_for(lambda: _leaders_monitored(cluster), message="PodMonitor follows the leaders")
    assert (await cluster.get("HorizontalPodAutoscaler", NS, "flex-vllm"))["spec"]["scaleTargetRef"][
        "kind"
    ] == "LeaderWorkerSet"

    await cluster.kube.patch(
        "GemmaServe", NS, "flex", {"spec": {"tpu": {"topology": "2x4"}, "metrics": {"podMonitor": False}}}
    )
    await cluster.wait_for(lambda: cluster.get("Deployment", NS, "flex-vllm"), message="back to a Deployment")
    await cluster.wait_for(lambda: _absent(cluster, "LeaderWorkerSet", "flex-vllm"), message="LWS removed")
    await cluster.wait_for(lambda: _absent(cluster, "PodMonitor", "flex-vllm"), message="PodMonitor removed")


async def _hpa_max(cluster, n):
    hpa = await cluster.get("HorizontalPodAutoscaler", NS, "flex-vllm")
    return hpa["spec"]["maxReplicas"] == n


async def _leaders_monitored(cluster):
    pm = await cluster.get("PodMonitor", NS, "flex-vllm")
    return pm["spec"]["selector"]["matchLabels"].get("gemma-tpu.dev/role") == "leader"
