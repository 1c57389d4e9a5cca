"""The local node agent on both API servers: the in-process one, where it also plays the Job and
Deployment controllers, and a real kube-apiserver 1.36 with the real controllers, where it is only the
node (its scheduler and kubelet).

Each test runs the same workload on both and checks what the operator and the demo rely on: the
pods bound to the node, run, and finished with their exit code and termination message; the Job's
and Deployment's status as the controllers write it (conditions, reasons, messages, counts); the
FailedCreate Event of a refused pod; the scheduler's words for a pod asking for TPUs; pod logs through
the API; deletion finalised as a kubelet does. Where the imitation and the real controllers differ
in what these tests see, one of the two is wrong.
"""

from __future__ import annotations

import json
import re
import urllib.request
import uuid
from dataclasses import dataclass

import pytest
import pytest_asyncio

from gemma_devcluster import node_status, scheduling
from gemma_devcluster.agent import NodeAgent
from gemma_devcluster.client import NodeKube
from gemma_operator import pod_creation
from gemma_operator.failure_policy import job_outcome
from tests.support.cluster import wait_for
from tests.support.node import IMAGE, deployment, finished, job, local_node, running
from tests.support.operator import api_server

IN_PROCESS, REAL = "in-process", "real"


@dataclass
class Backend:
    name: str
    kube: NodeKube  # the test's own client (the admin's on the real server)
    agent: NodeAgent
    namespace: str

    async def job_done(self, name: str, timeout: float = 60) -> dict:
        async def done():
            return finished(await self.kube.get("Job", self.namespace, name))

        return await wait_for(done, timeout, f"Job {name} finished on {self.name}")

    async def pods(self, selector: str) -> list[dict]:
        return await self.kube.list("Pod", self.namespace, selector)

    async def job_pods(self, name: str) -> list[dict]:
        return await self.pods(f"batch.kubernetes.io/job-name={name}")


@pytest_asyncio.fixture(params=[IN_PROCESS, pytest.param(REAL, marks=pytest.mark.control_plane)])
async def backend(request, tmp_path):
    node = local_node(tmp_path)
    if request.param == IN_PROCESS:
        async with api_server() as api:
            namespace = f"t-{uuid.uuid4().hex[:10]}"  # namespaces spring into being here
            agent = NodeAgent(NodeKube.local(str(api.url)), api, node, interval=0.05)
            async with running(agent):
                yield Backend(IN_PROCESS, NodeKube.local(str(api.url), user_agent="gemma-tpu-tests"), agent, namespace)
        return
    plane = request.getfixturevalue("control_plane")
    namespace = request.getfixturevalue("namespace")
    kube = NodeKube.from_kubeconfig(plane.kubeconfig)
    # A node of its own per test, placing only this test's pods: other tests share the server.
    agent = NodeAgent(kube, None, node, interval=0.1, name=f"node-{namespace}", namespaces=[namespace])
    async with running(agent):
        yield Backend(REAL, NodeKube.from_kubeconfig(plane.kubeconfig, "gemma-tpu-tests"), agent, namespace)


def terminated(pod: dict) -> dict:
    return pod["status"]["containerStatuses"][0]["state"]["terminated"]


def condition(obj: dict, type_: str) -> dict:
    return next(c for c in obj["status"]["conditions"] if c["type"] == type_)


async def test_the_node_is_registered_with_its_lease_and_no_tpu(backend):
    node = await backend.kube.get_cluster_scoped("Node", backend.agent.name)
    assert condition(node, "Ready")["status"] == "True" and condition(node, "Ready")["reason"] == "KubeletReady"
    assert "google.com/tpu" not in node["status"]["allocatable"]
    assert int(node["status"]["allocatable"]["cpu"]) >= 1 and node["status"]["allocatable"]["memory"].endswith("Ki")
    # The API server's admission taints a new Node not-ready; a Ready node carries no such taint.
    assert node_status.NOT_READY_TAINT not in {t["key"] for t in (node.get("spec") or {}).get("taints") or []}
    lease = await backend.kube.get("Lease", node_status.LEASE_NAMESPACE, backend.agent.name)
    assert lease["spec"]["holderIdentity"] == backend.agent.name
    assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]


async def test_a_job_pod_is_bound_runs_and_reports_its_result_and_log(backend):
    script = (
        "import json; print('step 1 of 1', flush=True); "
        "open('/dev/termination-log', 'w').write(json.dumps({'status': 'succeeded', 'step': 1}))"
    )
    await backend.kube.create(job("ok", script, namespace=backend.namespace))
    done = await backend.job_done("ok")
    assert job_outcome(done).state == "Succeeded" and done["status"]["succeeded"] == 1
    # The Job controller's conditions (pkg/controller/job: SuccessCriteriaMet, then Complete).
    assert (
        condition(done, "Complete")["reason"] == condition(done, "SuccessCriteriaMet")["reason"] == "CompletionsReached"
    )
    [pod] = await backend.job_pods("ok")
    assert pod["metadata"]["name"].startswith("ok-") and pod["spec"]["nodeName"] == backend.agent.name
    labels = pod["metadata"]["labels"]
    assert labels["batch.kubernetes.io/controller-uid"] == done["metadata"]["uid"]
    assert "batch.kubernetes.io/job-completion-index" not in labels, "a NonIndexed Job's pod has no index"
    assert pod["status"]["phase"] == "Succeeded"
    assert terminated(pod)["exitCode"] == 0 and terminated(pod)["reason"] == "Completed"
    assert json.loads(terminated(pod)["message"]) == {"status": "succeeded", "step": 1}
    assert condition(pod, "PodScheduled")["status"] == "True", "the binding's condition is kept"
    assert condition(pod, "Ready")["status"] == "False" and condition(pod, "Ready")["reason"] == "PodCompleted"
    assert pod["status"]["podIP"] == pod["status"]["hostIP"] == node_status.ADDRESS and pod["status"]["startTime"]
    # What `kubectl logs` reads: on a real server the API server fetches it from the node's kubelet endpoint.
    log = await backend.kube.pod_log(backend.namespace, pod["metadata"]["name"], "trainer", 5)
    assert log == "step 1 of 1\n"


async def test_the_pod_failure_policy_fails_the_job_with_the_controllers_message(backend):
    await backend.kube.create(job("bad", "import sys; sys.exit(2)", namespace=backend.namespace))
    failed = await backend.job_done("bad")
    [pod] = await backend.job_pods("bad")
    ns, name = backend.namespace, pod["metadata"]["name"]
    outcome = job_outcome(failed)
    # pkg/controller/job/pod_failure_policy.go: the message of a FailJob rule, read by the operator.
    assert (outcome.state, outcome.reason) == ("Failed", "PodFailurePolicy")
    assert (
        outcome.message
        == f"Container trainer for pod {ns}/{name} failed with exit code 2 matching FailJob rule at index 2"
    )
    assert terminated(pod)["exitCode"] == 2 and pod["status"]["phase"] == "Failed"


async def test_preemption_exits_are_retried_uncounted_and_kills_count_against_the_backoff_limit(backend, tmp_path):
    flag = tmp_path / "preempted-once"
    once = f"import pathlib, sys; p = pathlib.Path({str(flag)!r}); sys.exit(0 if p.exists() else (p.touch() or 42))"
    await backend.kube.create(job("pre", once, namespace=backend.namespace, backoff=0))
    done = await backend.job_done("pre")
    assert job_outcome(done).state == "Succeeded" and job_outcome(done).restarts == 0, done["status"]
    assert sorted(terminated(p)["exitCode"] for p in await backend.job_pods("pre")) == [0, 42]

    kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    await backend.kube.create(job("oom", kill, namespace=backend.namespace, backoff=1))
    failed = await backend.job_done("oom", timeout=90)  # the real controller waits 10 s before a retry
    assert (job_outcome(failed).state, job_outcome(failed).reason) == ("Failed", "BackoffLimitExceeded")
    assert [terminated(p)["exitCode"] for p in await backend.job_pods("oom")] == [137, 137]


async def test_tpu_pods_stay_pending_with_the_schedulers_reason(backend):
    tpu = {"resources": {"limits": {"google.com/tpu": "4"}}}
    await backend.kube.create(job("chips", "pass", namespace=backend.namespace, extra=tpu))
    pool = job("pool", "pass", namespace=backend.namespace)
    pool["spec"]["template"]["spec"]["nodeSelector"] = {"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice"}
    await backend.kube.create(pool)

    async def unschedulable(name):
        pods = await backend.job_pods(name)
        conditions = (pods[0].get("status") or {}).get("conditions") or [] if pods else []
        return next((c for c in conditions if c["type"] == "PodScheduled" and c["status"] == "False"), None)

    # kube-scheduler's FitError (pkg/scheduler/framework/types.go) over the filter that failed first.
    chips = await wait_for(lambda: unschedulable("chips"), message="PodScheduled=False")
    assert chips["reason"] == "Unschedulable"
    assert chips["message"] == "0/1 nodes are available: 1 Insufficient google.com/tpu."
    pool_condition = await wait_for(lambda: unschedulable("pool"), message="PodScheduled=False")
    assert pool_condition["message"] == "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
    [pod] = await backend.job_pods("chips")
    assert not pod["spec"].get("nodeName") and pod["status"]["phase"] == "Pending"
    assert scheduling.fit_error(pod, await backend.kube.get_cluster_scoped("Node", backend.agent.name))


async def test_a_deployment_gets_ready_behind_its_probe_and_rolls_to_a_new_pod(backend):
    serve = (
        "import http.server, sys; port = int(sys.argv[1].split('=')[1]); "
        "http.server.HTTPServer(('127.0.0.1', port), http.server.SimpleHTTPRequestHandler).serve_forever()"
    )
    container = {
        "name": "web",
        "image": IMAGE,
        "command": ["python", "-c", serve],
        "args": ["--port=8000"],
        "ports": [{"containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/", "port": 8000}, "periodSeconds": 1},
    }
    await backend.kube.create(deployment("web", container, namespace=backend.namespace, annotations={"rev": "1"}))

    async def ready(rev):
        dep = await backend.kube.get("Deployment", backend.namespace, "web")
        pods = [p for p in await backend.pods("app=web") if not p["metadata"].get("deletionTimestamp")]
        st = (dep or {}).get("status") or {}
        settled = st.get("readyReplicas") == st.get("updatedReplicas") == st.get("availableReplicas") == 1
        current = len(pods) == 1 and pods[0]["metadata"]["annotations"]["rev"] == rev and st.get("replicas") == 1
        return (dep, pods[0]) if settled and current else None

    dep, pod = await wait_for(lambda: ready("1"), message="Deployment ready")
    assert condition(dep, "Available")["status"] == "True"
    # A ReplicaSet's pod: <deployment>-<pod-template-hash>-<random> (pkg/controller/replicaset).
    assert pod["metadata"]["name"].startswith(f"web-{pod['metadata']['labels']['pod-template-hash']}-")
    assert pod["spec"]["nodeName"] == backend.agent.name
    port = int(pod["metadata"]["annotations"]["gemma-tpu.dev/host-port"])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as response:
        assert response.status == 200, "the container port is served on the pod's host port"
    await backend.kube.patch(
        "Deployment", backend.namespace, "web", {"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}}
    )
    _, new = await wait_for(lambda: ready("2"), message="rolled to the new template")
    assert new["metadata"]["name"] != pod["metadata"]["name"]
    await wait_for(lambda: _gone(backend, pod), message="the old pod finalised")


async def _gone(backend: Backend, pod: dict) -> bool:
    still = await backend.kube.get("Pod", backend.namespace, pod["metadata"]["name"])
    return still is None and backend.agent.local_pod(backend.namespace, pod["metadata"]["name"]) is None


async def test_a_suspended_job_has_its_pod_stopped_and_deleted(backend):
    await backend.kube.create(job("long", "import time; time.sleep(600)", namespace=backend.namespace))

    async def running_pod():
        pods = await backend.job_pods("long")
        return pods[0] if pods and (pods[0].get("status") or {}).get("phase") == "Running" else None

    pod = await wait_for(running_pod, message="the pod running")
    local = backend.agent.local_pod(backend.namespace, pod["metadata"]["name"])
    await backend.kube.patch("Job", backend.namespace, "long", {"spec": {"suspend": True}})
    await wait_for(lambda: _gone(backend, pod), message="the pod deleted")
    assert local is not None and local.exit_code() == 143, "its process was stopped by SIGTERM (128 + 15)"


async def test_refused_pods_are_reported_as_the_controllers_report_them(backend):
    refused = job("nosa", "pass", namespace=backend.namespace)
    refused["spec"]["template"]["spec"]["serviceAccountName"] = "missing"
    created = await backend.kube.create(refused)

    async def read():
        events = await backend.kube.list(
            "Event", backend.namespace, field_selector=f"reason={pod_creation.FAILED_CREATE},type=Warning"
        )
        current = await backend.kube.get("Job", backend.namespace, "nosa")
        return pod_creation.refusal(current, await backend.job_pods("nosa"), events)

    found = await wait_for(read, message="the FailedCreate Event")
    # ServiceAccount admission's words, repeated by the Job controller (controller_utils.go, FailedCreate).
    assert (found.kind, found.name) == ("Job", created["metadata"]["name"])
    assert found.message == (
        f'pods "nosa-" is forbidden: error looking up service account {backend.namespace}/missing: '
        'serviceaccount "missing" not found'
    )
    assert found.hint and f"create ServiceAccount {backend.namespace}/missing" in found.hint

    container = {"name": "web", "image": IMAGE, "command": ["python", "-c", "pass"]}
    refused_server = deployment("nosa-web", container, namespace=backend.namespace)
    refused_server["spec"]["template"]["spec"]["serviceAccountName"] = "missing"
    await backend.kube.create(refused_server)

    async def replica_failure():
        current = await backend.kube.get("Deployment", backend.namespace, "nosa-web")
        return pod_creation.refusal(current, [], [])

    # The ReplicaSet's ReplicaFailure condition, which the deployment controller copies (deployment/sync.go).
    found = await wait_for(replica_failure, message="the Deployment's ReplicaFailure condition")
    assert (found.kind, found.name) == ("Deployment", "nosa-web")
    assert re.fullmatch(
        f'pods "nosa-web-[0-9a-z]+-" is forbidden: error looking up service account {backend.namespace}/missing: '
        'serviceaccount "missing" not found',
        found.message,
    ), found.message


async def test_a_crashing_server_restarts_in_place_and_an_unknown_image_does_not_pull(backend):
    crash = {"name": "web", "image": IMAGE, "command": ["python", "-c", "import sys; print('bad flag'); sys.exit(3)"]}
    await backend.kube.create(deployment("crash", crash, namespace=backend.namespace))

    async def looping():
        pods = await backend.pods("app=crash")
        statuses = (pods[0].get("status") or {}).get("containerStatuses") or [{}] if pods else [{}]
        return pods if statuses[0].get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff" else None

    [pod] = await wait_for(looping, message="CrashLoopBackOff")
    status = pod["status"]["containerStatuses"][0]
    assert pod["status"]["phase"] == "Running" and status["lastState"]["terminated"]["exitCode"] == 3
    assert [p["metadata"]["uid"] for p in await backend.pods("app=crash")] == [pod["metadata"]["uid"]], (
        "the pod restarts in place, it is not replaced"
    )

    await backend.kube.create(job("img", "pass", namespace=backend.namespace, extra={"image": "vllm/vllm-tpu:gemma4"}))

    async def waiting():
        pods = await backend.job_pods("img")
        statuses = (pods[0].get("status") or {}).get("containerStatuses") if pods else None
        return statuses[0]["state"].get("waiting") if statuses else None

    assert (await wait_for(waiting, message="a waiting container"))["reason"] == "ErrImagePull"
