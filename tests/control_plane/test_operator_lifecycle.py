"""The operator in its own process, under the chart's RBAC with a ServiceAccount token the API server
issued, through a fine-tune's and a serve's lifecycle on the real controllers: the operator creates the
Jobs and the Deployment, the real Job, Deployment and ReplicaSet controllers make the pods and their
status, the real garbage collector removes what a deleted CR owned. Only the kubelet's part, a pod's
phase and container states, is the test's (there is no kubelet). The in-process API's tests
(tests/operator/integration) play the controllers themselves; these hold those plays to the real ones."""

from __future__ import annotations

import json

import yaml

from gemma_operator import reasons
from tests.support.builders import finetune, serve
from tests.support.real_cluster import RealCluster

FORBIDDEN_ANSWERS = {403, 422}  # a role the chart lacks, or a write the server refuses


def owned_by(obj, kind: str) -> bool:
    return any(ref.kind == kind and ref.controller for ref in obj.metadata.owner_references or [])


def job_of(cluster: RealCluster, cr: str, seen: set[str] = frozenset()) -> str:
    """The name of a Job of the CR (the operator's), not one of `seen`."""

    def found():
        jobs = cluster.batch.list_namespaced_job(cluster.ns).items
        return next(
            (
                j.metadata.name
                for j in jobs
                if owned_by(j, "GemmaFineTune") and j.metadata.name.startswith(cr) and j.metadata.name not in seen
            ),
            None,
        )

    return cluster.wait_for(found, f"a new Job of {cr}")


def config_of(cluster: RealCluster, job: str, key: str) -> dict:
    return json.loads(cluster.core.read_namespaced_config_map(job, cluster.ns).data[key])


def pod_of(cluster: RealCluster, job: str, seen: set[str] = frozenset()):
    pod = cluster.new_pod(f"batch.kubernetes.io/job-name={job}", set(seen))
    assert owned_by(pod, "Job") and pod.metadata.name.startswith(f"{job}-"), "made by the Job controller"
    return pod


def operator_answers(plane, user: str) -> list[tuple[str, str, int]]:
    """(verb, request URI, answer code) of each request the operator made, from the server's audit log."""
    return [
        (e["verb"], e["requestURI"], e["responseStatus"]["code"])
        for e in plane.audit_events()
        if e["user"]["username"] == user and e["stage"] == "ResponseComplete"
    ]


def assert_nothing_refused(plane, user: str) -> None:
    answers = operator_answers(plane, user)
    assert answers, "the audit log shows the operator's requests"
    refused = [a for a in answers if a[2] in FORBIDDEN_ANSWERS]
    assert not refused, refused


def test_a_fine_tune_trains_merges_and_succeeds_on_the_real_job_controller(control_plane, operator, cluster):
    cluster.apply_cr(finetune("ft").cpu_tiny().obj())
    train = job_of(cluster, "ft")
    job = cluster.batch.read_namespaced_job(train, cluster.ns)
    assert owned_by(job, "GemmaFineTune")
    run_dir = config_of(cluster, train, "train.json")["output_dir"]
    cluster.phase("GemmaFineTune", "ft", "Pending")

    pod = pod_of(cluster, train)
    cluster.run(pod, ready=True)
    cluster.phase("GemmaFineTune", "ft", "Training")
    result = {
        "status": "succeeded",
        "step": 100,
        "total_steps": 100,
        "loss": 0.5,
        "checkpoint": f"{run_dir}/checkpoints/100",
    }
    cluster.finish(pod, 0, result)
    cluster.wait_for(
        lambda: any(
            c.type == "Complete" and c.status == "True"
            for c in cluster.batch.read_namespaced_job_status(train, cluster.ns).status.conditions or []
        ),
        "the Job controller to complete the training Job",
    )

    merge = job_of(cluster, "ft", {train})
    merged = config_of(cluster, merge, "merge.json")["output_dir"]
    cluster.phase("GemmaFineTune", "ft", "Merging")
    merge_pod = pod_of(cluster, merge)
    cluster.run(merge_pod)
    cluster.finish(
        merge_pod,
        0,
        {"status": "succeeded", "output": merged, "tensors_merged": 12, "bytes_written": 10, "seconds": 1.0},
    )
    ft = cluster.phase("GemmaFineTune", "ft", "Succeeded")

    assert ft["status"]["outputs"]["merged"] == merged and ft["status"]["outputs"]["step"] == 100
    assert {"Training", "Merging", "Succeeded"} <= {e.reason for e in cluster.events("ft")}
    assert_nothing_refused(control_plane, operator.user)


def test_an_edit_starts_a_new_run_a_deleted_job_comes_back_and_the_collector_cleans_up(
    control_plane, operator, cluster
):
    cluster.apply_cr(finetune("ft").cpu_tiny().obj())
    first = job_of(cluster, "ft")
    cluster.run(pod_of(cluster, first), ready=True)
    ft = cluster.phase("GemmaFineTune", "ft", "Training")
    run = ft["status"]["run"]

    # A training Job lost while it runs is a lost attempt: the next one, under its own name, resumes
    # from the latest checkpoint (lifecycle/finetune.py), and says so in an Event.
    cluster.batch.delete_namespaced_job(first, cluster.ns, propagation_policy="Background")
    again = job_of(cluster, "ft", {first})
    cluster.wait_for(lambda: reasons.TRAINING_RECREATED in {e.reason for e in cluster.events("ft")}, "the Event")
    # The Event goes out before the status that records it (a retried reconcile posts a lost one again).
    cluster.wait_for(lambda: (cluster.cr("GemmaFineTune", "ft") or {})["status"].get("attempt") == 2, "attempt 2")

    cluster.patch_cr("GemmaFineTune", "ft", {"spec": {"training": {"steps": 150}}})
    second = job_of(cluster, "ft", {first, again})
    cluster.wait_for(
        lambda: (
            (cr := cluster.cr("GemmaFineTune", "ft"))
            and cr["status"].get("run") not in (None, run)
            and cr["status"].get("observedGeneration") == 2
        ),
        "a new run in status, for generation 2",
    )
    assert config_of(cluster, second, "train.json")["steps"] == 150

    cluster.custom.delete_namespaced_custom_object("gemma-tpu.dev", "v1alpha1", cluster.ns, "gemmafinetunes", "ft")
    cluster.wait_for(lambda: cluster.cr("GemmaFineTune", "ft") is None, "the CR gone (the operator's finalizer done)")
    cluster.wait_for(
        lambda: (
            not cluster.batch.list_namespaced_job(cluster.ns).items
            and not [
                c for c in cluster.core.list_namespaced_config_map(cluster.ns).items if c.metadata.name.startswith("ft")
            ]
            and not cluster.pods("batch.kubernetes.io/job-name")
        ),
        "the garbage collector to remove the Jobs, their ConfigMaps and pods",
    )
    assert_nothing_refused(control_plane, operator.user)


def test_a_preemption_is_retried_and_an_application_error_fails_by_the_pod_failure_policy(operator, cluster):
    """The pod failure policy the operator writes, carried out by the real Job controller: a disrupted
    pod is ignored (a new pod, no retry spent) and exit code 2 fails the Job at once."""
    cluster.apply_cr(finetune("ft").cpu_tiny().obj())
    train = job_of(cluster, "ft")
    first = pod_of(cluster, train)
    cluster.run(first, ready=True)
    cluster.finish(first, 137, "preempted", disruption="PreemptionByScheduler")
    second = pod_of(cluster, train, {first.metadata.name})
    job = cluster.batch.read_namespaced_job_status(train, cluster.ns)
    assert not job.status.failed, "a disrupted pod is not counted against backoffLimit"

    cluster.run(second, ready=True)
    cluster.finish(second, 2, {"status": "failed", "error": "train.jsonl line 7: missing 'messages'"})
    ft = cluster.phase("GemmaFineTune", "ft", "Failed")
    assert ft["status"]["message"] == "exit code 2: train.jsonl line 7: missing 'messages'"
    failed = next(c for c in ft["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PodFailurePolicy", failed


def test_a_serve_is_ready_once_the_real_replica_set_has_a_ready_pod(control_plane, operator, cluster):
    spec = serve("sv").set("tpu", {"accelerator": "cpu"}).set("model", {"uri": "/data/model", "preset": "tiny"})
    spec.set("storage", {"persistentVolumeClaim": "data", "mountPath": "/data"})
    cluster.apply_cr(spec.obj())
    deployment = cluster.wait_for(
        lambda: next(
            (d for d in cluster.apps.list_namespaced_deployment(cluster.ns).items if owned_by(d, "GemmaServe")), None
        ),
        "the serve's Deployment",
    )
    replica_set = cluster.wait_for(
        lambda: next(
            (r for r in cluster.apps.list_namespaced_replica_set(cluster.ns).items if owned_by(r, "Deployment")), None
        ),
        "the Deployment controller's ReplicaSet",
    )
    assert replica_set.metadata.name.startswith(deployment.metadata.name)
    pod = cluster.new_pod(",".join(f"{k}={v}" for k, v in deployment.spec.selector.match_labels.items()))
    assert owned_by(pod, "ReplicaSet")
    cluster.run(pod, ready=True)
    sv = cluster.phase("GemmaServe", "sv", "Ready")
    assert sv["status"]["readyReplicas"] == 1, sv["status"]
    assert_nothing_refused(control_plane, operator.user)
    print(yaml.safe_dump(sv["status"]))
