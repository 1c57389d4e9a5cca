"""The local node agent plays the Job controller, the Deployment controller and the kubelet."""

import asyncio
import json
import sys
from pathlib import Path

import pytest
import pytest_asyncio

from gemma_devcluster.agent import NodeAgent
from gemma_devcluster.client import NodeKube
from gemma_devcluster.controllers import failure_action
from gemma_devcluster.kubelet import Node
from gemma_devcluster.volumes import Mounts, VolumeError, materialize
from gemma_operator.failure_policy import job_pod_failure_policy
from tests.support.cluster import Cluster

NS = "default"
IMAGE = "local/python"


@pytest_asyncio.fixture
async def node(apiserver, tmp_path):
    kube = NodeKube.local(str(apiserver.url))
    agent = NodeAgent(
        kube,
        apiserver,
        Node(tmp_path / "node", {IMAGE: Path(sys.executable).parent}, {"data": tmp_path / "pvc"}),
        interval=0.05,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    yield agent
    stop.set()
    await task


def job(name, script, *, backoff=2, policy=True, extra=None):
    container = {
        "name": "trainer",
        "image": IMAGE,
        "command": ["python", "-c", script],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        **(extra or {}),
    }
    spec = {"backoffLimit": backoff, "template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}
    if policy:
        spec["podFailurePolicy"] = job_pod_failure_policy("trainer")
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NS}, "spec": spec}


async def job_done(cluster, name, timeout=20):
    async def done():
        j = await cluster.get("Job", NS, name)
        return (
            j
            if any(
                c["type"] in ("Complete", "Failed") and c["status"] == "True"
                for c in (j.get("status") or {}).get("conditions") or []
            )
            else None
        )

    return await cluster.wait_for(done, timeout, f"Job {name} finished")


async def pods_of(cluster, name):
    return await cluster.kube.list("Pod", NS, f"batch.kubernetes.io/job-name={name}")


async def test_a_job_succeeds_with_its_termination_message_and_logs(apiserver, node):
    cluster = Cluster(apiserver)
    await cluster.kube.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cfg", "namespace": NS},
            "data": {"c.json": json.dumps({"out": "/data/result.txt", "log": "/dev/termination-log"})},
        }
    )
    script = (
        "import json; c = json.load(open('/etc/cfg/c.json')); open(c['out'], 'w').write('done'); "
        "print('step 1, wrote', c['out'], flush=True); "
        "open(c['log'], 'w').write(json.dumps({'status': 'succeeded', 'step': 1, 'output': c['out']}))"
    )
    j = job(
        "ok",
        script,
        extra={"volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg"}, {"name": "data", "mountPath": "/data"}]},
    )
    j["spec"]["template"]["spec"]["volumes"] = [
        {"name": "cfg", "configMap": {"name": "cfg"}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
    ]
    await cluster.apply(j)
    done = await job_done(cluster, "ok")
    assert done["status"]["succeeded"] == 1 and done["status"]["completionTime"]
    [pod] = await pods_of(cluster, "ok")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    # The process wrote to its local folder, and reports the path the pod sees, as in a container.
    assert terminated["exitCode"] == 0
    assert json.loads(terminated["message"]) == {"status": "succeeded", "step": 1, "output": "/data/result.txt"}
    assert (node.node.claims["data"] / "result.txt").read_text() == "done", "the PVC maps to its local folder"
    assert "step 1, wrote /data/result.txt" in apiserver.pod_logs[(NS, pod["metadata"]["name"])]


async def test_pod_failure_policy_decides_retry_or_fail(apiserver, node):
    cluster = Cluster(apiserver)
    await cluster.apply(job("bad", "import sys; print('no such file: data.jsonl'); sys.exit(2)"))
    failed = await job_done(cluster, "bad")
    cond = next(c for c in failed["status"]["conditions"] if c["type"] == "Failed")
    assert cond["reason"] == "PodFailurePolicy" and "exit code 2 matching FailJob rule at index 2" in cond["message"]
    [pod] = await pods_of(cluster, "bad")
    assert "no such file: data.jsonl" in pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"]

    await cluster.apply(job("oom", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", backoff=1))
    failed = await job_done(cluster, "oom")
    assert next(c for c in failed["status"]["conditions"] if c["type"] == "Failed")["reason"] == "BackoffLimitExceeded"
    pods = await pods_of(cluster, "oom")
    assert len(pods) == 2 and {
        p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] for p in pods
    } == {137}


async def test_preemption_exit_is_restarted_without_counting(apiserver, node, tmp_path):
    cluster = Cluster(apiserver)
    flag = tmp_path / "preempted-once"
    script = (
        f"import os, sys, pathlib; p = pathlib.Path({str(flag)!r}); sys.exit(0 if p.exists() else (p.touch() or 42))"
    )
    await cluster.apply(job("pre", script, backoff=0))
    done = await job_done(cluster, "pre")
    assert done["status"]["succeeded"] == 1 and done["status"]["failed"] == 0
    assert len(await pods_of(cluster, "pre")) == 2


async def test_tpu_pods_are_unschedulable_and_unknown_images_do_not_pull(apiserver, node):
    cluster = Cluster(apiserver)
    await cluster.apply(job("tpu", "pass", extra={"resources": {"limits": {"google.com/tpu": "4"}}}))
    pod = await cluster.wait_for(lambda: _first_pod_with(cluster, "tpu", "conditions"), message="tpu pod status")
    cond = pod["status"]["conditions"][0]
    assert cond["status"] == "False" and "Insufficient google.com/tpu" in cond["message"]
    await cluster.apply(job("img", "pass", extra={"image": "vllm/vllm-tpu:gemma4"}))
    pod = await cluster.wait_for(lambda: _first_pod_with(cluster, "img", "containerStatuses"), message="img status")
    assert pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ErrImagePull"


async def _first_pod_with(cluster, name, field):
    pods = await pods_of(cluster, name)
    return pods[0] if pods and (pods[0].get("status") or {}).get(field) else None


async def test_suspending_a_job_stops_its_pod(apiserver, node):
    cluster = Cluster(apiserver)
    await cluster.apply(job("long", "import time; time.sleep(60)"))
    await cluster.wait_for(lambda: _running(cluster, "long"), message="running")
    await cluster.kube.patch("Job", NS, "long", {"spec": {"suspend": True}})
    await cluster.wait_for(lambda: _no_pods(cluster, "long"), message="pod deleted")
    await cluster.wait_for(lambda: _stopped(node), message="its process was stopped")


async def _running(cluster, name):
    return any((p.get("status") or {}).get("phase") == "Running" for p in await pods_of(cluster, name))


async def _stopped(node):
    return not node.pods


async def _no_pods(cluster, name):
    return not await pods_of(cluster, name)


async def test_a_deployment_gets_ready_behind_its_probe_and_rolls(apiserver, node):
    cluster = Cluster(apiserver)
    server = "import http.server, sys; http.server.HTTPServer(('127.0.0.1', int(sys.argv[1].split('=')[1])), http.server.SimpleHTTPRequestHandler).serve_forever()"
    container = {
        "name": "web",
        "image": IMAGE,
        "command": ["python", "-c", server],
        "args": ["--port=8000"],
        "ports": [{"containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/", "port": 8000}},
    }
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}, "annotations": {"rev": "1"}},
                "spec": {"containers": [container]},
            },
        },
    }
    await cluster.apply(dep)
    ready = await cluster.wait_for(lambda: _ready_deployment(cluster, "1"), timeout=20, message="ready")
    assert ready["status"]["updatedReplicas"] == 1
    [pod] = await cluster.kube.list("Pod", NS, "app=web")
    port = int(pod["metadata"]["annotations"]["gemma-tpu.dev/host-port"])
    status, _ = await asyncio.to_thread(
        lambda: (__import__("urllib.request").request.urlopen(f"http://127.0.0.1:{port}/").status, 0)
    )
    assert status == 200, "the container port is served on the pod's host port"
    await cluster.kube.patch(
        "Deployment", NS, "web", {"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}}
    )
    await cluster.wait_for(lambda: _ready_deployment(cluster, "2"), timeout=20, message="rolled")
    [pod2] = await cluster.kube.list("Pod", NS, "app=web")
    assert pod2["metadata"]["name"] != pod["metadata"]["name"] and pod2["metadata"]["annotations"]["rev"] == "2"


async def _ready_deployment(cluster, rev):
    dep = await cluster.get("Deployment", NS, "web")
    pods = await cluster.kube.list("Pod", NS, "app=web")
    ok = (
        (dep.get("status") or {}).get("readyReplicas") == 1
        and len(pods) == 1
        and pods[0]["metadata"]["annotations"]["rev"] == rev
    )
    return dep if ok and (dep["status"] or {}).get("updatedReplicas") == 1 else None


def test_failure_policy_table():
    policy = job_pod_failure_policy("trainer")

    def pod(code=None, disrupted=False):
        state = {"terminated": {"exitCode": code}} if code is not None else {}
        conds = [{"type": "DisruptionTarget", "status": "True"}] if disrupted else []
        return {"status": {"containerStatuses": [{"name": "trainer", "state": state}], "conditions": conds}}

    assert failure_action(policy, pod(42)) == ("Ignore", 1)
    assert failure_action(policy, pod(1)) == ("FailJob", 2)
    assert failure_action(policy, pod(143)) == ("Count", None)
    assert failure_action(policy, pod(disrupted=True)) == ("Ignore", 0)
    assert failure_action(None, pod(1)) == ("Count", None)


def test_mount_translation_and_missing_volumes(tmp_path):
    m = Mounts({"/data": Path("/L/d"), "/dev/termination-log": Path("/L/t")})
    assert (
        m.translate('{"a": "/data/x", "b": "/database", "c": "/x/data"} --model=/data')
        == '{"a": "/L/d/x", "b": "/database", "c": "/x/data"} --model=/L/d'
    )
    nested = Mounts({"/data": Path("/tmp/x/data"), "/tmp": Path("/L/tmp")})
    assert nested.translate("--model=/data/m /tmp/f") == "--model=/tmp/x/data/m /L/tmp/f", "one pass: no double rewrite"
    assert (
        nested.untranslate("saved /tmp/x/data/m and /L/tmp/f, not /L/tmpfoo")
        == "saved /data/m and /tmp/f, not /L/tmpfoo"
    )
    pod = {
        "spec": {
            "volumes": [
                {"name": "v", "csi": {"driver": "gcsfuse.csi.storage.gke.io"}},
                {"name": "p", "persistentVolumeClaim": {"claimName": "other"}},
            ]
        }
    }
    with pytest.raises(VolumeError, match="csi volumes are not available on the local node"):
        materialize(pod, {"volumeMounts": [{"name": "v", "mountPath": "/m"}]}, tmp_path, {}, {}, {})
    with pytest.raises(VolumeError, match='persistentvolumeclaim "other" is not provided by this node'):
        materialize(pod, {"volumeMounts": [{"name": "p", "mountPath": "/m"}]}, tmp_path, {"data": tmp_path}, {}, {})


async def test_a_crashing_server_loops_in_place_like_on_a_node(apiserver, node):
    cluster = Cluster(apiserver)
    container = {
        "name": "web",
        "image": IMAGE,
        "command": ["python", "-c", "import sys; print('bad flag'); sys.exit(3)"],
    }
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "crash", "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "crash"}},
            "template": {"metadata": {"labels": {"app": "crash"}}, "spec": {"containers": [container]}},
        },
    }
    await cluster.apply(dep)

    async def looping():
        pods = await cluster.kube.list("Pod", NS, "app=crash")
        cs = ((pods[0].get("status") or {}).get("containerStatuses") or [{}])[0] if pods else {}
        return pods if cs.get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff" else None

    pods = await cluster.wait_for(looping, timeout=20, message="CrashLoopBackOff")
    await asyncio.sleep(0.5)
    assert len(await cluster.kube.list("Pod", NS, "app=crash")) == 1, "the pod is not replaced, it restarts in place"
    cs = pods[0]["status"]["containerStatuses"][0]
    assert pods[0]["status"]["phase"] == "Running" and cs["lastState"]["terminated"]["exitCode"] == 3
