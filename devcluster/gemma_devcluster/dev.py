"""`gemma-tpu dev`: the whole product on one machine, no TPU.

A Kubernetes API with our CRDs, the real operator against it, and a local node agent that runs
the pods of the `cpu` profile as processes (the training and merge workloads from this
environment, vLLM's CPU build from its own). The API is an in-process one by default; with
`--kubeconfig FILE` it is that API server's (a control plane without nodes of its own, whose real
controllers then make the pods), and `--real` starts such a control plane here first (backends.py).
It makes a tiny Gemma 4 and a small
dataset, applies examples/quickstart/ (a fine-tune evaluated on the demo's questions, and its
server behind a rollout gate), shows progress as it happens, asks the served model every demo
question, prints its answers beside the base model's (from the fine-tune's evaluation, which
answers the same questions with the adapter off), the evaluation's figures and what each phase
took. Ctrl-C stops everything cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gemma_devcluster import backends, confinement, install, operator_process, services, tiny
from gemma_devcluster.display import Table
from gemma_devcluster.kubelet import Node
from gemma_devcluster.processes import port_in_use
from gemma_operator import api, benchmark_results
from gemma_operator.kube import ApiError, Kube
from gemma_operator.plan.finetune import COMPILATION_CACHE_FOLDER
from gemma_operator.settings import OperatorSettings
from gemma_workloads.config import run_dir

DATA_CLAIM = "gemma-data"  # the PVC of examples/quickstart, a folder here
QUESTIONS = tiny.demo_questions()  # also the fine-tune's eval set (examples/quickstart/finetune.yaml)
DATASET, EVAL_SET = "capitals.jsonl", "capitals-eval.jsonl"
# The tiny model, made so that a short fine-tune can get confident (tiny.TinyConfig.embed_std).
MODEL_ARGS = ["--examples", "96", "--embed-std", "0.2"]


class DevError(Exception):
    """A situation the user can fix, said plainly."""


@dataclass
class Answer:
    question: str
    expected: str  # the dataset's answer
    base: str | None  # the base model's greedy answer, from the fine-tune's evaluation
    fine_tuned: str

    @property
    def correct(self) -> bool:
        return self.fine_tuned.strip() == self.expected


@dataclass
class Outcome:
    """What a `dev` run ended with (the end-to-end test asserts on it)."""

    fine_tune: dict[str, Any] | None = None
    serve: dict[str, Any] | None = None  # the fine-tune's server
    answers: list[Answer] = field(default_factory=list)
    endpoint: str | None = None
    phases: list[tuple[str, str, float]] = field(default_factory=list)
    total_seconds: float = 0.0  # from apply to the served answers
    ready_at: float | None = None  # time.monotonic() when the fine-tune's server was seen Ready
    answered_at: float | None = None  # time.monotonic() when the answers were in
    data_dir: Path | None = None
    benchmark: dict[str, Any] | None = None  # status.benchmark of the served revision, once measured
    benchmark_seconds: float = 0.0  # from Ready until its figures reached the status


def _prerequisites(args: argparse.Namespace) -> None:
    if not Path(args.vllm_python).exists():
        raise DevError(f"vLLM's environment is missing ({args.vllm_python}): run `make vllm-venv` first")
    if args.port and port_in_use(args.port):
        raise DevError(f"port {args.port} is in use by another program: pick another with --port, or 0 for any")
    if not shutil.which("g++") and not shutil.which("c++"):
        print("note: no C++ compiler found; vLLM runs in eager mode here, which needs none", file=sys.stderr)


def _make_data(data: Path) -> None:
    """The tiny model and dataset, made by the workloads' own generator, as a data-prep job would;
    made again when the generator's arguments changed since."""
    stamp = data / "tiny-gemma4.args"
    made = [data / "tiny-gemma4" / "config.json", data / DATASET, data / EVAL_SET]
    if all(f.exists() for f in made) and stamp.exists() and stamp.read_text() == " ".join(MODEL_ARGS):
        return
    cmd = [
        sys.executable,
        "-m",
        "gemma_devcluster.tiny",
        str(data / "tiny-gemma4"),
        "--dataset",
        str(data / DATASET),
        "--eval-dataset",
        str(data / EVAL_SET),
        *MODEL_ARGS,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise DevError(f"making the tiny model failed:\n{done.stderr[-2000:]}")
    stamp.write_text(" ".join(MODEL_ARGS))


def _clear_runs(data: Path) -> None:
    """Each demo starts from nothing but what earlier ones compiled, as a cluster's storage keeps it:
    the fine-tunes' runs go, their JAX compilation caches (`<output>/compilation-cache`) stay, and so
    does the server's (spec.compilationCache, outside `runs`)."""
    for child in (data / "runs").glob("*/*"):
        if child.name == COMPILATION_CACHE_FOLDER:
            continue
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()


def _ask(port: int, model: str, question: str) -> str:
    """Greedy answer through the chat endpoint: the server applies the model's own chat template."""
    body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": 24, "temperature": 0}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())["choices"][0]["message"]["content"]


def _base_answers(data: Path, fine_tune: dict) -> dict[str, str]:
    """The base model's greedy answer to each demo question, as the fine-tune's evaluation wrote
    them (`<run folder>/evaluation/predictions.jsonl`, one line per row of the eval set, in order)."""
    run = run_dir(fine_tune["spec"]["output"]["uri"], (fine_tune.get("status") or {}).get("run") or "")
    path = Path(run.replace("/data", str(data), 1)) / "evaluation" / "predictions.jsonl"
    if not path.exists():
        return {}
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {
        q: p.get("base_answer")
        for (q, expected), p in zip(QUESTIONS, lines, strict=False)
        if p.get("expected") == expected
    }


def _ask_all(port: int, serve: dict, base: dict[str, str]) -> list[Answer]:
    """Every demo question, asked of the served fine-tune, beside the base model's answer."""
    name = serve["status"]["servedModelName"]
    return [Answer(q, expected, base.get(q), _ask(port, name, q)) for q, expected in QUESTIONS]


def _print_answers(answers: list[Answer]) -> None:
    for a in answers:
        base = " ".join((a.base or "").split())[:60] or (
            "(not evaluated)"
            if a.base is None
            else f"(no words: {len(a.base)} blank characters)"
            if a.base
            else "(no text: special tokens only)"
        )
        print(
            f"\n> {a.question}\n  base model   {base}\n  fine-tuned   {a.fine_tuned.strip()}"
            f"{'' if a.correct else '   (expected: ' + a.expected + ')'}",
            flush=True,
        )
    print(f"\n{sum(a.correct for a in answers)}/{len(answers)} answers of the fine-tuned model are right", flush=True)


async def _serving_port(kube: Kube, serve: dict | None) -> int | None:
    """The host port of a ready pod behind a Ready GemmaServe's Service (pods share this machine)."""
    if serve is None or (serve.get("status") or {}).get("phase") != "Ready":
        return None
    svc = await kube.get("Service", serve["metadata"]["namespace"], f"{serve['metadata']['name']}-vllm")
    if svc is None:
        return None
    meta = svc["metadata"]
    table = services.routes([svc], await kube.list("Pod", meta["namespace"]))
    route = table.get(f"{meta['name']}.{meta['namespace']}.svc:{svc['spec']['ports'][0]['port']}")
    return int(route.rsplit(":", 1)[1]) if route else None


def _failure_details(cluster: backends.Cluster, obj: dict) -> str:
    """The last log lines of the failed pod of a resource, for a plain report."""
    found = cluster.pod_log(obj["metadata"]["name"])
    if found is None:
        return ""
    pod, text = found
    return f"\nlast lines of pod {pod}:\n{text}"


def _backend(
    args: argparse.Namespace, workdir: Path, settings: OperatorSettings, node: Node, docs: list[dict]
) -> contextlib.AbstractAsyncContextManager[backends.Cluster]:
    """The cluster the demo runs on: the in-process API, the server of --kubeconfig, or one started here."""
    if getattr(args, "kubeconfig", None):
        shared = bool(getattr(args, "allow_shared_cluster", False))
        return backends.on_server(Path(args.kubeconfig).resolve(), workdir, settings, node, docs, shared=shared)
    if getattr(args, "real", False):
        return _on_own_control_plane(workdir, settings, node, docs)
    return backends.in_process(workdir, args.port, settings, node, docs)


@contextlib.asynccontextmanager
async def _on_own_control_plane(
    workdir: Path, settings: OperatorSettings, node: Node, docs: list[dict]
) -> AsyncIterator[backends.Cluster]:
    state = workdir / "control-plane"
    shutil.rmtree(state, ignore_errors=True)  # a control plane's folder is used once
    async with (
        backends.started_control_plane(state) as plane,
        backends.on_server(plane.kubeconfig, workdir, settings, node, docs, restricted=True) as cluster,
    ):
        yield cluster


async def run(args: argparse.Namespace, stop: asyncio.Event, own_signals: bool = False) -> Outcome:
    """The pipeline; with `own_signals`, Ctrl-C and SIGTERM set `stop` at any point."""
    if own_signals:
        _stop_on_signals(stop)
    _prerequisites(args)
    workdir = Path(args.workdir).resolve()
    data = workdir / "data"
    _clear_runs(data)
    shutil.rmtree(workdir / "node", ignore_errors=True)
    data.mkdir(parents=True, exist_ok=True)
    out = Outcome(data_dir=data)
    print(f"making a tiny Gemma 4 and a chat dataset in {data}", flush=True)
    await asyncio.to_thread(_make_data, data)

    # The local node is tainted: the operator tolerates the taint on every pod it makes (confinement.py).
    settings = OperatorSettings(progress_poll_seconds=1.0, pod_tolerations=[confinement.TOLERATION])
    # Each "image" is a virtual environment; absolute, as pods run in their own folders.
    images = {
        settings.images.workloads: Path(sys.executable).parent.absolute(),
        settings.images.serving_cpu: Path(args.vllm_python).parent.absolute(),
    }
    node = Node(workdir / "node", images, {DATA_CLAIM: data})
    docs = [d for f in sorted(Path(args.examples).glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    try:
        async with _backend(args, workdir, settings, node, docs) as cluster:
            if own_signals:
                _stop_on_signals(stop)  # kopf took the signals over for the operator alone: take them back
            out = await _demo(cluster, docs, args, stop, out)
    except (backends.BackendError, install.InstallError, operator_process.OperatorFailed) as e:
        raise DevError(str(e)) from None
    finally:
        stop.set()
    return out


async def _demo(
    cluster: backends.Cluster, docs: list[dict], args: argparse.Namespace, stop: asyncio.Event, out: Outcome
) -> Outcome:
    """Apply the quickstart, follow it to the served answers, sum up."""
    if stop.is_set():  # stopped while the cluster was being set up
        return out
    table = Table()
    started = time.monotonic()
    for doc in docs:
        await cluster.apply(doc)
    applied = ", ".join(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
    print(
        f"applied {applied} to {cluster.kind}\n(kubectl works meanwhile: export KUBECONFIG={cluster.kubeconfig})\n",
        flush=True,
    )
    table.header()
    out = await _follow(cluster, docs, table, stop, args.timeout, out)
    out.total_seconds = (out.answered_at or time.monotonic()) - started  # the benchmark's figures come after
    out.phases = table.durations()
    if not out.answers:  # stopped before the end
        return out
    _summary(out, cluster)
    if args.keep_running and not stop.is_set():
        print(
            f"\nthe cluster keeps running (Ctrl-C stops it):\n  export KUBECONFIG={cluster.kubeconfig}\n  kubectl get gft,gsv"
            + (f"\n  curl {out.endpoint}/models" if out.endpoint else ""),
            flush=True,
        )
        await stop.wait()
    return out


async def _follow(
    cluster: backends.Cluster, docs: list[dict], table: Table, stop: asyncio.Event, timeout: float, out: Outcome
) -> Outcome:
    kube = cluster.kube
    deadline = time.monotonic() + timeout
    objs: list[dict] = []
    while not stop.is_set():
        try:
            objs = await _demo_objects(kube, docs)
            crash = await _crash_loop(kube, docs)
            port = await _serving_port(kube, _fine_tunes_server(objs))
        except ApiError as e:
            if not e.transient:  # a busy or restarting server: asked again in a moment
                raise DevError(f"the API server refused the demo's request: {e}") from None
            await asyncio.sleep(0.5)
            continue
        table.update(objs)
        out.fine_tune = next((o for o in objs if o["kind"] == api.FINETUNE.kind), None)
        out.serve = _fine_tunes_server(objs)
        if crash:
            raise DevError(crash + _failure_details(cluster, {"metadata": {"name": crash.split()[1]}}))
        for obj in objs:
            if (obj.get("status") or {}).get("phase") == "Failed":
                raise DevError(
                    f"{obj['kind']} {obj['metadata']['name']} failed: {obj['status'].get('message')}"
                    + _failure_details(cluster, obj)
                )
        if port and out.serve:
            return await _answers(kube, port, stop, deadline, out)
        if time.monotonic() > deadline:
            raise DevError(
                f"not done after {timeout:.0f} s; last states: "
                + "; ".join(
                    f"{o['kind']}/{o['metadata']['name']} {(o.get('status') or {}).get('phase')}: {(o.get('status') or {}).get('message')}"
                    for o in objs
                )
            )
        await asyncio.sleep(0.5)
    return out


def _fine_tunes_server(objs: list[dict]) -> dict | None:
    """The GemmaServe of the quickstart's fine-tune."""
    return next((o for o in objs if o["kind"] == api.SERVE.kind and "fineTuneRef" in o["spec"]["model"]), None)


async def _answers(kube: Kube, port: int, stop: asyncio.Event, deadline: float, out: Outcome) -> Outcome:
    """Every demo question asked of the served fine-tune, then the serving benchmark's figures."""
    assert out.serve is not None, "answers are asked once the fine-tune's server is Ready"
    out.ready_at = ready = time.monotonic()
    out.endpoint = f"http://127.0.0.1:{port}/v1"
    base = _base_answers(out.data_dir, out.fine_tune) if out.data_dir and out.fine_tune else {}
    try:
        out.answers = await asyncio.to_thread(_ask_all, port, out.serve, base)
    except (urllib.error.URLError, OSError, KeyError) as e:
        raise DevError(f"the served model did not answer: {e}") from None
    out.answered_at = time.monotonic()
    _print_answers(out.answers)
    out.benchmark = await _benchmark(kube, out.serve, stop, deadline)
    out.benchmark_seconds = time.monotonic() - ready
    return out


async def _benchmark(kube: Kube, serve: dict, stop: asyncio.Event, deadline: float) -> dict[str, Any] | None:
    """The served revision's benchmark (spec.benchmark), once its Job has finished."""
    if not (serve.get("spec") or {}).get("benchmark"):
        return None
    meta = serve["metadata"]
    while not stop.is_set() and time.monotonic() < deadline:
        st = ((await kube.get(api.SERVE.kind, meta["namespace"], meta["name"])) or {}).get("status") or {}
        figures = st.get("benchmark") or {}
        if figures.get("revision") == st.get("revision") and figures.get("state") in ("Succeeded", "Failed"):
            return figures
        await asyncio.sleep(0.5)
    return None


async def _demo_objects(kube: Kube, docs: list[dict]) -> list[dict]:
    """The demo's own CRs as they are now: a cluster may hold others, which are none of its business."""
    wanted = {(d["kind"], d["metadata"].get("namespace") or "default", d["metadata"]["name"]) for d in docs}
    found = []
    for namespace in install.namespaces(docs):
        found += await kube.list(api.FINETUNE.kind, namespace) + await kube.list(api.SERVE.kind, namespace)
    return [o for o in found if (o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]) in wanted]


async def _crash_loop(kube: Kube, docs: list[dict]) -> str | None:
    """A pod of the demo whose container keeps exiting: on this machine that will not fix itself."""
    pods = [p for ns in install.namespaces(docs) for p in await kube.list("Pod", ns)]
    for pod in (p for p in pods if confinement.tolerates(p)):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if (cs.get("state") or {}).get("waiting", {}).get("reason") == "CrashLoopBackOff":
                last = (cs.get("lastState") or {}).get("terminated") or {}
                return f"pod {pod['metadata']['name']} keeps crashing (exit code {last.get('exitCode')})"
    return None


def _summary(out: Outcome, cluster: backends.Cluster) -> None:
    print("\nwall time per phase:", flush=True)
    for name, phase, seconds in out.phases:
        if phase != "-":  # before the operator's first status
            print(f"  {name:<34} {phase:<16} {seconds:6.1f} s")
    print(f"  {'apply -> served answers':<51} {out.total_seconds:6.1f} s")
    st = (out.fine_tune or {}).get("status") or {}
    outputs = st.get("outputs") or {}
    local = lambda p: p.replace("/data", str(out.data_dir), 1) if p and p.startswith("/data") else p  # noqa: E731
    figures = (st.get("evaluation") or {}).get("metrics") or []
    if figures:
        rows = max(m.get("rows", 0) for m in figures)
        print(f"\nevaluation on the {rows} demo questions (fine-tuned, base model):")
        for m in figures:
            base = f"{m['baseline']:10.4g}" if m.get("baseline") is not None else ""
            print(f"  {m['name']:<12} {m['value']:10.4g} {base}")
    gate = next(
        (c for c in ((out.serve or {}).get("status") or {}).get("conditions") or [] if c["type"] == "GatePassed"), None
    )
    if gate:
        print(f"rollout gate: {'passed' if gate['status'] == 'True' else 'blocked'}: {gate.get('message', '')}")
    if out.benchmark:
        b = out.benchmark
        spec = ((out.serve or {}).get("spec") or {}).get("benchmark") or {}
        load = ", ".join(
            f"{k} {spec[k]}" for k in ("numPrompts", "inputLen", "outputLen", "maxConcurrency") if k in spec
        )
        print(f"\nserving benchmark of revision {b['revision']} (vllm bench serve: {load}):")
        if b["state"] == "Succeeded":
            print(f"  {benchmark_results.describe(b)}; figures {out.benchmark_seconds:.1f} s after Ready")
        else:
            print(f"  failed: {b.get('message')}")
    print("\nartifacts:")
    print(f"  LoRA checkpoint  {local(outputs.get('checkpoint'))}")
    print(f"  merged model     {local(outputs.get('merged'))}")
    print(f"  endpoint         {out.endpoint} (model {((out.serve or {}).get('status') or {}).get('servedModelName')})")
    print(f"  API server       {cluster.url}", flush=True)
    if cluster.operator_log:
        print(f"  operator log     {cluster.operator_log}", flush=True)


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


def main(args: argparse.Namespace) -> int:
    try:
        out = asyncio.run(run(args, asyncio.Event(), own_signals=True))
    except DevError as e:
        print(f"\ngemma-tpu dev: {e}", file=sys.stderr)
        return 1
    if not out.answers:
        print("\ngemma-tpu dev: stopped; every process it started has exited", file=sys.stderr)
        return 130
    return 0
