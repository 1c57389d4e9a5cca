"""The GemmaFineTune and GemmaServe custom resources: types, defaults and field rules only.

These pydantic models are the one source of the CRD schemas (`crd.py` turns them into
openAPIV3Schema) and of the operator's parsing of a CR. Nothing here knows how a resource is
reconciled. Field names are the public contract: add fields, never rename them.

One module per part of the schema, each read top to bottom as `kubectl explain` reads it:

- `common.py`: what both kinds share: group and version, the bounds of strings and lists, the base
  models, Secret references, the slice, storage, conditions;
- `evaluation.py`: the fine-tune's evaluation and its figures, and the serve's gate on them;
- `finetune.py`: GemmaFineTune, with its training settings in `finetune_training.py`;
- `serve.py`: GemmaServe, with its benchmark and SLO in `serve_benchmark.py`.

The rest of the operator reads every type as `api.Name`: a type that code outside this package
uses is named below.
"""

from __future__ import annotations

from gemma_operator.api.common import (
    API_VERSION,
    GROUP,
    MAX_ITEMS,
    MAX_LENGTH,
    PATTERN_HINTS,
    TPU,
    VERSION,
    Accelerator,
    Condition,
    HfRepo,
    Image,
    Kind,
    Model,
    Name,
    NodeLabel,
    ObservedStatus,
    Preset,
    Quantity,
    RunId,
    SecretKeyRef,
    Size,
    StatusModel,
    StatusName,
    StatusRun,
    StatusUri,
    Storage,
    Text,
    Timestamp,
    Uri,
)
from gemma_operator.api.evaluation import EvalMetric, Evaluation, GateCondition, MetricFigure, RunEvaluation
from gemma_operator.api.finetune import (
    FINETUNE,
    DType,
    FineTuneChildren,
    FineTuneOutputs,
    FineTuneRun,
    GemmaFineTuneSpec,
    GemmaFineTuneStatus,
    Images,
    Merge,
    MergeDType,
    MergeOutputKind,
    ModelSource,
    Output,
    Progress,
)
from gemma_operator.api.finetune_training import (
    Dataset,
    DpoBeta,
    Lora,
    LoraTarget,
    LrSchedule,
    Mesh,
    OrpoLambda,
    Preference,
    Training,
)
from gemma_operator.api.serve import (
    SERVE,
    VLLM,
    Autoscaling,
    CompilationCache,
    FineTuneRef,
    GcsFuse,
    GemmaServeSpec,
    GemmaServeStatus,
    Metrics,
    Rollout,
    ServeModel,
    ServeTPU,
)
from gemma_operator.api.serve_benchmark import (
    MAX_BENCHMARK_REQUESTS,
    MAX_BENCHMARK_SECONDS,
    Benchmark,
    BenchmarkResult,
    BenchmarkSLO,
    RejectedRun,
)
from gemma_workloads import config  # the contract, whose method and module names the CRD's rules read too

KINDS = {k.kind: k for k in (FINETUNE, SERVE)}

__all__ = [
    "Accelerator",
    "API_VERSION",
    "Autoscaling",
    "Benchmark",
    "BenchmarkResult",
    "BenchmarkSLO",
    "CompilationCache",
    "Condition",
    "config",
    "Dataset",
    "DpoBeta",
    "DType",
    "EvalMetric",
    "Evaluation",
    "FINETUNE",
    "FineTuneChildren",
    "FineTuneOutputs",
    "FineTuneRef",
    "FineTuneRun",
    "GateCondition",
    "GcsFuse",
    "GemmaFineTuneSpec",
    "GemmaFineTuneStatus",
    "GemmaServeSpec",
    "GemmaServeStatus",
    "GROUP",
    "HfRepo",
    "Image",
    "Images",
    "Kind",
    "KINDS",
    "Lora",
    "LoraTarget",
    "LrSchedule",
    "MAX_BENCHMARK_REQUESTS",
    "MAX_BENCHMARK_SECONDS",
    "MAX_ITEMS",
    "MAX_LENGTH",
    "Merge",
    "MergeDType",
    "MergeOutputKind",
    "Mesh",
    "MetricFigure",
    "Metrics",
    "Model",
    "ModelSource",
    "Name",
    "NodeLabel",
    "ObservedStatus",
    "OrpoLambda",
    "Output",
    "PATTERN_HINTS",
    "Preference",
    "Preset",
    "Progress",
    "Quantity",
    "RejectedRun",
    "Rollout",
    "RunEvaluation",
    "RunId",
    "SecretKeyRef",
    "SERVE",
    "ServeModel",
    "ServeTPU",
    "Size",
    "StatusModel",
    "StatusName",
    "StatusRun",
    "StatusUri",
    "Storage",
    "Text",
    "Timestamp",
    "TPU",
    "Training",
    "Uri",
    "VERSION",
    "VLLM",
]
