"""How the operator scales: N GemmaFineTunes at once against the in-process Kubernetes API.

The API server runs in this process; the operator runs as `gemma-tpu operator` in its own
process (as in a cluster), so its memory is measured alone. Prints the time until every training
Job (and every GemmaServe's Deployment) exists, the create->Job latency percentiles, the operator's
peak RSS, the share of the operator's creates answered 409 AlreadyExists (wasted writes: under
throttling they are the ones that get the 429s), during the burst and in steady state (every CR
re-reconciled once more), and, in the same run, a bare client creating the same ConfigMap + Job
pairs itself (the API's own limit).

--poll-reads N starts another operator with a short poll period, sets N fine-tunes training (a
running pod with a progress line each), and counts the operator's reads (get, list; watches
aside) for a while: reads per CR per minute, and per CR per poll, what a cluster's API server pays
for live progress.

With --fault-rate, the in-process API fails that share of the operator's writes (500 before or
after the write, 429 with Retry-After), closes its watches every few seconds and answers some
resumes 410, and the operator polls at its default period: the figures then include the time
until every CR's status records its children (statuses that tell the truth).

    python benchmarks/operator_scale.py --count 1000
    python benchmarks/operator_scale.py --count 20 --fault-rate 0.2
    python benchmarks/operator_scale.py --count 0 --poll-reads 100
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kmock
import psutil
import yaml

from gemma_devcluster.faults import FaultyApiServer
from gemma_operator.children import training_objects
from gemma_operator.kube import USER_AGENT, Kube
from gemma_operator.plan import plan_finetune
from gemma_operator.settings import OperatorSettings
from gemma_workloads.config import Progress

BENCH_AGENT = "operator-scale-benchmark"  # this script's own requests, told apart from the operator's


def fine_tune(name: str, namespace: str) -> dict:
    return {
        "apiVersion": "gemma-tpu.dev/v1alpha1",
        "kind": "GemmaFineTune",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"uri": "gs://models/gemma-4-31B-it", "preset": "gemma4-31b"},
            "dataset": {"uri": "gs://data/train.jsonl", "maxSeqLen": 3072},
            "output": {"uri": f"gs://out/{name}"},
            "training": {"steps": 1000},
            "lora": {"rank": 64, "alpha": 64},
            "tpu": {"accelerator": "v5p", "topology": "2x2x1"},
        },
    }


def serve(name: str, namespace: str) -> dict:
    return {
        "apiVersion": "gemma-tpu.dev/v1alpha1",
        "kind": "GemmaServe",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"model": {"uri": "gs://models/merged"}},
    }


class Timed(FaultyApiServer):
    """Notes when each object is created, to measure create -> child latency, and counts the
    operator's creates and those answered 409 AlreadyExists."""

    created: dict[tuple[str, str], float]
    creates: collections.Counter

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.created, self.creates = {}, collections.Counter()

    async def _create(self, request):
        mine = (request.headers.get("User-Agent") or "").startswith(USER_AGENT)
        self.creates["all"] += mine
        try:
            response = await super()._create(request)
        except kmock.KubernetesError as e:
            self.creates["409"] += mine and e.status == 409
            raise
        meta = response.payload["metadata"]
        self.created[(request.resource.plural, meta["name"])] = time.perf_counter()
        return response


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def create_all(kube: Kube, objects: list[dict], concurrency: int) -> None:
    queue = list(objects)

    async def worker() -> None:
        while queue:
            await kube.create(queue.pop())

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def share(counts: collections.Counter, before: collections.Counter) -> str:
    total, conflicts = counts["all"] - before["all"], counts["409"] - before["409"]
    return f"{conflicts}/{total} ({100 * conflicts / max(total, 1):.1f} %)"


async def settle(api: Timed, quiet: float = 1.0) -> None:
    """Wait until the operator has made no request for `quiet` seconds."""
    last, since = -1, time.perf_counter()
    while time.perf_counter() - since < quiet:
        made = sum(sum(c.values()) for agent, c in api.calls_by_agent.items() if agent.startswith(USER_AGENT))
        if made != last:
            last, since = made, time.perf_counter()
        await asyncio.sleep(0.1)


async def truthful(kube: Kube, crs: list[dict], limit: float) -> float | None:
    """Seconds until every CR's status records its children (None: not within `limit`)."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit:
        lying = 0
        for kind, done in (
            ("GemmaFineTune", lambda st: (st.get("children") or {}).get("training")),
            ("GemmaServe", lambda st: st.get("phase") == "Deploying"),
        ):
            lying += sum(not done(o.get("status") or {}) for o in await kube.list(kind, "bench"))
        if not lying:
            return time.perf_counter() - start
        await asyncio.sleep(0.5)
    return None


def start_operator(url: str, workdir: Path, settings: dict) -> subprocess.Popen:
    """`gemma-tpu operator` in its own process, against the API at `url`."""
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "bench",
                "clusters": [{"name": "bench", "cluster": {"server": url}}],
                "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
                "users": [{"name": "bench", "user": {"token": "bench"}}],
            }
        )
    )
    path = workdir / "settings.yaml"
    path.write_text(yaml.safe_dump(settings))
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gemma_operator.cli",
            "operator",
            "--standalone",
            "--liveness",
            "",
            "--metrics-port",
            "0",
            "--settings",
            str(path),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "operator.log").open("w"),
    )


async def terminate(proc: subprocess.Popen) -> None:
    proc.terminate()  # the API server shares this loop: keep serving while kopf shuts down
    for _ in range(600):
        if proc.poll() is not None:
            return
        await asyncio.sleep(0.05)
    proc.kill()


async def run_operator(api: Timed, count: int, concurrency: int, workdir: Path) -> dict:
    url = str(api.url).rstrip("/")
    faulty = api.write_fault_rate > 0  # then the poller runs at its default period, as on a cluster
    proc = start_operator(url, workdir, {} if faulty else {"progress_poll_seconds": 3600})  # events, not polling
    peak = 0
    kube = Kube.from_url(url, user_agent=BENCH_AGENT)
    try:
        ps = psutil.Process(proc.pid)
        await asyncio.sleep(3)  # let kopf log in and start its watches
        baseline_rss = ps.memory_info().rss
        serves = max(1, count // 10)
        crs = [fine_tune(f"ft-{i:05d}", "bench") for i in range(count)]
        crs += [serve(f"sv-{i:05d}", "bench") for i in range(serves)]
        start = time.perf_counter()
        await create_all(kube, crs, concurrency)
        created = time.perf_counter() - start
        plurals = collections.Counter(plural for (plural, _) in api.created)
        while plurals["jobs"] < count or plurals["deployments"] < serves:
            peak = max(peak, ps.memory_info().rss)
            if proc.poll() is not None:
                raise RuntimeError("the operator exited:\n" + (workdir / "operator.log").read_text()[-3000:])
            await asyncio.sleep(0.05)
            plurals = collections.Counter(plural for (plural, _) in api.created)
        total = time.perf_counter() - start
        peak = max(peak, ps.memory_info().rss)
        statuses = await truthful(kube, crs, 120) if faulty else None
        await settle(api)
        burst = collections.Counter(api.creates)
        for cr in crs:  # steady state: each CR reconciled once more, its children all there
            await kube.patch(cr["kind"], "bench", cr["metadata"]["name"], {"metadata": {"labels": {"touched": "1"}}})
        await settle(api)
    finally:
        await terminate(proc)
    latencies = []
    for (plural, name), t in api.created.items():
        if plural == "jobs":
            cr = name.rsplit("-train-", 1)[0]
            latencies.append(t - api.created[("gemmafinetunes", cr)])
    return {
        "created_s": created,
        "total_s": total,
        "latencies": latencies,
        "rss_idle": baseline_rss,
        "rss_peak": peak,
        "burst_409": share(burst, collections.Counter()),
        "steady_409": share(api.creates, burst),
        "statuses_s": statuses,
    }


def operator_reads(api: Timed) -> tuple[int, int]:
    """The operator's reads so far (get, list), and its polls (each lists the GemmaFineTunes)."""
    calls = [
        (call, n)
        for agent, made in api.calls_by_agent.items()
        if agent.startswith(USER_AGENT)
        for call, n in made.items()
    ]
    reads = sum(n for call, n in calls if call.verb in ("get", "list"))
    polls = sum(n for call, n in calls if call.verb == "list" and call.resource == "gemmafinetunes")
    return reads, polls


async def next_poll(api: Timed, at_least: int = 0) -> tuple[int, int]:
    """Wait for a poll to start (the `at_least`-th, or the next); the reads made before it."""
    _, polls = operator_reads(api)
    target = max(at_least, polls + 1)
    while True:
        reads, polls = operator_reads(api)
        if polls >= target:
            return reads, polls
        await asyncio.sleep(0.01)


async def poll_reads(api: Timed, count: int, period: float, polls_wanted: int, workdir: Path) -> dict:
    """The operator's reads while `count` fine-tunes train, each with a running pod whose log
    moves on between polls (so each poll has progress to write)."""
    url = str(api.url).rstrip("/")
    proc = start_operator(url, workdir, {"progress_poll_seconds": period})
    kube = Kube.from_url(url, user_agent=BENCH_AGENT)
    try:
        await asyncio.sleep(3)  # let kopf log in and start its watches
        crs = [fine_tune(f"tr-{i:05d}", "train") for i in range(count)]
        await create_all(kube, crs, 8)
        jobs = []
        while len(jobs) < count:
            if proc.poll() is not None:
                raise RuntimeError("the operator exited:\n" + (workdir / "operator.log").read_text()[-3000:])
            await asyncio.sleep(0.2)
            jobs = await kube.list("Job", "train")
        pods = []
        for job in jobs:
            name = job["metadata"]["name"]
            pod = await kube.create(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{name}-0",
                        "namespace": "train",
                        "labels": {
                            "batch.kubernetes.io/job-name": name,
                            "batch.kubernetes.io/job-completion-index": "0",
                        },
                    },
                    "spec": {"containers": [{"name": "trainer", "image": "img"}]},
                }
            )
            status = {"phase": "Running", "containerStatuses": [{"name": "trainer", "state": {"running": {}}}]}
            await kube.patch("Pod", "train", pod["metadata"]["name"], {"status": status}, status=True)
            await kube.patch("Job", "train", name, {"status": {"active": 1, "ready": 1}}, status=True)
            pods.append(pod["metadata"]["name"])
        step = 0

        async def progress() -> None:
            nonlocal step
            while True:
                step += 1
                for pod in pods:
                    api.pod_logs[("train", pod)] = Progress(step=step, total_steps=1000, loss=1.0).line()
                await asyncio.sleep(period)

        mover = asyncio.create_task(progress())
        await asyncio.sleep(3 * period)  # every CR Training, its status written at least once
        # Whole polls only: from the start of one (its list of GemmaFineTunes) to the start of another.
        reads_before, polls_before = await next_poll(api)
        start = time.perf_counter()
        reads, polls = await next_poll(api, polls_before + polls_wanted)
        reads, polls, seconds = reads - reads_before, polls - polls_before, time.perf_counter() - start
        mover.cancel()
        training = sum(
            (o.get("status") or {}).get("phase") == "Training" for o in await kube.list("GemmaFineTune", "train")
        )
    finally:
        await terminate(proc)
    return {"reads": reads, "polls": polls, "seconds": seconds, "training": training}


async def run_bare(api: Timed, count: int, concurrency: int) -> dict:
    """A client that creates what the operator would, with no reconciling: the API's ceiling."""
    kube = Kube.from_url(str(api.url), user_agent=BENCH_AGENT)
    settings = OperatorSettings()
    objects = []
    for i in range(count):
        cr = fine_tune(f"bare-{i:05d}", "bare")
        p = plan_finetune(cr["metadata"]["name"], "bare", cr["spec"], settings)
        objects += training_objects(p, settings)
    start = time.perf_counter()
    queue = [objects[i : i + 2] for i in range(0, len(objects), 2)]

    async def worker() -> None:
        while queue:
            for obj in queue.pop():
                await kube.create(obj)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"total_s": time.perf_counter() - start}


async def main(count: int, concurrency: int, fault_rate: float, poll_count: int, poll_period: float) -> None:
    faults = dict(write_fault_rate=fault_rate, watch_lifetime=5.0, expire_rate=0.2) if fault_rate else {}
    async with Timed(**faults) as api, kmock.Server(api):
        api.register_defaults()
        if count:
            with tempfile.TemporaryDirectory() as tmp:
                op = await run_operator(api, count, concurrency, Path(tmp))
            api.calm()
            bare = await run_bare(api, count, concurrency)
            report(op, bare, api, count, concurrency, fault_rate)
        if poll_count:
            with tempfile.TemporaryDirectory() as tmp:
                polled = await poll_reads(api, poll_count, poll_period, 5, Path(tmp))
            per_minute = polled["reads"] / poll_count / (polled["seconds"] / 60)
            print(f"GemmaFineTunes training:        {polled['training']}/{poll_count}, polled every {poll_period:g} s")
            per_poll = polled["reads"] / poll_count / max(polled["polls"], 1)
            print(
                f"operator: reads per CR          {per_minute:.1f} per minute, {per_poll:.2f} per poll "
                f"({polled['reads']} reads, {polled['polls']} polls in {polled['seconds']:.0f} s)"
            )


def report(op: dict, bare: dict, api: Timed, count: int, concurrency: int, fault_rate: float) -> None:
    lat = op["latencies"]
    print(f"GemmaFineTunes:                 {count} (created by {concurrency} concurrent clients)")
    print(
        f"operator: all training Jobs in  {op['total_s']:.2f} s ({count / op['total_s']:.0f} CRs/s; CR creation took {op['created_s']:.2f} s)"
    )
    print(
        f"operator: create->Job latency   p50 {statistics.median(lat) * 1000:.0f} ms, p99 {percentile(lat, 0.99) * 1000:.0f} ms, max {max(lat) * 1000:.0f} ms"
    )
    print(
        f"operator: RSS                   {op['rss_idle'] / 2**20:.0f} MiB idle, {op['rss_peak'] / 2**20:.0f} MiB peak"
    )
    if fault_rate:
        truth = f"{op['statuses_s']:.1f} s later" if op["statuses_s"] is not None else "NOT within 120 s"
        injected = sum(api.injected.values())
        print(
            f"faults injected:                {injected} ({fault_rate:.0%} of the operator's writes, watch drops, 410s)"
        )
        print(f"operator: every status records its children {truth}")
    print(
        f"operator: creates answered 409  {op['burst_409']} until every child exists, "
        f"{op['steady_409']} in steady state"
    )
    print(f"bare client: same objects in    {bare['total_s']:.2f} s ({count / bare['total_s']:.0f} pairs/s)")
    print(f"ratio operator/bare (time):     {op['total_s'] / bare['total_s']:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--fault-rate", type=float, default=0.0, help="share of the operator's writes failed")
    parser.add_argument("--poll-reads", type=int, default=0, metavar="N", help="fine-tunes training while polled")
    parser.add_argument("--poll-period", type=float, default=2.0, help="seconds between polls for --poll-reads")
    args = parser.parse_args()
    asyncio.run(main(args.count, args.concurrency, args.fault_rate, args.poll_reads, args.poll_period))
