"""`gemma-tpu dev` end to end: the same code path as `make demo`, asserted on the final state,
on what `kubectl wait` sees meanwhile, and on every demo answer asked again of the live servers."""

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from gemma_devcluster import dev, tiny
from gemma_devcluster.kinds import LOCAL_KINDS
from gemma_operator.kube import Kube

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = os.environ.get("GEMMA_VLLM_PYTHON")
KUBECTL = shutil.which("kubectl")
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not VLLM_PYTHON, reason="set GEMMA_VLLM_PYTHON to vLLM's environment (make test does)"),
]


def tensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


async def _until(check, task: asyncio.Task, what: str, timeout: float = 600):
    """Poll `check()` while the demo runs; fail with the demo's own error if it ends first."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if task.done():
            task.result()
            raise AssertionError(f"the demo ended before {what}")
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        await asyncio.sleep(0.5)
    return value


def kubectl_wait_ready(config: Path, home: Path) -> subprocess.CompletedProcess:
    names = ["gft/tiny-capitals", "gsv/tiny-capitals"]
    return subprocess.run(
        [KUBECTL, "wait", "--for=condition=Ready", *names, "-n", "default", "--timeout=600s"],
        capture_output=True,
        text=True,
        env={"KUBECONFIG": str(config), "HOME": str(home)},
        timeout=660,
    )


async def ask_live_servers(config: Path) -> dict[str, str]:
    """Every demo question, asked by this test of the fine-tuned server, found through the API."""
    url = yaml.safe_load(config.read_text())["clusters"][0]["cluster"]["server"]
    kube = Kube.from_url(url, LOCAL_KINDS, user_agent="gemma-tpu-tests")
    serve = await kube.get("GemmaServe", "default", "tiny-capitals")
    port = await dev._serving_port(kube, serve)
    name = serve["status"]["servedModelName"]
    return {q: await asyncio.to_thread(dev._ask, port, name, q) for q, _ in dev.QUESTIONS}


async def test_dev_trains_merges_serves_and_answers_every_question_right(tmp_path, capsys):
    workdir = tmp_path / "demo"
    args = argparse.Namespace(
        workdir=str(workdir),
        examples=str(ROOT / "examples" / "quickstart"),
        vllm_python=VLLM_PYTHON,
        port=0,
        timeout=600,
        keep_running=True,
    )
    stop = asyncio.Event()
    demo = asyncio.create_task(dev.run(args, stop))
    try:
        config = await _until(lambda: (workdir / "kubeconfig").exists() and workdir / "kubeconfig", demo, "kubeconfig")
        if KUBECTL:  # where kubectl is installed, it waits for both kinds while the demo trains
            waited = await asyncio.to_thread(kubectl_wait_ready, config, tmp_path)
            assert waited.returncode == 0, waited.stderr
            assert waited.stdout.count("condition met") == 2, waited.stdout
        await _until(lambda: "answers of the fine-tuned model are right" in capsys.readouterr().out, demo, "answers")
        asked = await ask_live_servers(config)
    finally:
        stop.set()
        out = await demo

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

    steps = yaml.safe_load((ROOT / "examples" / "quickstart" / "finetune.yaml").read_text())["spec"]["training"][
        "steps"
    ]
    ft = out.fine_tune["status"]
    assert ft["phase"] == "Succeeded" and ft["progress"]["step"] == steps
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
