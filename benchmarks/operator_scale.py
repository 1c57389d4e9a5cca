"""How the operator scales: N GemmaFineTunes at once, against the in-process Kubernetes API or
(`--real`) against a real kube-apiserver.

The operator runs as `gemma-tpu operator` in its own process (as in a cluster), so its memory and
CPU are measured alone. Prints the time until every training Job (and every GemmaServe's
Deployment) exists, the create->Job latency percentiles, the operator's RSS (idle, peak, after the
1,000th Job and at the end, after every CR was reconciled once more: memory that grows with
history shows there) and its CPU time during the burst, the share of the operator's creates
answered 409 AlreadyExists (wasted writes: under throttling they are the ones that get the 429s),
during the burst and in steady state (every CR re-reconciled once more). Then, in the same run and
on the same server, two baselines (api_baselines.py): a bare client creating each fine-tune's
ConfigMap + Job pair, and one making every write of the operator's first reconciles (the CRs
themselves, their children, first statuses and Events): what those writes alone cost the API.

The in-process API runs in this process. With --real the benchmark starts the project's control
plane (kube-apiserver and kube-controller-manager 1.36 on loopback, `gemma_devcluster.control_plane`;
its setup and how it is measured from outside are in real_api.py) and runs the same burst there;
the real Job controller makes a pod for every Job (they stay Pending: no scheduler).

--profile FILE records the operator process with py-spy (which must be on PATH: it is not one of
the project's dependencies) from the first CR created to the last Job, writes its samples to FILE
and prints where the operator's CPU went (operator_profile.py).

--poll-reads N starts another operator with a short poll period, sets N fine-tunes training (a
running pod with a progress line each), and counts the operator's reads (get, list; watches
aside) for a while: reads per CR per minute, and per CR per poll, what a cluster's API server pays
for live progress.

With --fault-rate, the in-process API fails that share of the operator's writes (500 before or
after the write, 429 with Retry-After), closes its watches every few seconds and answers some
resumes 410, and the operator polls at its default period: the figures then include the time
until every CR's status records its children (statuses that tell the truth).

    python benchmarks/operator_scale.py --count 1000
    python benchmarks/operator_scale.py --count 1000 --real
    python benchmarks/operator_scale.py --count 10000 --no-steady
    python benchmarks/operator_scale.py --count 10000 --real --no-steady --no-baselines
    python benchmarks/operator_scale.py --count 1000 --profile operator.raw
    python benchmarks/operator_scale.py --count 20 --fault-rate 0.2
    python benchmarks/operator_scale.py --count 0 --poll-reads 100
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib
import os
import shutil
import signal
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
from gemma_operator.kube import USER_AGENT, Kube
from gemma_workloads.config import Progress

BENCH_AGENT = "operator-scale-benchmark"  # this script's own requests, told apart from the operator's
MILESTONE = 1000  # the operator's RSS is noted when this many training Jobs exist
STALL = 120  # seconds without a new child before the benchmark gives up


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
    """Notes when each object is created, to measure create -> child latency, counts what was
    created by kind, and counts the operator's requests, its creates and those answered 409."""

    created: dict[tuple[str, str], float]
    creates: collections.Counter
    made: collections.Counter

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.created, self.creates, self.made = {}, collections.Counter(), collections.Counter()
        self.operator_requests = 0

    def _record(self, verb: str, request) -> None:
        super()._record(verb, request)
        self.operator_requests += (request.headers.get("User-Agent") or "").startswith(USER_AGENT)

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
        self.made[request.resource.plural] += 1
        return response


class InProcess:
    """The in-process API of this process as the benchmark's backend."""

    name = "in-process API (gemma_devcluster, in the benchmark's process)"
    server_cpu_of = "this process: the API and the client creating the CRs"

    def __init__(self, api: Timed) -> None:
        self.api, self.url = api, str(api.url).rstrip("/")
        self.kube = Kube.from_url(self.url, user_agent=BENCH_AGENT)
        self.created = api.created  # noted by the server as it stores each object
        self.faulty = api.write_fault_rate > 0

    def kubeconfig(self, workdir: Path) -> Path:
        path = workdir / "kubeconfig"
        cluster = {"name": "bench", "cluster": {"server": self.url}}
        context = {"name": "bench", "context": {"cluster": "bench", "user": "bench"}}
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "bench", "clusters": [cluster]}
        path.write_text(
            yaml.safe_dump(config | {"contexts": [context], "users": [{"name": "bench", "user": {"token": "bench"}}]})
        )
        return path

    def count(self, plural: str) -> int:
        return self.api.made[plural]

    def note(self, obj: dict) -> None:
        pass

    def operator_creates(self) -> collections.Counter:
        return collections.Counter(self.api.creates)

    def operator_requests(self) -> int:
        return self.api.operator_requests

    def server_cpu(self) -> float:
        """CPU seconds of this process: the API server, and the benchmark's client creating the CRs."""
        return sum(psutil.Process().cpu_times()[:2])

    async def settle(self, quiet: float = 1.0) -> bool:
        """Wait until the operator has made no request for `quiet` seconds."""
        last, since = -1, time.perf_counter()
        while time.perf_counter() - since < quiet:
            if self.api.operator_requests != last:
                last, since = self.api.operator_requests, time.perf_counter()
            await asyncio.sleep(0.1)
        return True

    def bare_kube(self) -> Kube:
        return Kube.from_url(self.url, user_agent=BENCH_AGENT)

    async def before_baseline(self, count: int, namespace: str) -> float:
        self.api.calm()
        return 0.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def create_all(kube: Kube, objects: list[dict], concurrency: int, note=None) -> None:
    queue = list(reversed(objects))

    async def worker() -> None:
        while queue:
            obj = queue.pop()
            await kube.create(obj)
            if note:
                note(obj)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def touch_all(kube: Kube, crs: list[dict], concurrency: int) -> None:
    """A label on every CR: each is reconciled once more, its children all there (steady state)."""
    queue = list(crs)

    async def worker() -> None:
        while queue:
            cr = queue.pop()
            await kube.patch(
                cr["kind"],
                cr["metadata"]["namespace"],
                cr["metadata"]["name"],
                {"metadata": {"labels": {"touched": "1"}}},
            )

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def share(counts: collections.Counter, before: collections.Counter) -> str:
    total, conflicts = counts["all"] - before["all"], counts["409"] - before["409"]
    return f"{conflicts}/{total} ({100 * conflicts / max(total, 1):.1f} %)"


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


def start_operator(kubeconfig: Path, workdir: Path, settings: dict) -> subprocess.Popen:
    """`gemma-tpu operator` in its own process, with this kubeconfig."""
    path = workdir / "settings.yaml"
    path.write_text(yaml.safe_dump(settings))
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    command = ["operator", "--standalone", "--liveness", "", "--metrics-port", "0", "--settings", str(path)]
    return subprocess.Popen(
        [sys.executable, "-m", "gemma_operator.cli", *command],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "operator.log").open("w"),
    )


async def terminate(proc: subprocess.Popen) -> None:
    proc.terminate()  # the in-process API server shares this loop: keep serving while kopf shuts down
    for _ in range(600):
        if proc.poll() is not None:
            return
        await asyncio.sleep(0.05)
    proc.kill()


class Profiler:
    """py-spy recording a process, from `start()` to `stop()` (operator_profile.py reads its samples)."""

    def __init__(self, out: Path | None) -> None:
        self.out, self._proc = out, None
        if out is not None and shutil.which("py-spy") is None:
            raise SystemExit("--profile needs py-spy on PATH (pip install py-spy): it is not a project dependency")

    def start(self, pid: int) -> None:
        if self.out is not None:
            command = ["py-spy", "record", "--pid", str(pid), "--rate", "100", "--gil", "--format", "raw"]
            self._proc = subprocess.Popen(
                [*command, "--output", str(self.out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)  # py-spy writes its samples and exits
            self._proc.wait()


async def run_operator(
    backend, count: int, concurrency: int, workdir: Path, profiler: Profiler, steady: bool = True
) -> dict:
    # With faults the poller runs at its default period, as on a cluster; else events alone, no polling.
    proc = start_operator(
        backend.kubeconfig(workdir), workdir, {} if backend.faulty else {"progress_poll_seconds": 3600}
    )
    serves = max(1, count // 10)
    crs = burst_of(count, "bench")
    try:
        ps = psutil.Process(proc.pid)
        await asyncio.sleep(5)  # let kopf log in and start its watches
        rss = {"idle": ps.memory_info().rss, "peak": 0, "milestone": None}
        cpu, server_cpu = sum(ps.cpu_times()[:2]), backend.server_cpu()
        profiler.start(proc.pid)
        start = time.perf_counter()
        await create_all(backend.kube, crs, concurrency, backend.note)
        created = time.perf_counter() - start
        progress, since = 0, time.perf_counter()
        while backend.count("jobs") < count or backend.count("deployments") < serves:
            if backend.count("jobs") + backend.count("deployments") > progress:
                progress, since = backend.count("jobs") + backend.count("deployments"), time.perf_counter()
            elif time.perf_counter() - since > STALL:
                raise RuntimeError(f"no new Job for {STALL} s:\n" + (workdir / "operator.log").read_text()[-3000:])
            rss["peak"] = max(rss["peak"], ps.memory_info().rss)
            if rss["milestone"] is None and backend.count("jobs") >= MILESTONE:
                rss["milestone"] = ps.memory_info().rss
            if proc.poll() is not None:
                raise RuntimeError("the operator exited:\n" + (workdir / "operator.log").read_text()[-3000:])
            await asyncio.sleep(0.05)
        total = time.perf_counter() - start
        profiler.stop()
        cpu, server_cpu = sum(ps.cpu_times()[:2]) - cpu, backend.server_cpu() - server_cpu
        requests = backend.operator_requests()
        if rss["milestone"] is None and count >= MILESTONE:
            rss["milestone"] = ps.memory_info().rss
        rss["peak"] = max(rss["peak"], ps.memory_info().rss)
        statuses = await truthful(backend.kube, crs, 120) if backend.faulty else None
        settled = await backend.settle()
        in_burst = backend.operator_creates()
        if steady:
            await touch_all(backend.kube, crs, concurrency)
            settled = await backend.settle() and settled
        rss["end"] = ps.memory_info().rss
        rss["peak"] = max(rss["peak"], rss["end"])
    finally:
        profiler.stop()
        await terminate(proc)
    latencies = []
    for (plural, name), t in list(backend.created.items()):
        if plural == "jobs" and ("gemmafinetunes", name.rsplit("-train-", 1)[0]) in backend.created:
            latencies.append(t - backend.created[("gemmafinetunes", name.rsplit("-train-", 1)[0])])
    return {
        "created_s": created,
        "total_s": total,
        "cpu_s": cpu,
        "server_cpu_s": server_cpu,
        "server_cpu_of": backend.server_cpu_of,
        "requests": requests,
        "latencies": latencies,
        "rss": rss,
        "burst_409": share(in_burst, collections.Counter()),
        "steady_409": share(backend.operator_creates(), in_burst) if steady else None,
        "settled": settled,
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
    backend = InProcess(api)
    proc = start_operator(backend.kubeconfig(workdir), workdir, {"progress_poll_seconds": period})
    kube = backend.kube
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


async def scale(backend, args: argparse.Namespace) -> None:
    """The operator's burst, then the API's own baselines (api_baselines.py), on one backend;
    prints the figures."""
    print(f"API server:                     {backend.name}")
    print(f"load average before:            {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        op = await run_operator(
            backend, args.count, args.concurrency, Path(tmp), Profiler(args.profile), not args.no_steady
        )
    report(op, args)  # at once: a long run that is stopped later still says what it measured
    if args.no_baselines:
        return
    firsts: dict[str, dict] = {}  # the first CR of each kind, whose status the operator wrote
    for cr in burst_of(args.count, "bench"):
        firsts.setdefault(cr["kind"], cr)
    statuses = {}
    for kind, cr in firsts.items():
        meta = cr["metadata"]
        statuses[kind] = ((await backend.kube.get(kind, meta["namespace"], meta["name"])) or {}).get("status") or {}
    baselines = _beside("api_baselines")
    waited = await backend.before_baseline(args.count, "bench")
    bare = await baselines.bare_pairs(backend.bare_kube(), burst_of(args.count, "bare"), args.concurrency)
    waited += await backend.before_baseline(args.count, "bare")
    crs = burst_of(args.count, "writes")
    writes = await baselines.same_writes(backend.bare_kube(), crs, args.concurrency, statuses)
    report_bare(op, bare, writes, args, waited)
    print(f"load average after:             {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.profile:
        print(f"\nwhere the operator's CPU went during the burst, {args.profile}:")
        _beside("operator_profile").report(args.profile, args.count + max(1, args.count // 10), op["cpu_s"])


def burst_of(count: int, namespace: str) -> list[dict]:
    """The CRs of a burst: `count` GemmaFineTunes and a GemmaServe for every ten."""
    crs = [fine_tune(f"ft-{i:05d}", namespace) for i in range(count)]
    return crs + [serve(f"sv-{i:05d}", namespace) for i in range(max(1, count // 10))]


def _beside(module: str):
    """A module of benchmarks/, beside this file (on the path when this runs as a script)."""
    try:
        return importlib.import_module(f"benchmarks.{module}")
    except ImportError:
        return importlib.import_module(module)


def _mib(value: float | None) -> str:
    return f"{value / 2**20:.0f} MiB" if value is not None else "n/a"


def report(op: dict, args: argparse.Namespace) -> None:
    lat, count, rss = op["latencies"], args.count, op["rss"]
    crs = count + max(1, count // 10)
    print(
        f"GemmaFineTunes:                 {count} and {crs - count} GemmaServes (created by {args.concurrency} concurrent clients)"
    )
    print(
        f"operator: all training Jobs in  {op['total_s']:.2f} s ({count / op['total_s']:.0f} CRs/s; CR creation took {op['created_s']:.2f} s)"
    )
    print(
        f"operator: create->Job latency   p50 {statistics.median(lat) * 1000:.0f} ms, p99 {percentile(lat, 0.99) * 1000:.0f} ms, max {max(lat) * 1000:.0f} ms"
    )
    print(f"operator: CPU during the burst  {op['cpu_s']:.1f} s ({1000 * op['cpu_s'] / crs:.2f} ms per CR)")
    print(f"operator: requests, burst       {op['requests']} ({op['requests'] / crs:.2f} per CR)")
    print(f"API server: CPU during burst    {op['server_cpu_s']:.1f} s ({op['server_cpu_of']})")
    print(
        f"operator: RSS                   {_mib(rss['idle'])} idle, {_mib(rss['peak'])} peak, "
        f"{_mib(rss['milestone'])} at the {MILESTONE:,}th Job, {_mib(rss['end'])} at the end"
    )
    if args.fault_rate:
        truth = f"{op['statuses_s']:.1f} s later" if op["statuses_s"] is not None else "NOT within 120 s"
        print(f"faults injected:                {args.fault_rate:.0%} of the operator's writes, watch drops, 410s")
        print(f"operator: every status records its children {truth}")
    print(
        f"operator: creates answered 409  {op['burst_409']} until every child exists, "
        + (f"{op['steady_409']} in steady state" if op["steady_409"] else "steady state not run")
        + ("" if op["settled"] else " (the operator never fell quiet)")
    )
    print(f"load average:                   {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


def report_bare(op: dict, bare: float, writes: float, args: argparse.Namespace, waited: float) -> None:
    count = args.count
    if waited:
        print(
            f"before the baselines:           {waited:.0f} s for the Job controller to make every pod of the Jobs before them"
        )
    print(f"bare client: same objects in    {bare:.2f} s ({count / bare:.0f} ConfigMap + Job pairs/s)")
    print(f"bare client: same writes in     {writes:.2f} s (the CRs, their children, first statuses and Events)")
    print(f"ratio operator/bare (time):     {op['total_s'] / bare:.2f}x")
    print(f"ratio same writes/bare (time):  {writes / bare:.2f}x (a client making the operator's writes alone)")
    print(f"ratio operator/same writes:     {op['total_s'] / writes:.2f}x (what the operator adds to its writes)")


async def in_process(args: argparse.Namespace) -> None:
    faults = dict(write_fault_rate=args.fault_rate, watch_lifetime=5.0, expire_rate=0.2) if args.fault_rate else {}
    async with Timed(**faults) as api, kmock.Server(api):
        api.register_defaults()
        if args.count:
            await scale(InProcess(api), args)
        if args.poll_reads:
            with tempfile.TemporaryDirectory() as tmp:
                polled = await poll_reads(api, args.poll_reads, args.poll_period, 5, Path(tmp))
            count, period = args.poll_reads, args.poll_period
            per_minute = polled["reads"] / count / (polled["seconds"] / 60)
            print(f"GemmaFineTunes training:        {polled['training']}/{count}, polled every {period:g} s")
            per_poll = polled["reads"] / count / max(polled["polls"], 1)
            print(
                f"operator: reads per CR          {per_minute:.1f} per minute, {per_poll:.2f} per poll "
                f"({polled['reads']} reads, {polled['polls']} polls in {polled['seconds']:.0f} s)"
            )


async def real(args: argparse.Namespace) -> None:
    real_api = _beside("real_api")
    with (
        tempfile.TemporaryDirectory() as tmp,
        real_api.started(Path(tmp) / "control-plane", ["bench", "bare", "writes"]) as backend,
    ):
        await scale(backend, args)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--real", action="store_true", help="against a real kube-apiserver (the project's control plane)"
    )
    parser.add_argument(
        "--no-steady",
        action="store_true",
        help="skip the steady-state pass (every CR touched once more): at 10,000 CRs the in-process API's "
        "list calls, which scan every object, make it measure that API more than the operator",
    )
    parser.add_argument(
        "--no-baselines",
        action="store_true",
        help="skip the bare client's baselines: at 10,000 CRs on the real server, the Job controller takes "
        "many minutes to make the burst's pods, which a baseline must wait for",
    )
    parser.add_argument("--profile", type=Path, help="py-spy's samples of the operator during the burst, to this file")
    parser.add_argument("--fault-rate", type=float, default=0.0, help="share of the operator's writes failed")
    parser.add_argument("--poll-reads", type=int, default=0, metavar="N", help="fine-tunes training while polled")
    parser.add_argument("--poll-period", type=float, default=2.0, help="seconds between polls for --poll-reads")
    args = parser.parse_args()
    if args.real and (args.fault_rate or args.poll_reads):
        parser.error("--fault-rate and --poll-reads need the in-process API (its faults and its pod logs)")
    # Stopped from outside, the control plane's processes are stopped too (the context managers unwind).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    asyncio.run(real(args) if args.real else in_process(args))
