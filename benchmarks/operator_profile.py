"""Where the operator's CPU goes, from py-spy's samples of its process (`py-spy record --format raw
--gil`, as `operator_scale.py --profile FILE` records them): each sample is charged to the first
frame, from the innermost out, that belongs to one of the parts below; the standard library,
pydantic and the like are charged to whoever called them.

    python benchmarks/operator_profile.py FILE CRS SECONDS  # the CRs it covers, the process's CPU time
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

# (part, where its frames come from), in the order they are tried on each frame.
PARTS: list[tuple[str, tuple[str, ...]]] = [
    (
        "HTTP round trips: the client (kube.py, kubernetes, urllib3, JSON, threads)",
        ("gemma_operator/kube.py:", "urllib3/", "http/client", "kubernetes/", "ssl.py", "socket.py"),
    ),
    (
        "planning: spec -> plan (models, fit, run ids)",
        (
            "gemma_operator/plan/",
            "gemma_operator/model_shapes",
            "gemma_operator/fit",
            "gemma_operator/tpu",
            "gemma_operator/gpu",
            "gemma_operator/api/",
            "gemma_operator/settings",
            "gemma_operator/host",
            "gemma_operator/pricing",
            "gemma_operator/training_method",
            "gemma_operator/model_uri",
            "gemma_workloads/",
        ),
    ),
    (
        "manifests: plan -> children",
        (
            "gemma_operator/children/",
            "gemma_operator/vllm_flags",
            "gemma_operator/mounts",
            "gemma_operator/object_meta",
        ),
    ),
    ("typed status: read and written (pydantic)", ("gemma_operator/status.py", "gemma_operator/conditions.py")),
    (
        "deciding (lifecycles, failure policy, health)",
        (
            "gemma_operator/lifecycle/",
            "gemma_operator/health",
            "gemma_operator/failure_policy",
            "gemma_operator/evaluation",
            "gemma_operator/pod_creation",
            "gemma_operator/reasons",
            "gemma_operator/clock",
            "gemma_operator/rollout_gate",
        ),
    ),
    ("the controller (reconcile, reading, what was observed, metrics)", ("gemma_operator/",)),
    ("kopf: watch streams (aiohttp, JSON)", ("kopf/_cogs/clients", "aiohttp/", "yarl/", "multidict/")),
    ("kopf: each event (bodies, causes, handlers, loggers)", ("kopf/",)),
]
OUTSIDE = "the event loop (asyncio) and the rest"
# Frames every sample has at its root: the samples they hold are not theirs.
ROOTS = ("kopf/_core/reactor/running.py", "gemma_operator/runner.py", "gemma_operator/cli.py")
KUBE_PARTS = (
    ("status_patch", "the status JSON patch"),
    ("ensure", "applying children (compare, hashes)"),
    ("_hash", "applying children (compare, hashes)"),
)


def part(frames: list[str]) -> str:
    for frame in reversed(frames):
        if any(root in frame for root in ROOTS):
            break
        for name, where in PARTS:
            if any(w in frame for w in where):
                if name.startswith("HTTP"):
                    function = frame.split(" (")[0].rsplit(".", 1)[-1]
                    return next((kube for fn, kube in KUBE_PARTS if function == fn), name)
                return name
    return OUTSIDE


def parts(path: Path) -> tuple[collections.Counter, int]:
    """Samples by part, and in all, of a raw py-spy recording."""
    counts: collections.Counter = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack:
            counts[part(stack.split(";"))] += int(n)
    return counts, sum(counts.values())


def report(path: Path, crs: int, cpu_s: float) -> None:
    """The share of each part, and its CPU time per CR: that share of the `cpu_s` seconds the
    process spent in all (py-spy's sample count is a share, not a clock)."""
    counts, total = parts(path)
    print(f"{total} samples; {cpu_s:.1f} s of CPU for {crs} CRs, {1000 * cpu_s / crs:.2f} ms per CR")
    print("| part | share | ms per CR |")
    print("|---|---|---|")
    for name, n in counts.most_common():
        print(f"| {name} | {100 * n / total:.1f} % | {1000 * cpu_s * n / total / crs:.2f} |")


if __name__ == "__main__":
    report(Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
