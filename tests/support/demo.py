"""`gemma-tpu dev` as the end-to-end tests run it, on either API server, and what its end must be."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import yaml

from gemma_devcluster import dev, tiny
from gemma_devcluster.client import NodeKube

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = os.environ.get("GEMMA_VLLM_PYTHON")
KUBECTL = shutil.which("kubectl")
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
NS, NAME = "default", "tiny-capitals"  # the quickstart's CRs


def arguments(workdir: Path, **where) -> argparse.Namespace:
    """The demo's arguments: the quickstart, vLLM's environment, kept running at the end."""
    return argparse.Namespace(
        workdir=str(workdir),
        examples=str(ROOT / "examples" / "quickstart"),
        vllm_python=VLLM_PYTHON,
        port=0,
        timeout=600,
        keep_running=True,
        **where,
    )


def tensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


class Printed:
    """What the demo has printed so far (pytest's capsys hands each part out once)."""

    APPLIED = "(kubectl works meanwhile"
    ANSWERED = "answers of the fine-tuned model are right"
    BENCHMARK = "serving benchmark of revision"

    def __init__(self, capsys) -> None:
        self.capsys, self.text = capsys, ""

    def has(self, line: str) -> bool:
        self.text += self.capsys.readouterr().out
        return line in self.text


async def until(check, task: asyncio.Task, what: str, timeout: float = 600):
    """Poll `check()` while the demo runs; fail with the demo's own error if it ends first."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if task.done():
            task.result()
            raise AssertionError(f"the demo ended before {what}")
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        await asyncio.sleep(0.5)
    return value


def kubectl(config: Path, home: Path, *args: str, timeout: float = 660) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(KUBECTL), *args],
        capture_output=True,
        text=True,
        env={"KUBECONFIG": str(config), "HOME": str(home)},
        timeout=timeout,
    )


def kubectl_wait_ready(config: Path, home: Path) -> subprocess.CompletedProcess:
    names = [f"gft/{NAME}", f"gsv/{NAME}"]
    return kubectl(config, home, "wait", "--for=condition=Ready", *names, "-n", NS, "--timeout=600s")


async def ask_live_servers(kube: NodeKube) -> dict[str, str]:
    """Every demo question, asked by the test of the fine-tuned server, found through the API."""
    serve = await kube.get("GemmaServe", NS, NAME)
    port = await dev._serving_port(kube, serve)
    name = serve["status"]["servedModelName"]
    return {q: await asyncio.to_thread(dev._ask, port, name, q) for q, _ in dev.QUESTIONS}


def check_outcome(out: dev.Outcome, asked: dict[str, str]) -> None:
    """Every answer right and the same as the live server's, the base model's wrong, the evaluation and
    gate as the demo says, and a merged model whose only changed tensors are the LoRA targets."""
    dataset = {}
    for line in (out.data_dir / "capitals.jsonl").read_text().splitlines():
        user, model = json.loads(line)["messages"]
        dataset[user["content"]] = model["content"]
    assert [a.question for a in out.answers] == [q for q, _ in dev.QUESTIONS] and len(out.answers) == len(
        tiny.COUNTRIES
    )
    for a in out.answers:
        assert a.expected == dataset[a.question], "the demo checks against what the model was trained on"
        assert a.fine_tuned.strip() == asked[a.question].strip(), "the live server answers what the demo printed"
        assert a.fine_tuned.strip() == dataset[a.question], f"{a.question} -> {a.fine_tuned!r}"
        assert a.base is not None and a.base.strip() != dataset[a.question], "the base model did not know it"

    # The evaluation scored the same questions; the gate let this run through on its figures.
    figures = {m["name"]: m for m in out.fine_tune["status"]["evaluation"]["metrics"]}
    assert figures["exactMatch"]["value"] == 1.0 and figures["exactMatch"]["baseline"] == 0.0
    assert figures["exactMatch"]["rows"] == len(dev.QUESTIONS)
    assert figures["evalLoss"]["value"] < figures["evalLoss"]["baseline"]
    gate = {c["type"]: c for c in out.serve["status"]["conditions"]}["GatePassed"]
    assert gate["status"] == "True", gate

    # The answers as soon as the server is Ready; the serving benchmark's figures after them.
    assert out.benchmark and out.benchmark["state"] == "Succeeded", out.benchmark
    assert out.ready_at is not None and out.answered_at is not None
    assert out.ready_at <= out.answered_at < out.ready_at + out.benchmark_seconds

    quickstart = yaml.safe_load((ROOT / "examples" / "quickstart" / "finetune.yaml").read_text())
    ft = out.fine_tune["status"]
    assert ft["phase"] == "Succeeded" and ft["progress"]["step"] == quickstart["spec"]["training"]["steps"]
    assert out.serve["status"]["phase"] == "Ready" and out.serve["status"]["readyReplicas"] == 1
    assert out.total_seconds < 600

    merged = Path(ft["outputs"]["merged"].replace("/data", str(out.data_dir), 1))
    base = out.data_dir / "tiny-gemma4"
    assert json.loads((merged / "config.json").read_text()) == json.loads((base / "config.json").read_text())
    before, after = tensors(base), tensors(merged)
    assert before.keys() == after.keys()
    changed = {k for k in before if not np.array_equal(before[k], after[k])}
    adapted = {k for k in before if any(f"{t}.weight" in k for t in TARGETS)}
    assert changed == adapted, f"only LoRA targets change: extra {changed - adapted}, missing {adapted - changed}"
