"""The real controllers the project's workloads meet on GKE, run beside the control plane: JobSet and
LeaderWorkerSet, their CRDs served and their webhooks answering, under their own ServiceAccounts."""

import json

import pytest

pytestmark = pytest.mark.control_plane


def test_jobset_and_lws_run_beside_the_control_plane_with_their_webhooks(
    control_plane, jobset_controller, lws_controller
):
    for crd in ("jobsets.jobset.x-k8s.io", "leaderworkersets.leaderworkerset.x-k8s.io"):
        established = control_plane.kubectl(
            "get", "crd", crd, "-o", "jsonpath={.status.conditions[?(@.type=='Established')].status}"
        )
        assert established.stdout == "True", crd
    # JobSet's validating webhook answers for itself: a name whose Jobs' names would pass 63 characters is
    # refused by it, not by the CRD's schema (kubernetes-sigs/jobset pkg/webhooks/jobset_webhook.go, ValidateCreate).
    refused = control_plane.kubectl(
        "create",
        "--dry-run=server",
        "-f",
        "-",
        check=False,
        stdin=json.dumps(
            {
                "apiVersion": "jobset.x-k8s.io/v1alpha2",
                "kind": "JobSet",
                "metadata": {"name": "x" * 60, "namespace": "default"},
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "workers",
                            "replicas": 1,
                            "template": {
                                "spec": {
                                    "template": {
                                        "spec": {
                                            "restartPolicy": "Never",
                                            "containers": [{"name": "c", "image": "busybox"}],
                                        }
                                    }
                                }
                            },
                        }
                    ]
                },
            }
        ),
    )
    assert refused.returncode != 0 and "JobSet name is too long" in refused.stderr, refused.stderr
    for started in (jobset_controller, lws_controller):
        assert any(key.endswith("_WEBHOOK_PORT") for key in started), started
