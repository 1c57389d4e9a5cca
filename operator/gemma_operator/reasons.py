"""Every phase, condition type and reason the operator writes, and the upstream ones it reads, by
name: one place to see the vocabulary a user meets on a CR (docs/troubleshooting.md explains each
reason; a test holds the two equal)."""

from __future__ import annotations

from typing import Final, Literal, get_args

# The phases of a GemmaFineTune and of a GemmaServe (status.phase).
FineTunePhase = Literal["Pending", "Training", "Merging", "Succeeded", "Failed", "Suspended"]
ServePhase = Literal["Pending", "WaitingForModel", "Deploying", "Ready", "Failed"]
PENDING: Final = "Pending"
TRAINING: Final = "Training"
MERGING: Final = "Merging"
SUCCEEDED: Final = "Succeeded"
FAILED: Final = "Failed"
SUSPENDED: Final = "Suspended"
WAITING_FOR_MODEL: Final = "WaitingForModel"
DEPLOYING: Final = "Deploying"
READY: Final = "Ready"
FINETUNE_PHASES: tuple[str, ...] = get_args(FineTunePhase)
SERVE_PHASES: tuple[str, ...] = get_args(ServePhase)

# Condition types of the CRs beside those named like a phase (Failed, Suspended, Ready).
TRAINING_COMPLETE = "TrainingComplete"
MERGED = "Merged"
COMPLETE = "Complete"
INVALID_SPEC = "InvalidSpec"
DEPENDENCY_MISSING = "DependencyMissing"
GATE_PASSED = "GatePassed"
MODEL_READY = "ModelReady"
EVALUATED = "Evaluated"
SLO_MET = "SLOMet"  # the current revision's benchmark meets spec.benchmark.slo
PODS_CREATED = "PodsCreated"  # False while the workload's pods are refused; True once they exist again
RECONCILING = "Reconciling"  # with Ready and Stalled: the kstatus conditions
STALLED = "Stalled"

# Condition and Event reasons.
VALID = "Valid"
SATISFIED = "Satisfied"
RUNNING = "Running"  # also the state of a running workload (failure_policy.Outcome)
RECONCILED = "Reconciled"
NEW_RUN = "NewRun"
BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
TRAINING_RECREATED = "TrainingRecreated"
TRAINING_FAILED = "TrainingFailed"
TRAINED = "Trained"
MERGE_FAILED = "MergeFailed"
ADAPTER_NOT_WRITTEN = "AdapterNotWritten"  # a Warning Event: the merge wrote no PEFT adapter
POD_CREATION_FAILED = "PodCreationFailed"  # PodsCreated False, and the CR's Warning Event
FINE_TUNE_NOT_FOUND = "FineTuneNotFound"
FINE_TUNE_NOT_READY = "FineTuneNotReady"
FINE_TUNE_FAILED = "FineTuneFailed"
ADAPTER_ONLY = "AdapterOnly"  # ModelReady False: the fine-tune keeps only a PEFT adapter
RESOLVED = "Resolved"
PREVIOUS_OUTPUT = "PreviousOutput"
RUN_NOT_FOUND = "RunNotFound"
NO_REPLICA_READY = "NoReplicaReady"
ROLLING_OUT = "RollingOut"
ROLLOUT_COMPLETE = "RolloutComplete"
ROLLOUT_BLOCKED = "RolloutBlocked"
NOT_LEADING = "NotLeading"
PASSED = "Passed"
NOT_EVALUATED = "NotEvaluated"
NO_EVALUATION = "NoEvaluation"
EVALUATION_NOT_FINITE = "EvaluationNotFinite"
METRIC_FAILED = "MetricFailed"
METRIC_MISSING = "MetricMissing"
BENCHMARKED = "Benchmarked"  # a Normal Event with a revision's figures
BENCHMARK_FAILED = "BenchmarkFailed"  # a Warning Event: the benchmark Job measured nothing
WITHIN_SLO = "WithinSLO"
SLO_MISSED = "SLOMissed"
ROLLED_BACK = "RolledBack"  # SLOMet False: the run was rejected and the previous one restored

# Upstream vocabulary the operator reads: Pod phases (core/v1 PodPhase), Job and JobSet condition
# types (batch/v1 JobConditionType, jobset.x-k8s.io), Deployment conditions and their reasons
# (apps/v1, pkg/controller/deployment/util), and the Event reason of refused pods (FailedCreate).
POD_RUNNING = "Running"
POD_SUCCEEDED = "Succeeded"
POD_FAILED = "Failed"
POD_SCHEDULED = "PodScheduled"  # a Pod condition type
POD_DISRUPTION_TARGET = "DisruptionTarget"  # a Pod condition type: evicted or preempted
JOB_COMPLETE = "Complete"
JOB_FAILED = "Failed"
JOB_FAILURE_TARGET = "FailureTarget"
JOB_SUSPENDED = "Suspended"
JOBSET_COMPLETED = "Completed"
JOB_POD_FAILURE_POLICY = "PodFailurePolicy"  # a Job failed by a rule of its podFailurePolicy
DEPLOYMENT_AVAILABLE = "Available"
DEPLOYMENT_PROGRESSING = "Progressing"
DEPLOYMENT_REPLICA_FAILURE = "ReplicaFailure"
MINIMUM_REPLICAS_AVAILABLE = "MinimumReplicasAvailable"
PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
FAILED_CREATE = "FailedCreate"
