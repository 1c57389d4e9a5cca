"""Plans described for people (`gemma-tpu plan`) and for scripts (`-o json`)."""

from __future__ import annotations

from typing import Any

from gemma_operator import fit
from gemma_operator.children import merge, model_delivery, serving, training
from gemma_operator.plan import FineTunePlan, ServePlan


def _slice(p: FineTunePlan | ServePlan) -> dict[str, Any]:
    s = p.placement.slice
    if s is None:
        return {"accelerator": "cpu", "hosts": 1, "chipsPerHost": 0}
    return {"accelerator": s.generation, "name": s.name, "topology": s.topology, "hosts": s.hosts,
            "chipsPerHost": s.chips_per_host, "chips": s.chips, "machineType": s.machine_type}  # fmt: skip


def _memory(m: fit.MemoryEstimate | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {
        "neededGiB": round(m.total / fit.GIB, 2),
        "availableGiB": round(m.available / fit.GIB, 2),
        "partsGiB": {k: round(v / fit.GIB, 2) for k, v in m.parts.items()},
        "fits": m.fits,
    }


def as_dict(p: FineTunePlan | ServePlan) -> dict[str, Any]:
    if isinstance(p, ServePlan):
        return {
            "kind": "GemmaServe", "name": p.name, "namespace": p.namespace, "slice": _slice(p),
            "modelUri": p.model_uri, "servedModelName": p.served_name, "tensorParallel": p.tensor_parallel,
            "hbmPerChip": _memory(p.memory), "image": p.image, "workload": f"{'LeaderWorkerSet' if p.multi_host else 'Deployment'} {serving.name(p)}",
            "startupBudgetSeconds": p.startup_seconds, **model_delivery.describe(p),
        }  # fmt: skip
    est = p.estimate
    return {
        "kind": "GemmaFineTune", "name": p.name, "namespace": p.namespace, "model": p.model_label,
        "slice": _slice(p), "workload": "JobSet" if p.multi_host else "Job",
        "mesh": {"fsdp": p.mesh.fsdp, "tp": p.mesh.tp}, "microBatch": p.micro_batch,
        "gradientAccumulation": p.train.grad_accumulation, "hbmPerChip": _memory(p.memory),
        "run": p.run, "runDir": p.run_dir, "mergedDir": p.merged_dir if p.spec.merge.enabled else None,
        "trainingJob": training.names(p)[0], "mergeJob": merge.name(p) if p.spec.merge.enabled else None,
        "mergeMemoryGiB": p.merge_memory_gib, "pricePerChipHour": p.price_per_chip_hour,
        "estimate": None if est is None else {
            "steps": est.steps, "tokens": est.tokens, "hours": round(est.hours, 2),
            "chipHours": round(est.chip_hours, 2), "cost": round(est.cost, 2),
        },
    }  # fmt: skip


def as_text(p: FineTunePlan | ServePlan) -> str:
    d = as_dict(p)
    s = d["slice"]
    where = (
        f"{s['name']} ({s['topology']}): {s['hosts']} host(s) x {s['chipsPerHost']} chips, {s['machineType']}"
        if s["accelerator"] != "cpu"
        else "cpu (no TPU)"
    )
    mem = d["hbmPerChip"]
    hbm = "not checked (no TPU or unknown model size)" if mem is None else (
        f"{mem['neededGiB']:.1f} GiB needed of {mem['availableGiB']:.1f} GiB "
        f"({', '.join(f'{k} {v:.1f}' for k, v in mem['partsGiB'].items())}) {'OK' if mem['fits'] else 'DOES NOT FIT'}"
    )
    if d["kind"] == "GemmaServe":
        lines = [
            f"GemmaServe {d['name']} (namespace {d['namespace']})",
            f"  slice:         {where}",
            f"  model:         {d['modelUri']} served as {d['servedModelName']!r}",
            f"  vLLM:          tensor parallel {d['tensorParallel']}, image {d['image']}",
            f"  HBM per chip:  {hbm}",
            f"  startup:       up to {d['startupBudgetSeconds'] // 60} min for loading and XLA compilation",
            f"  workload:      {d['workload']}",
            f"  compile cache: {d['compileCache'] or 'none (every restart compiles again)'}",
        ]
        return "\n".join(lines)
    est = d["estimate"]
    estimate = "unknown (set training.steps and a model preset on a TPU)" if est is None else (
        f"{est['steps']} steps, {est['tokens'] / 1e6:.1f} M tokens, {est['hours']:.1f} h, "
        f"{est['chipHours']:.1f} chip-hours, ${est['cost']:.2f} at ${d['pricePerChipHour']:.2f}/chip-hour"
    )
    lines = [
        f"GemmaFineTune {d['name']} (namespace {d['namespace']})",
        f"  model:         {d['model']}",
        f"  slice:         {where}",
        f"  workload:      {d['workload']} {d['trainingJob']}",
        f"  mesh:          fsdp {d['mesh']['fsdp']} x tp {d['mesh']['tp']}, micro-batch {d['microBatch']}, "
        f"gradient accumulation {d['gradientAccumulation']}",
        f"  HBM per chip:  {hbm}",
        f"  run:           {d['run']} -> {d['runDir']}",
        f"  estimate:      {estimate}",
        "  merge:         " + (f"Job {d['mergeJob']} ({d['mergeMemoryGiB']} GiB) -> {d['mergedDir']}" if d["mergeJob"] else "disabled"),
    ]
    return "\n".join(lines)
