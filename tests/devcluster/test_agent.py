"""The local node agent on the in-process API, where it also plays the Job and Deployment controllers;
tests/control_plane/test_node_agent.py runs the workloads the operator relies on on both API servers."""

import json
from pathlib import Path

import pytest
import pytest_asyncio

from gemma_devcluster.agent import NodeAgent
from gemma_devcluster.client import NodeKube
from gemma_devcluster.controllers import failure_action
from gemma_devcluster.volumes import Mounts, VolumeError, materialize
from gemma_operator.failure_policy import job_pod_failure_policy
from tests.support.cluster import Cluster
from tests.support.node import finished, job, local_node, running

NS = "default"


@pytest_asyncio.fixture
async def node(apiserver, tmp_path):
    async with running(NodeAgent(NodeKube.local(str(apiserver.url)), apiserver, local_node(tmp_path), 0.05)) as agent:
        yield agent


async def job_done(cluster, name, timeout=20):
    return await cluster.wait_for(lambda: _finished(cluster, name), timeout, f"Job {name} finished")


async def _finished(cluster, name):
    return finished(await cluster.get("Job", NS, name))


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


def test_the_projected_token_volume_gets_the_files_it_can_have_here(tmp_path):
    # As kube-apiserver's ServiceAccount admission writes it, OpenShift's service CA source included.
    sources = [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"fieldRef": {"fieldPath": "metadata.namespace"}, "path": "namespace"}]}},
        {
            "configMap": {
                "name": "openshift-service-ca.crt",
                "items": [{"key": "service-ca.crt", "path": "service-ca.crt"}],
            }
        },
    ]
    pod = {
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"volumes": [{"name": "t", "projected": {"sources": sources}}]},
    }
    mount = "/var/run/secrets/kubernetes.io/serviceaccount"
    cms = {"kube-root-ca.crt": {"data": {"ca.crt": "PEM"}}}
    mounts = materialize(pod, {"volumeMounts": [{"name": "t", "mountPath": mount}]}, tmp_path, {}, cms, {})
    folder = mounts.paths[mount]
    assert {f.name: f.read_text() for f in folder.iterdir()} == {"ca.crt": "PEM", "namespace": "ml"}
    mounts = materialize(pod, {"volumeMounts": [{"name": "t", "mountPath": mount}]}, tmp_path / "b", {}, {}, {})
    assert {f.name for f in mounts.paths[mount].iterdir()} == {"namespace"}, "absent ConfigMaps are left out"
