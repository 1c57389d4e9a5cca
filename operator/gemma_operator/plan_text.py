"""Plans described for people (`gemma-tpu plan`) and for scripts (`-o json`)."""

from __future__ import annotations

import math
from typing import Any

from gemma_operator import fit, host, pricing, rollout_gate
from gemma_operator.children import merge, model_delivery, serving, training
from gemma_operator.plan import FineTunePlan, ServePlan
from gemma_operator.plan import evaluation as evaluation_plan
from gemma_operator.training_method import METHOD_COST


def _slice(p: FineTunePlan | ServePlan) -> dict[str, Any]:
    s, g = p.placement.slice, p.placement.gpus
    if g is not None:
        return {
            "accelerator": g.type.name,
            "name": g.name,
            "gpus": g.count,
            "hosts": 1,
            "machineType": g.machine.name,
            "machineGpus": g.machine.gpus,
        }
    if s is None:
        return {"accelerator": "cpu", "hosts": 1, "chipsPerHost": 0}
    return {
        "accelerator": s.generation,
        "name": s.name,
        "topology": s.topology,
        "hosts": s.hosts,
        "chipsPerHost": s.chips_per_host,
        "chips": s.chips,
        "machineType": s.machine_type,
    }


def _memory(m: fit.MemoryEstimate | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {
        "neededGiB": round(m.total / fit.GIB, 2),
        "availableGiB": round(m.available / fit.GIB, 2) if math.isfinite(m.available) else None,  # None: unknown
        "partsGiB": {k: round(v / fit.GIB, 2) for k, v in m.parts.items()},
        "fits": m.fits,
    }


def _staging(h: host.HostPlan | None) -> dict[str, Any] | None:
    if h is None or h.staging_size is None:
        return None
    return {
        "volume": h.staging_volume,
        "size": h.staging_size,
        "path": host.STAGING_DIR,
        "disk": _memory(h.staging),
        "storageClass": h.storage_class,
    }


def _host(p: FineTunePlan) -> dict[str, Any] | None:
    h = p.host
    if h is None:
        return None
    return {"memoryRequest": h.memory_request, "memory": _memory(h.memory), "staging": _staging(h)}


def _fit_text(mem: dict[str, Any] | None, unknown: str) -> str:
    if mem is None:
        return unknown
    available = "an unknown amount" if mem["availableGiB"] is None else f"{mem['availableGiB']:.1f} GiB"
    parts = ", ".join(f"{k} {v:.1f}" for k, v in mem["partsGiB"].items())
    return f"{mem['neededGiB']:.1f} GiB needed of {available} ({parts}) {'OK' if mem['fits'] else 'DOES NOT FIT'}"


def _host_text(d: dict[str, Any] | None) -> list[str]:
    if d is None:
        return []
    lines = [f"  host memory:   {_fit_text(d['memory'], 'model size unknown')}; pod memory {d['memoryRequest']}"]
    s = d["staging"]
    if s is None:
        return [*lines, "  staging:       none (the model is read where it is)"]
    return [*lines, f"  staging:       {_staging_text(s)}"]


def _staging_text(s: dict[str, Any]) -> str:
    where = {"ephemeralVolume": "a volume claimed with the pod", "emptyDir": "the node's disk (ephemeral-storage)"}
    disk = "" if s["disk"] is None else f": {_fit_text(s['disk'], '')}"
    return f"{s['size']} on {where[s['volume']]} at {s['path']}{disk}"


def _method(p: FineTunePlan) -> dict[str, Any]:
    """What training optimises, and what a row of it costs (training_method.py)."""
    cost = METHOD_COST[p.train.method]
    return {
        "name": p.train.method,
        "preference": p.train.preference.model_dump(mode="json") if p.train.preference_tuning else None,
        "sequencesPerRow": cost.sequences_per_row,
        "referenceForward": cost.reference_forward,
        "flopsPerTokenPerParam": cost.flops_per_token(p.shape) / p.shape.params if p.shape else None,
    }


def _method_text(d: dict[str, Any], batch: int) -> list[str]:
    """The method's line of `gemma-tpu plan`, for a preference method (sft has none)."""
    if d["preference"] is None:
        return []
    pref = d["preference"]
    setting = f"beta {pref['beta']:g}" if d["name"] == "dpo" else f"orpo lambda {pref['orpo_lambda']:g}"
    reference = "a reference forward of the base model (adapter off)" if d["referenceForward"] else "no reference"
    flops = "" if d["flopsPerTokenPerParam"] is None else f", {d['flopsPerTokenPerParam']:g}N FLOPs a token"
    return [
        f"  method:        {d['name']} ({setting}, label smoothing {pref['label_smoothing']:g}): {batch} pairs a "
        f"step, {d['sequencesPerRow']} sequences each; {reference}{flops}"
    ]


def _price(price: pricing.Price | None) -> dict[str, Any] | None:
    if price is None:
        return None
    return {
        "perChipHour": price.per_chip_hour,
        "per": price.device,
        "basis": price.basis,
        "source": price.source,
        "spotPricedOnDemand": price.spot_priced_on_demand,
    }


def _serving_cost(c: pricing.ServingCost | None) -> dict[str, Any] | None:
    """Per replica per hour and per 30 days, and the service's at each replica count it runs at."""
    if c is None:
        return None
    return {
        "price": _price(c.price),
        "chipsPerReplica": c.chips,
        "perReplicaHour": round(c.per_replica_hour, 2),
        "perReplica30Days": round(c.per_30_days(1), 2),
        "at": {
            field: {"replicas": n, "hour": round(c.hourly(n), 2), "30Days": round(c.per_30_days(n), 2)}
            for field, n in c.replicas.items()
        },
    }


def _serving_cost_text(d: dict[str, Any] | None, price: pricing.Price | None) -> list[str]:
    if d is None or price is None:
        return ["  cost:          not priced"]
    at = "; ".join(
        f"at {field} {a['replicas']}: ${a['hour']:,.2f}/h, ${a['30Days']:,.2f} per 30 days"
        for field, a in d["at"].items()
    )
    return [
        f"  cost:          ${d['perReplicaHour']:,.2f}/h and ${d['perReplica30Days']:,.2f} per 30 days per replica "
        f"({d['chipsPerReplica']:g} {price.device}s); {at}",
        f"  price:         {price.describe()}",
    ]


def _with_training(sp: ServePlan, ft: FineTunePlan | None) -> dict[str, Any] | None:
    """One training run of the fine-tune a service serves, plus 30 days of serving it (at each
    replica count it runs at): what a model costs from training to a month in production."""
    if ft is None or ft.estimate is None or sp.cost is None:
        return None
    run = round(ft.estimate.cost, 2)
    return {
        "fineTune": ft.name,
        "trainingRun": run,
        "at": {
            field: {
                "replicas": n,
                "serving30Days": round(sp.cost.per_30_days(n), 2),
                "total": round(run + sp.cost.per_30_days(n), 2),
            }
            for field, n in sp.cost.replicas.items()
        },
    }


def _with_training_text(d: dict[str, Any] | None) -> list[str]:
    if d is None:
        return []
    at = "; ".join(
        f"at {field} {a['replicas']}: ${d['trainingRun']:,.2f} + ${a['serving30Days']:,.2f} = ${a['total']:,.2f}"
        for field, a in d["at"].items()
    )
    return [f"  with training: one run of GemmaFineTune {d['fineTune']} and 30 days of serving: {at}"]


def _benchmark_text(p: ServePlan) -> list[str]:
    b = p.spec.benchmark
    if b is None:
        return []
    rate = f", {b.request_rate:g} requests/s" if b.request_rate else ""
    slo = b.slo.model_dump(by_alias=True, exclude_none=True) if b.slo else {}
    bounds = ", ".join(f"{k} {v:g}" for k, v in slo.items())
    judged = f"; SLO {bounds}, on a miss: {b.on_miss}" if slo else "; no SLO (measured only)"
    prompts = f"from {b.prompts_uri} + {b.output_len}" if b.prompts_uri else f"of {b.input_len} + {b.output_len}"
    return [
        f"  benchmark:     each revision once Ready: {b.requests} prompts {prompts} tokens, "
        f"{b.max_concurrency} in flight{rate}, at most {b.timeout_seconds} s{judged}"
    ]


def as_dict(p: FineTunePlan | ServePlan, fine_tune: FineTunePlan | None = None) -> dict[str, Any]:
    """The plan as data; a GemmaServe's with the cost of `fine_tune`'s run beside its serving."""
    if isinstance(p, ServePlan):
        return {
            "kind": "GemmaServe",
            "name": p.name,
            "namespace": p.namespace,
            "slice": _slice(p),
            "modelUri": p.model_uri,
            "servedModelName": p.served_name,
            "tensorParallel": p.tensor_parallel,
            "hbmPerChip": _memory(p.memory),
            "image": p.image,
            "workload": f"{'LeaderWorkerSet' if p.multi_host else 'Deployment'} {serving.name(p)}",
            "startupBudgetSeconds": p.startup_seconds,
            "download": _staging(p.staging),
            **model_delivery.describe(p),
            "rolloutGate": [g.model_dump(mode="json", by_alias=True, exclude_none=True) for g in p.spec.rollout.gate],
            "cost": _serving_cost(p.cost),
            "withTraining": _with_training(p, fine_tune),
            "benchmark": p.spec.benchmark.model_dump(mode="json", by_alias=True, exclude_none=True)
            if p.spec.benchmark
            else None,
            "warnings": list(p.warnings),
        }
    est = p.estimate
    return {
        "kind": "GemmaFineTune",
        "name": p.name,
        "namespace": p.namespace,
        "model": p.model_label,
        "slice": _slice(p),
        "workload": "JobSet" if p.multi_host else "Job",
        "method": _method(p),
        "mesh": {"fsdp": p.mesh.fsdp, "tp": p.mesh.tp},
        "microBatch": p.micro_batch,
        "gradientAccumulation": p.train.grad_accumulation,
        "hbmPerChip": _memory(p.memory),
        "host": _host(p),
        "run": p.run,
        "runDir": p.run_dir,
        "mergedDir": p.merged_dir if p.spec.merge.enabled else None,
        "trainingJob": training.names(p)[0],
        "mergeJob": merge.name(p) if p.spec.merge.enabled else None,
        "mergeMemoryGiB": p.merge_memory_gib,
        "pricePerChipHour": p.price_per_chip_hour,
        "price": _price(p.price),
        "estimate": None
        if est is None
        else {
            "steps": est.steps,
            "tokens": est.tokens,
            "hours": round(est.hours, 2),
            "chipHours": round(est.chip_hours, 2),
            "cost": round(est.cost, 2),
        },
        "evaluation": evaluation_plan.describe(p.spec.evaluation, p.evaluation),
        "warnings": list(p.warnings),
    }


def as_text(p: FineTunePlan | ServePlan, fine_tune: FineTunePlan | None = None) -> str:
    d = as_dict(p, fine_tune)
    where = _where(d["slice"])
    per = f"HBM per {p.placement.device_word}:"
    hbm = _fit_text(d["hbmPerChip"], "not checked (no TPU or GPU, or unknown model size)")
    compiler = "compilation" if p.placement.gpus else "XLA compilation"
    if isinstance(p, ServePlan):
        lines = [
            f"GemmaServe {d['name']} (namespace {d['namespace']})",
            where,
            f"  model:         {d['modelUri'] or _awaited(p)} served as {d['servedModelName']!r}",
            f"  vLLM:          tensor parallel {d['tensorParallel']}, image {d['image']}",
            f"  {per:<15}{hbm}",
            f"  startup:       up to {d['startupBudgetSeconds'] // 60} min for loading and {compiler}",
            f"  workload:      {d['workload']}",
            *([f"  rollout gate:  {rollout_gate.describe(p.spec.rollout.gate)}"] if p.spec.model.fine_tune_ref else []),
            f"  compile cache: {d['compileCache'] or 'none (every restart compiles again)'}",
            *([f"  download:      {_staging_text(d['download'])}"] if d["download"] else []),
            *_benchmark_text(p),
            *_serving_cost_text(d["cost"], p.cost.price if p.cost else None),
            *_with_training_text(d["withTraining"]),
            *_warnings_text(d["warnings"]),
        ]
        return "\n".join(lines)
    est = d["estimate"]
    estimate = (
        "unknown (set training.steps and a model preset on TPU chips or GPUs)"
        if est is None
        else (
            f"{est['steps']} steps, {est['tokens'] / 1e6:.1f} M tokens, {est['hours']:.1f} h, "
            f"{est['chipHours']:.1f} {p.placement.device_word}-hours, ${est['cost']:.2f}"
        )
    )
    lines = [
        f"GemmaFineTune {d['name']} (namespace {d['namespace']})",
        f"  model:         {d['model']}",
        where,
        f"  workload:      {d['workload']} {d['trainingJob']}",
        *_method_text(d["method"], p.train.batch_size),
        f"  mesh:          fsdp {d['mesh']['fsdp']} x tp {d['mesh']['tp']}, "
        f"micro-batch {METHOD_COST[p.train.method].rows(d['microBatch'])}, "
        f"gradient accumulation {d['gradientAccumulation']}",
        f"  {per:<15}{hbm}",
        *_host_text(d["host"]),
        f"  run:           {d['run']} -> {d['runDir']}",
        f"  estimate:      {estimate}",
        *([f"  price:         {p.price.describe()}"] if p.price and p.placement.accelerated else []),
        *(
            [
                f"  evaluation:    "
                f"{evaluation_plan.text(d['evaluation'], d['pricePerChipHour'], p.placement.device_word)}"
            ]
            if d["evaluation"]
            else []
        ),
        "  merge:         "
        + (f"Job {d['mergeJob']} ({d['mergeMemoryGiB']} GiB) -> {d['mergedDir']}" if d["mergeJob"] else "disabled"),
        *_warnings_text(d["warnings"]),
    ]
    return "\n".join(lines)


def _where(s: dict[str, Any]) -> str:
    """The line that says where the pods run: a TPU slice, GPUs, or the cpu profile."""
    if "gpus" in s:
        of = "all the GPUs" if s["gpus"] == s["machineGpus"] else f"{s['gpus']} of the {s['machineGpus']} GPUs"
        return f"  gpus:          {s['name']} ({s['accelerator']}): {of} of one {s['machineType']} node"
    if s["accelerator"] == "cpu":
        return "  slice:         cpu (no TPU)"
    return (
        f"  slice:         {s['name']} ({s['topology']}): {s['hosts']} host(s) x {s['chipsPerHost']} chips, "
        f"{s['machineType']}"
    )


def _awaited(p: ServePlan) -> str:
    ref = p.spec.model.fine_tune_ref
    return f"the merged output of GemmaFineTune {ref.name} (unknown until it succeeds)" if ref else "unknown"


def _warnings_text(warnings: list[str]) -> list[str]:
    return [f"  warning:       {w}" for w in warnings]
