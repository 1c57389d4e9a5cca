"""What a refused pod makes the CR say, as tables: the controllers' reports -> the refusal, the
API server's message -> what to do, and the refusal -> the PodsCreated condition and its one Event."""

from __future__ import annotations

import pytest

from gemma_operator import pod_creation
from gemma_operator.children import training_objects
from gemma_operator.conditions import condition
from gemma_operator.lifecycle import finetune as finetune_lifecycle
from gemma_operator.plan import plan_finetune
from tests.support.builders import finetune
from tests.support.phases import NS, SETTINGS, T0

# The API server's own messages (kube-apiserver admission plugins: serviceaccount, resourcequota,
# limitranger, pod-security-admission, and the webhook dispatcher), as the Job controller reports them.
SA = (
    'pods "ft-train-1-" is forbidden: error looking up service account ml/gemma-trainer: '
    'serviceaccount "gemma-trainer" not found'
)
QUOTA = (
    'pods "ft-train-1-" is forbidden: exceeded quota: tpu-quota, requested: google.com/tpu=4, '
    "used: google.com/tpu=8, limited: google.com/tpu=8"
)
PSA = (
    'pods "ft-train-1-" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
    '(container "trainer" must set securityContext.allowPrivilegeEscalation=false)'
)
LIMITS = 'pods "ft-train-1-" is forbidden: maximum memory usage per Container is 32Gi, but limit is 64Gi'
WEBHOOK = 'admission webhook "validate.kyverno.svc-fail" denied the request: images must come from our registry'


@pytest.mark.parametrize(
    "message, advice",
    [
        (SA, "create ServiceAccount ml/gemma-trainer (the chart creates the workload ServiceAccounts in each of"),
        (QUOTA, "raise ResourceQuota tpu-quota in this namespace or lower what the workload asks for"),
        (PSA, 'the namespace enforces Pod Security level "restricted:latest"'),
        (LIMITS, "the namespace's LimitRange refuses the pod's resources (maximum memory usage per Container is 32Gi)"),
        (WEBHOOK, "the validating admission webhook validate.kyverno.svc-fail refused the pod"),
        ('pods "x" is forbidden: something new', None),
    ],
)
def test_what_to_do_follows_from_the_api_servers_message(message, advice):
    found = pod_creation.hint(message)
    assert found == advice if advice is None else found.startswith(advice)


def obj(kind: str, name: str, uid: str, spec: dict | None = None, status: dict | None = None) -> dict:
    return {"kind": kind, "metadata": {"name": name, "uid": uid}, "spec": spec or {}, "status": status or {}}


def event(kind: str, name: str, uid: str, at: str, message: str = SA, reason: str = "FailedCreate") -> dict:
    involved = {"kind": kind, "name": name, "uid": uid}
    return {"involvedObject": involved, "reason": reason, "message": f"Error creating: {message}", "lastTimestamp": at}


def pod(created: str) -> dict:
    return {"metadata": {"name": "p", "creationTimestamp": created}, "status": {"phase": "Pending"}}


JOB = obj("Job", "ft-train-1", "u1")
JOBSET = obj(
    "JobSet", "ft-train-1", "u2", {"replicatedJobs": [{"replicas": 2, "template": {"spec": {"parallelism": 2}}}]}
)
LWS = obj("LeaderWorkerSet", "chat-vllm", "u3", {"replicas": 1, "leaderWorkerTemplate": {"size": 2}})
REPLICA_FAILURE = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": SA}
T1, T2 = "2026-01-01T12:00:01Z", "2026-01-01T12:00:02Z"


@pytest.mark.parametrize(
    "case, workload, pods, events, expected",
    [
        ("no workload", None, [], [], None),
        ("a Job's refusal", JOB, [], [event("Job", "ft-train-1", "u1", T1)], ("Job", "ft-train-1", SA)),
        (
            "the newest of several",
            JOB,
            [],
            [event("Job", "ft-train-1", "u1", T2, QUOTA), event("Job", "ft-train-1", "u1", T1)],
            ("Job", "ft-train-1", QUOTA),
        ),
        ("another Job of the same name", JOB, [], [event("Job", "ft-train-1", "old-uid", T1)], None),
        ("another reason", JOB, [], [event("Job", "ft-train-1", "u1", T1, reason="SuccessfulCreate")], None),
        ("a pod since", JOB, [pod(T2)], [event("Job", "ft-train-1", "u1", T1)], None),
        ("a pod made in the same second", JOB, [pod(T1)], [event("Job", "ft-train-1", "u1", T1)], None),
        (
            "refused after a pod",
            JOBSET,
            [pod(T1)],
            [event("Job", "ft-train-1-workers-1", "j", T2)],
            ("Job", "ft-train-1-workers-1", SA),
        ),
        (
            "a JobSet's Job",
            JOBSET,
            [],
            [event("Job", "ft-train-1-workers-0", "j", T1)],
            ("Job", "ft-train-1-workers-0", SA),
        ),
        ("a Job of another JobSet", JOBSET, [], [event("Job", "ft-train-10-workers-0", "j", T1)], None),
        (
            "a LeaderWorkerSet's StatefulSet",
            LWS,
            [],
            [event("StatefulSet", "chat-vllm-0", "s", T1)],
            ("StatefulSet", "chat-vllm-0", SA),
        ),
        (
            "a Deployment's ReplicaFailure",
            obj("Deployment", "chat-vllm", "d", status={"conditions": [REPLICA_FAILURE]}),
            [],
            [],
            ("Deployment", "chat-vllm", SA),
        ),
        ("a Deployment creating pods", obj("Deployment", "chat-vllm", "d"), [], [], None),
    ],
)
def test_the_refusal_comes_from_what_the_controllers_report(case, workload, pods, events, expected):
    found = pod_creation.refusal(workload, pods, events)
    assert (found and (found.kind, found.name, found.message)) == (expected or None)


@pytest.mark.parametrize(
    "workload, pods, read",
    [
        (JOB, [], True),
        (JOB, [pod(T1)], False),
        (obj("Job", "j", "u", status={"conditions": [{"type": "Complete", "status": "True"}]}), [], False),
        (obj("Job", "j", "u", spec={"suspend": True}), [], False),
        (JOBSET, [pod(T1), pod(T1), pod(T1)], True),  # 3 of its 4 pods
        (LWS, [pod(T1), pod(T1)], False),
        (obj("Deployment", "d", "u"), [], False),  # its ReplicaFailure condition says it
        (None, [], False),
    ],
)
def test_events_are_read_only_while_pods_are_missing(workload, pods, read):
    assert pod_creation.may_be_refused(workload, pods) is read


def decide(status: dict, refusal: pod_creation.Refusal | None, pods: list[dict] = ()):
    plan = plan_finetune("ft", NS, finetune("ft").tpu("v5p", "2x2x1").spec, SETTINGS)
    job = training_objects(plan, SETTINGS)[1]
    view = finetune_lifecycle.FineTuneView(
        name="ft",
        namespace=NS,
        generation=1,
        status=status,
        problems=[],
        owner=None,
        now=T0,
        plan=plan,
        training={**job, "metadata": {**job["metadata"], "uid": "u1"}, "status": {"active": 1}},
        training_pods=list(pods),
        refusal=refusal,
    )
    return finetune_lifecycle.decide(view, SETTINGS)


def test_a_refusal_is_one_condition_one_event_and_the_same_phase_until_pods_appear():
    refused = pod_creation.Refusal("Job", "ft-train-1", SA, pod_creation.hint(SA))
    first = decide({}, refused)
    c = condition(first.status["conditions"], pod_creation.CONDITION)
    assert (c["status"], c["reason"], c["message"]) == ("False", pod_creation.REFUSED, refused.describe())
    assert first.status["phase"] == "Pending" and first.status["message"] == refused.describe()
    assert [e for e in first.events if e[1] == pod_creation.REFUSED] == [
        ("Warning", pod_creation.REFUSED, refused.describe())
    ]
    assert (condition(first.status["conditions"], "Stalled") or {}).get("status") == "False", "it heals by itself"

    again = decide(first.status, refused)
    assert not [e for e in again.events if e[1] == pod_creation.REFUSED], "one Event, not one per reconcile"

    healed = decide(again.status, None, [pod(T1)])
    c = condition(healed.status["conditions"], pod_creation.CONDITION)
    assert (c["status"], c["reason"]) == ("True", pod_creation.CREATED)
    assert healed.status["phase"] == "Pending" and "cannot create pods" not in healed.status["message"]


def test_no_condition_on_a_resource_whose_pods_were_never_refused():
    assert condition(decide({}, None).status["conditions"], pod_creation.CONDITION) is None
