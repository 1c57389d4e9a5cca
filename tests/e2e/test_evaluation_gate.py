"""The rollout gate on figures computed for real: the operator, the in-process API and the local
node run two fine-tunes of the tiny Gemma 4 (real training pods, real evaluation, real merges).
The run trained on the right answers passes `rollout.gate` and is rolled out; the run trained on
wrong answers is not, and the first keeps serving.

vLLM is not started: the node has no serving image, so the server's pod cannot start. What the
gate decides is in the GemmaServe's status and in the model its Deployment is given, which is
what is asserted; serving a merged output is tested in tests/e2e/test_dev.py.
"""

import asyncio
import json
import sys
from pathlib import Path

import kmock
import pytest

from gemma_devcluster import tiny
from gemma_devcluster.agent import NodeAgent
from gemma_devcluster.apiserver import ApiServer
from gemma_devcluster.client import NodeKube
from gemma_devcluster.kubelet import Node
from gemma_operator import runner
from gemma_operator.children import serving
from gemma_operator.settings import OperatorSettings
from tests.support.cluster import Cluster

pytestmark = pytest.mark.slow

NS = "default"
CLAIM = "gemma-data"
GATE = [{"metric": "evalLoss", "baseline": "noWorse"}, {"metric": "exactMatch", "min": 0.5}]
MODEL_URI = serving.REVISION_ANNOTATION.replace("revision", "model-uri")
ROOT = Path(__file__).resolve().parents[2]


def workloads_image(folder: Path) -> Path:
    """The "image" of the training and merge pods: a bin folder whose python runs this checkout's
    workloads, whichever checkout the environment's editable install points to."""
    folder.mkdir(parents=True)
    python = folder / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{ROOT / "workloads"}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return folder


def make_data(data: Path) -> None:
    """The demo's tiny model and dataset, the same questions with every city moved one country on,
    and an eval file of one question per country with its right answer."""
    tiny.write_checkpoint(data / "tiny-gemma4", tiny.TinyConfig(embed_std=0.2), shards=1)
    right = tiny.write_dataset(data / "right.jsonl", "chat", n=96)
    cities = list(tiny.COUNTRIES.values())
    moved = {country: cities[(i + 1) % len(cities)] for i, country in enumerate(tiny.COUNTRIES)}
    wrong = []
    for line in right.read_text().splitlines():
        row = json.loads(line)
        answer = row["messages"][-1]["content"]
        country = next(c for c in tiny.COUNTRIES if f"of {c} is" in answer)
        row["messages"][-1]["content"] = f"The capital of {country} is {moved[country]}."
        wrong.append(json.dumps(row) + "\n")
    (data / "wrong.jsonl").write_text("".join(wrong))
    question = tiny.QUESTIONS[0]
    (data / "eval.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": question.format(c=country)},
                        {"role": "assistant", "content": f"The capital of {country} is {city}."},
                    ]
                }
            )
            + "\n"
            for country, city in tiny.COUNTRIES.items()
        )
    )


def fine_tune(dataset: str, steps: int) -> dict:
    """examples/quickstart's recipe, with an evaluation on the eval file."""
    return {
        "apiVersion": "gemma-tpu.dev/v1alpha1",
        "kind": "GemmaFineTune",
        "metadata": {"name": "capitals", "namespace": NS},
        "spec": {
            "model": {"uri": "/data/tiny-gemma4", "preset": "tiny", "dtype": "float32"},
            "dataset": {"uri": f"/data/{dataset}", "format": "chat", "maxSeqLen": 112, "packing": True},
            "lora": {"rank": 16, "alpha": 32},
            "training": {
                "steps": steps,
                "batchSize": 8,
                "microBatchSize": 8,
                "learningRate": 1.0e-2,
                "warmupSteps": 5,
                "checkpointEvery": steps,
                "logEvery": 10,
                "gradientCheckpointing": False,
            },
            "evaluation": {"uri": "/data/eval.jsonl", "maxRows": 8, "maxNewTokens": 16},
            "tpu": {"accelerator": "cpu"},
            "storage": {"persistentVolumeClaim": CLAIM, "mountPath": "/data"},
            "output": {"uri": "/data/runs/capitals"},
        },
    }


SERVE = {
    "apiVersion": "gemma-tpu.dev/v1alpha1",
    "kind": "GemmaServe",
    "metadata": {"name": "capitals", "namespace": NS},
    "spec": {
        "model": {"fineTuneRef": {"name": "capitals"}},
        "tpu": {"accelerator": "cpu"},
        "vllm": {"maxModelLen": 256, "maxNumSeqs": 4},
        "rollout": {"gate": GATE},
        "storage": {"persistentVolumeClaim": CLAIM, "mountPath": "/data"},
    },
}


async def test_the_gate_rolls_out_the_fine_tune_that_improves_and_not_the_one_that_makes_things_worse(tmp_path):
    data = tmp_path / "data"
    await asyncio.to_thread(make_data, data)
    settings = OperatorSettings(progress_poll_seconds=1.0)
    images = {settings.images.workloads: workloads_image(tmp_path / "image" / "bin")}  # no serving image: no vLLM
    async with ApiServer() as apiserver, kmock.Server(apiserver):
        apiserver.register_defaults()
        op_stop, ready, stop = asyncio.Event(), asyncio.Event(), asyncio.Event()
        _, op_tasks = await runner.spawn(str(apiserver.url), settings, op_stop, ready)
        kube = NodeKube.local(str(apiserver.url))
        agent = asyncio.create_task(
            NodeAgent(kube, apiserver, Node(tmp_path / "node", images, {CLAIM: data}), interval=0.25).run(stop)
        )
        cluster = Cluster(apiserver)
        try:
            await asyncio.wait_for(ready.wait(), 30)
            for account in (settings.training_service_account, settings.serving_service_account):  # the chart's
                await kube.create(
                    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": NS}}
                )
            await cluster.kube.create(SERVE)
            await cluster.kube.create(fine_tune("right.jsonl", 200))
            good = await succeeded(cluster)
            figures = {m["name"]: m for m in good["status"]["evaluation"]["metrics"]}
            print("run trained on the right answers:", good["status"]["evaluation"]["summary"], figures)
            assert figures["evalLoss"]["value"] < figures["evalLoss"]["baseline"]
            assert figures["exactMatch"]["value"] >= 0.5 > figures["exactMatch"]["baseline"]
            assert figures["exactMatch"]["rows"] == len(tiny.COUNTRIES)
            run1, merged1 = good["status"]["run"], good["status"]["outputs"]["merged"]
            await cluster.wait_for(lambda: served(cluster, merged1), 60, "the improving run rolled out")
            passed = await cluster.wait_for(lambda: condition(cluster, "GatePassed", "Passed"), 30, "gate passed")
            assert passed["status"] == "True" and run1 in passed["message"]
            predictions = data / "runs" / "capitals" / "runs" / run1 / "evaluation" / "predictions.jsonl"
            assert len(predictions.read_text().splitlines()) == len(tiny.COUNTRIES)

            await cluster.kube.patch("GemmaFineTune", NS, "capitals", {"spec": fine_tune("wrong.jsonl", 100)["spec"]})
            bad = await succeeded(cluster, not_run=run1)
            figures = {m["name"]: m for m in bad["status"]["evaluation"]["metrics"]}
            print("run trained on wrong answers:", bad["status"]["evaluation"]["summary"], figures)
            assert figures["exactMatch"]["value"] < 0.5, "taught the wrong cities, it answers them"
            run2 = bad["status"]["run"]
            assert [r["run"] for r in bad["status"]["runs"]] == [run2, run1], "the run and its artifacts are kept"
            blocked = await cluster.wait_for(lambda: condition(cluster, "GatePassed", "MetricFailed"), 60, "blocked")
            assert blocked["status"] == "False" and blocked["message"].startswith(f"run {run2}: ")
            # Its loss on the right answers is still below the random base's (the answers' shape is
            # learnt), so it is exactMatch that holds it back.
            assert f"run {run2}: exactMatch 0 is below the minimum 0.5" in blocked["message"], blocked
            assert blocked["message"].endswith(f"not rolled out; serving run {run1}")
            gsv = await cluster.get("GemmaServe", NS, "capitals")
            assert gsv["status"]["passedRuns"] == [run1] and gsv["status"]["modelUri"] == merged1
            assert await served(cluster, merged1), "the improving run keeps serving"
        finally:
            stop.set()
            await agent
            await runner.stop(op_tasks, op_stop)


async def succeeded(cluster: Cluster, not_run: str | None = None, timeout: float = 900) -> dict:
    async def done():
        ft = await cluster.get("GemmaFineTune", NS, "capitals")
        st = (ft or {}).get("status") or {}
        assert st.get("phase") != "Failed", st
        return ft if st.get("phase") == "Succeeded" and st.get("run") != not_run and st.get("runs") else None

    return await cluster.wait_for(done, timeout, "the fine-tune succeeded")


async def served(cluster: Cluster, uri: str) -> bool:
    dep = await cluster.get("Deployment", NS, "capitals-vllm")
    return bool(dep) and dep["spec"]["template"]["metadata"]["annotations"].get(MODEL_URI) == uri


async def condition(cluster: Cluster, type_: str, reason: str) -> dict | None:
    gsv = await cluster.get("GemmaServe", NS, "capitals")
    cond = next((c for c in (gsv.get("status") or {}).get("conditions", []) if c["type"] == type_), {})
    return cond if cond.get("reason") == reason else None
