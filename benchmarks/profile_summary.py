"""Where a traced step's device time went: kernels grouped by kind, and the longest kernels.

Reads the Chrome-format trace that `jax.profiler` writes (`<dir>/plugins/profile/<run>/*.trace.json.gz`)
and counts, on the accelerator's streams only (the derived "XLA Ops" and "XLA Modules" lines repeat
the same time), the time of each kernel. Kinds are read off the kernel's name, as cuBLAS, cuDNN and
XLA name them on a GPU; a TPU trace has its ops on one line per core and is summarised the same way.

    python benchmarks/profile_summary.py DIR [--top 40]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
from pathlib import Path

# first match wins; matched against the kernel name in lower case
KINDS: tuple[tuple[str, str], ...] = (
    ("attention (cuDNN)", r"cudnn|fmha|flash|sdpa"),
    ("matmul", r"gemm|cutlass|xmma|nvjet|cublas|sm90_|wgmma|triton_gemm|dot"),
    ("random bits", r"rng|threefry|philox"),
    ("copy / memset", r"memcpy|memset|copy|transpose"),
    ("reduction fusion", r"reduce|reduction"),
    ("elementwise fusion", r"fusion|loop_|elementwise|convert|broadcast"),
)


def trace_file(directory: Path) -> Path:
    """The newest trace under a `jax.profiler` log directory."""
    found = sorted(directory.glob("plugins/profile/*/*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"no plugins/profile/*/*.trace.json.gz under {directory}")
    return found[-1]


def kind(name: str) -> str:
    lowered = name.lower()
    return next((label for label, pattern in KINDS if re.search(pattern, lowered)), "other")


def line_names(trace: dict) -> dict[tuple[int, int], str]:
    """`process / thread` for each (pid, tid) of the trace."""
    events = trace["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    return {
        (e["pid"], e["tid"]): f"{processes.get(e['pid'], '')} / {e['args']['name']}"
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }


def on_device(line: str) -> bool:
    """GPU kernels are on `Stream #...` lines; a TPU's ops on its `XLA Ops` line."""
    process, _, thread = line.partition(" / ")
    if "/device:GPU" in process:
        return thread.startswith("Stream")
    return "/device:TPU" in process and thread == "XLA Ops"


def summarise(directory: Path, top: int = 40) -> str:
    with gzip.open(trace_file(directory)) as f:
        trace = json.load(f)
    names = line_names(trace)
    complete = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    kernels = [e for e in complete if on_device(names.get((e["pid"], e.get("tid")), ""))]
    if not kernels:  # say what the trace has instead
        lines = collections.Counter(names.get((e["pid"], e.get("tid")), "?") for e in complete)
        return "no device kernels in the trace; complete events by line:\n" + "".join(
            f"{n:8d}  {line}\n" for line, n in lines.most_common(30)
        )
    busy = sum(e["dur"] for e in kernels)
    window = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    lines = [
        f"kernels {len(kernels)}, busy {busy / 1e3:.1f} ms over a {window / 1e3:.1f} ms window "
        f"({100 * busy / window:.1f} % busy)",
        "",
        f"{'kind':22} {'ms':>9} {'share':>7} {'count':>7}",
    ]
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    for e in kernels:
        by_kind[kind(e["name"])].append(e["dur"])
    for label, durations in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        total = sum(durations)
        lines.append(f"{label:22} {total / 1e3:9.2f} {100 * total / busy:6.1f}% {len(durations):7d}")
    lines += ["", f"{'ms':>9} {'share':>7} {'count':>6}  kernel (hlo op)"]
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    ops: dict[str, str] = {}
    for e in kernels:
        by_name[e["name"]].append(e["dur"])
        ops.setdefault(e["name"], (e.get("args") or {}).get("hlo_op", ""))
    for name, durations in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]:
        total = sum(durations)
        lines.append(f"{total / 1e3:9.2f} {100 * total / busy:6.1f}% {len(durations):6d}  {name[:110]} ({ops[name]})")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="the log directory given to jax.profiler")
    parser.add_argument("--top", type=int, default=40, help="how many kernels to list")
    args = parser.parse_args()
    print(summarise(args.directory, args.top), end="")


if __name__ == "__main__":
    main()
