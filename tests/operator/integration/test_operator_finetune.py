"""The real operator against the in-process API: a GemmaFineTune from apply to Succeeded."""

import asyncio
import json
import subprocess
import sys

import pytest

from gemma_devcluster import tiny
from gemma_operator.children import merge, training
from gemma_operator.kube import ApiError
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from gemma_workloads.config import MergeConfig
from tests.support.builders import finetune
from tests.support.operator import settled

NS = "default"


def names(b):
    p = plan_finetune(b.name, NS, b.spec, OperatorSettings())
    return p, training.names(p)[0], merge.name(p)


async def training_started(cluster, b) -> str:
    """Apply the fine-tune and play its training Job's start, as the Job controller would; the Job's name."""
    _, train_name, _ = names(b)
    await cluster.apply(b.obj())
    await cluster.job(NS, train_name)
    await cluster.job_running(NS, train_name)
    return train_name


async def test_happy_path_train_merge_succeed(operator, cluster):
    b = finetune("ft").tpu("v5p", "2x2x1")
    p, train_name, merge_name = names(b)
    await cluster.apply(b.obj())
    job = await cluster.job(NS, train_name)
    assert job["metadata"]["ownerReferences"][0]["kind"] == "GemmaFineTune"
    cm = await cluster.get("ConfigMap", NS, train_name)
    assert json.loads(cm["data"]["train.json"])["output_dir"] == p.run_dir
    ft = await cluster.phase("GemmaFineTune", NS, "ft", "Pending")
    assert ft["status"]["run"] == p.run and ft["status"]["observedGeneration"] == 1

    progress = '{"event": "progress", "step": 40, "total_steps": 100, "loss": 1.25, "tokens_per_second": 900.0}\n'
    await cluster.job_running(NS, train_name, log="starting\n" + progress)
    ft = await cluster.phase("GemmaFineTune", NS, "ft", "Training")
    ft = await cluster.wait_for(lambda: _with_progress(cluster), message="progress in status")
    assert ft["status"]["progress"] == {"step": 40, "totalSteps": 100, "loss": 1.25, "tokensPerSecond": 900.0}

    ckpt = f"{p.run_dir}/checkpoints/100"
    await cluster.job_succeeded(
        NS,
        train_name,
        {
            "status": "succeeded",
            "step": 100,
            "total_steps": 100,
            "loss": 0.5,
            "tokens_per_second": 950.0,
            "checkpoint": ckpt,
        },
    )
    mjob = await cluster.job(NS, merge_name)
    assert mjob["spec"]["template"]["spec"]["containers"][0]["command"][2:4] == ["gemma_workloads", "merge"]
    mcm = await cluster.get("ConfigMap", NS, merge_name)
    assert json.loads(mcm["data"]["merge.json"])["step"] == 100
    await cluster.phase("GemmaFineTune", NS, "ft", "Merging")

    await cluster.job_succeeded(
        NS,
        merge_name,
        {"status": "succeeded", "output": p.merged_dir, "tensors_merged": 420, "bytes_written": 10, "seconds": 12.0},
        container="merge",
    )
    ft = await cluster.phase("GemmaFineTune", NS, "ft", "Succeeded")
    st = ft["status"]
    assert st["outputs"] == {"checkpoint": ckpt, "step": 100, "merged": p.merged_dir}
    assert st["progress"]["step"] == 100 and st["completionTime"] and st["startTime"]
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Complete"]["status"] == "True" and conds["InvalidSpec"]["status"] == "False"
    assert all(c["observedGeneration"] == 1 for c in conds.values())
    reasons = [e["reason"] for e in await _events(cluster, "ft")]
    assert {"Pending", "Training", "Merging", "Succeeded"} <= set(reasons)


async def _with_progress(cluster):
    ft = await cluster.get("GemmaFineTune", NS, "ft")
    return ft if (ft.get("status") or {}).get("progress") else None


async def _events(cluster, name):
    return [e for e in await cluster.kube.list("Event", NS) if e["involvedObject"]["name"] == name]


async def test_application_error_fails_at_once_with_the_pods_message(operator, cluster):
    b = finetune("bad-data").tpu("v5p")
    train_name = await training_started(cluster, b)
    await cluster.pod_failed(
        NS, train_name, 2, json.dumps({"status": "failed", "error": "train.jsonl line 7: missing 'messages'"})
    )
    await cluster.job_failed(
        NS, train_name, "PodFailurePolicy", "Container trainer failed with exit code 2 matching FailJob rule at index 2"
    )
    ft = await cluster.phase("GemmaFineTune", NS, "bad-data", "Failed")
    assert ft["status"]["message"] == "exit code 2: train.jsonl line 7: missing 'messages'"
    failed = next(c for c in ft["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PodFailurePolicy"
    events = await _events(cluster, "bad-data")
    assert any(e["type"] == "Warning" and e["reason"] == "Failed" for e in events)


async def test_retries_exhausted_fails_and_counts_restarts_not_preemptions(operator, cluster):
    b = finetune("flaky").tpu("v5p").set("backoffLimit", 2)
    train_name = await training_started(cluster, b)
    await cluster.pod_failed(NS, train_name, 42, preempted=True)
    await cluster.pod_failed(NS, train_name, 137, "OOMKilled")
    await cluster.pod_failed(NS, train_name, 137, "OOMKilled")
    await cluster.job_failed(
        NS, train_name, "BackoffLimitExceeded", "Job has reached the specified backoff limit", failed=2
    )
    ft = await cluster.phase("GemmaFineTune", NS, "flaky", "Failed")
    assert (ft["status"]["restarts"], ft["status"]["preemptions"]) == (2, 1)
    assert "OOMKilled" in ft["status"]["message"]
    await settled(cluster, operator, "GemmaFineTune", NS, "flaky")  # a finished run is never restarted
    jobs = await cluster.kube.list("Job", NS)
    assert [j["metadata"]["name"] for j in jobs] == [train_name]


async def test_invalid_spec_schedules_nothing_and_a_fix_recovers(operator, cluster):
    b = finetune("typo").tpu("v5p", "2x2x3")
    await cluster.apply(b.obj())
    ft = await cluster.phase("GemmaFineTune", NS, "typo", "Failed")
    cond = next(c for c in ft["status"]["conditions"] if c["type"] == "InvalidSpec")
    assert cond["status"] == "True" and "spec.tpu.topology: v5p has no topology '2x2x3'" in cond["message"]
    assert await cluster.kube.list("Job", NS) == [] and await cluster.kube.list("ConfigMap", NS) == []
    assert any(e["reason"] == "Failed" and e["type"] == "Warning" for e in await _events(cluster, "typo"))

    await cluster.kube.patch("GemmaFineTune", NS, "typo", {"spec": {"tpu": {"topology": "2x2x1"}}})
    ft = await cluster.phase("GemmaFineTune", NS, "typo", "Pending")
    assert ft["status"]["observedGeneration"] == 2
    assert next(c for c in ft["status"]["conditions"] if c["type"] == "InvalidSpec")["status"] == "False"
    _, train_name, _ = names(finetune("typo").tpu("v5p", "2x2x1"))
    await cluster.job(NS, train_name)


async def test_a_preference_method_on_chat_data_is_refused_and_on_pairs_reaches_the_pod(operator, cluster):
    b = finetune("dpo").tpu("v5p", "2x2x1").set("method", "dpo").set("preference", {"beta": 0.3})
    # Refused at admission, as the CRD's CEL rule makes a real API server do: nothing is stored or scheduled.
    with pytest.raises(ApiError) as refused:
        await cluster.apply(b.obj())
    assert refused.value.status == 422 and "method dpo trains on dataset.format preference" in refused.value.message
    assert await cluster.kube.list("Job", NS) == []

    await cluster.apply(b.set("dataset.format", "preference").obj())
    _, train_name, _ = names(b.set("dataset.format", "preference"))
    await cluster.job(NS, train_name)
    train = json.loads((await cluster.get("ConfigMap", NS, train_name))["data"]["train.json"])
    assert (train["method"], train["preference"]["beta"], train["dataset"]["format"]) == ("dpo", 0.3, "preference")


async def test_operator_restart_mid_training_creates_no_second_job(apiserver, cluster):
    from gemma_operator import runner

    b = finetune("steady").tpu("v5p")
    _, train_name, _ = names(b)

    async def start():
        stop, ready = asyncio.Event(), asyncio.Event()
        controller, tasks = await runner.spawn(
            str(apiserver.url), OperatorSettings(progress_poll_seconds=0.2), stop, ready
        )
        await ready.wait()
        return controller, stop, tasks

    _, stop, tasks = await start()
    await training_started(cluster, b)
    await cluster.phase("GemmaFineTune", NS, "steady", "Training")
    await runner.stop(tasks, stop)

    controller, stop, tasks = await start()  # a new operator process: only the cluster's state is known
    await settled(cluster, controller, "GemmaFineTune", NS, "steady")
    jobs = await cluster.kube.list("Job", NS)
    assert [j["metadata"]["name"] for j in jobs] == [train_name]
    ft = await cluster.get("GemmaFineTune", NS, "steady")
    assert ft["status"]["phase"] == "Training" and ft["status"]["attempt"] == 1
    await runner.stop(tasks, stop)


async def test_a_vanished_job_is_a_new_attempt_within_the_budget(operator, cluster):
    b = finetune("lost").tpu("v5p").set("backoffLimit", 1)
    p, train_name, _ = names(b)
    await cluster.apply(b.obj())
    await cluster.job(NS, train_name)
    await cluster.kube.delete("Job", NS, train_name)
    second = training.names(p, 2)[0]
    job2 = await cluster.job(NS, second)
    assert job2["spec"]["backoffLimit"] == 0, "the new attempt gets what is left of the budget"
    ft = await cluster.wait_for(lambda: _attempt(cluster, "lost", 2), message="attempt 2 in status")
    assert ft["status"]["restarts"] == 1
    assert any(e["reason"] == "TrainingRecreated" for e in await _events(cluster, "lost"))
    await cluster.kube.delete("Job", NS, second)
    ft = await cluster.phase("GemmaFineTune", NS, "lost", "Failed")
    assert "retry budget (backoffLimit 1) is spent" in ft["status"]["message"]


async def test_suspend_and_resume(operator, cluster):
    b = finetune("pause").tpu("v5p")
    train_name = await training_started(cluster, b)
    await cluster.phase("GemmaFineTune", NS, "pause", "Training")
    await cluster.kube.patch("GemmaFineTune", NS, "pause", {"spec": {"suspend": True}})
    await cluster.wait_for(lambda: _suspended(cluster, train_name, True), message="Job suspended")
    ft = await cluster.phase("GemmaFineTune", NS, "pause", "Suspended")
    assert ft["status"]["run"] == names(b)[0].run, "suspending does not start a new run"
    await cluster.kube.patch("GemmaFineTune", NS, "pause", {"spec": {"suspend": False}})
    await cluster.wait_for(lambda: _suspended(cluster, train_name, False), message="Job resumed")


async def _suspended(cluster, name, value):
    job = await cluster.get("Job", NS, name)
    return job["spec"].get("suspend") is value


async def test_a_spec_change_starts_a_new_run_and_stops_the_old_one(operator, cluster):
    b = finetune("rerun").tpu("v5p")
    p1, first, _ = names(b)
    await training_started(cluster, b)
    await cluster.phase("GemmaFineTune", NS, "rerun", "Training")
    await cluster.kube.patch("GemmaFineTune", NS, "rerun", {"spec": {"training": {"learningRate": 3e-4}}})
    p2, second, _ = names(finetune("rerun").tpu("v5p").training(learningRate=3e-4))
    await cluster.job(NS, second)
    await cluster.wait_for(lambda: _gone(cluster, first), message="old run's Job deleted")
    ft = await cluster.wait_for(lambda: _on_run(cluster, "rerun", p2.run), message="status on the new run")
    assert p2.run != p1.run and "progress" not in ft["status"]
    assert json.loads((await cluster.get("ConfigMap", NS, second))["data"]["train.json"])["output_dir"] == p2.run_dir


async def _gone(cluster, name):
    return await cluster.get("Job", NS, name) is None


async def _attempt(cluster, name, attempt):
    ft = await cluster.get("GemmaFineTune", NS, name)
    return ft if ft["status"].get("attempt") == attempt else None


async def _on_run(cluster, name, run):
    ft = await cluster.get("GemmaFineTune", NS, name)
    return ft if ft["status"].get("run") == run else None


async def test_deletion_collects_children_and_leaves_artifacts(operator, cluster, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("artifact")
    b = finetune("gone").cpu_tiny(str(tmp_path)).set("output.uri", str(out))
    train_name = await training_started(cluster, b)
    await cluster.kube._call("DELETE", "/apis/gemma-tpu.dev/v1alpha1/namespaces/default/gemmafinetunes/gone")
    await cluster.wait_for(lambda: _gone(cluster, train_name), message="Job garbage-collected")
    assert await cluster.get("ConfigMap", NS, train_name) is None
    assert (out / "keep.txt").read_text() == "artifact"
    assert ("delete", "batch", "jobs") not in cluster.api.calls, "children go by ownership, not by the operator"


async def test_a_queue_suspending_the_job_is_not_overridden(operator, cluster):
    b = finetune("queued").tpu("v5p").label("kueue.x-k8s.io/queue-name", "tpu-v5p")
    _, train_name, _ = names(b)
    await cluster.apply(b.obj())
    job = await cluster.job(NS, train_name)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "tpu-v5p"
    await cluster.kube.patch("Job", NS, train_name, {"spec": {"suspend": True}})  # Kueue, until admitted
    ft = await cluster.wait_for(lambda: _message_has(cluster, "queued", "queued"), message="queued")
    assert ft["status"]["phase"] == "Pending"
    await settled(cluster, operator, "GemmaFineTune", NS, "queued")
    assert (await cluster.get("Job", NS, train_name))["spec"]["suspend"] is True, "admission is the queue's call"
    await cluster.kube.patch("Job", NS, train_name, {"spec": {"suspend": False}})  # admitted
    await cluster.job_running(NS, train_name)
    await cluster.phase("GemmaFineTune", NS, "queued", "Training")


async def _message_has(cluster, name, text):
    ft = await cluster.get("GemmaFineTune", NS, name)
    return ft if text in (ft.get("status") or {}).get("message", "") else None


async def test_a_merge_refusing_its_base_shows_the_workloads_own_message(operator, cluster, tmp_path):
    """The message is the merge workload's real one, for a base model copied without config.json."""
    base = tiny.write_checkpoint(tmp_path / "base", shards=1).path
    (base / "config.json").unlink()
    config = MergeConfig(
        base_model_path=str(base),
        checkpoint_dir=str(tmp_path / "ckpt"),
        output_dir=str(tmp_path / "out"),
        termination_log=str(tmp_path / "termination-log"),
    )
    (tmp_path / "merge.json").write_text(config.dumps())
    done = subprocess.run(
        [sys.executable, "-m", "gemma_workloads", "merge", "--config", str(tmp_path / "merge.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    message = (tmp_path / "termination-log").read_text()

    b = finetune("bad-base").tpu("v5p")
    _, train_name, merge_name = names(b)
    await training_started(cluster, b)
    await cluster.job_succeeded(NS, train_name, {"status": "succeeded", "step": 10, "total_steps": 10})
    await cluster.job(NS, merge_name)
    await cluster.pod_failed(NS, merge_name, 2, message, container="merge")
    await cluster.job_failed(NS, merge_name, "PodFailurePolicy", "Container merge failed with exit code 2")
    ft = await cluster.phase("GemmaFineTune", NS, "bad-base", "Failed")
    assert (
        ft["status"]["message"] == f"exit code 2: {base}/config.json is missing: the model folder must hold the "
        "model's config.json; copy it again from the model's source"
    )
