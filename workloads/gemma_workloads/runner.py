"""`python -m gemma_workloads train|merge --config FILE`: the one entry point of both workloads.

Whatever happens, a run ends with an exit code the operator acts on and a result in the
termination log (config.py): the config is loaded (JSON or YAML) and every input checked
(preflight.py) before the program, and with it JAX, is imported, so a broken input costs a
second; a bad config or input exits EXIT_INVALID_INPUT with a message naming the file, anything
else EXIT_FAILED with the error. Until the config is read, a failure is reported at Kubernetes'
default termination message path.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pydantic
import yaml

from gemma_workloads import preflight
from gemma_workloads.config import (
    EXIT_FAILED,
    EXIT_INVALID_INPUT,
    EXIT_OK,
    TERMINATION_LOG,
    MergeConfig,
    MergeResult,
    TrainConfig,
    TrainResult,
    write_termination_message,
)
from gemma_workloads.input_files import InputError

log = logging.getLogger("gemma_workloads.runner")


class Failed(RuntimeError):
    """A failure the program has already explained: reported as it is, without a traceback."""


@dataclass(frozen=True)
class Workload:
    config: type[TrainConfig] | type[MergeConfig]
    result: type[TrainResult] | type[MergeResult]
    check: Callable[[Any], None]  # every input, before JAX is imported
    run: Callable[[Any], tuple[Any, int]]  # the program: its result and exit code
    description: str


def train(config: TrainConfig) -> tuple[TrainResult, int]:
    """Fine-tune (training/trainer.py), its errors sorted into bad input and failure."""
    from gemma_workloads.training import trainer
    from gemma_workloads.training.progress import NonFiniteStep

    try:
        outcome = trainer.run(config)
    except trainer.BAD_INPUT as e:
        raise InputError(describe(e)) from e
    except NonFiniteStep as e:  # an application error: a retry would diverge the same way
        raise Failed(str(e)) from e
    trainer.log.info("result: %s", outcome.result.model_dump_json(exclude_none=True))
    return outcome.result, outcome.exit_code


def merge(config: MergeConfig) -> tuple[MergeResult, int]:
    """Merge (merging/merger.py); its log and result go to stdout."""
    from gemma_workloads.merging import merger

    _merge_log_to_stdout()
    try:
        result = merger.merge(config)
    except merger.INPUT_ERRORS as e:
        raise InputError(str(e)) from e
    print(result.model_dump_json(exclude_none=True), flush=True)
    return result, EXIT_OK


WORKLOADS = {
    "train": Workload(
        TrainConfig, TrainResult, preflight.check_train, train, "LoRA fine-tuning of Gemma 4 (Tunix + Qwix)"
    ),
    "merge": Workload(
        MergeConfig, MergeResult, preflight.check_merge, merge, "merge a LoRA checkpoint into Hugging Face safetensors"
    ),
}


def load_config(cls: type[TrainConfig] | type[MergeConfig], path: str) -> TrainConfig | MergeConfig:
    """A workload config file (JSON or YAML), or InputError naming the file and the line or field."""
    try:
        return cls.load(path)
    except pydantic.ValidationError as e:
        raise InputError(f"config {path}: {validation_message(e)}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or e
        raise InputError(f"config {path}: {where}neither JSON nor YAML ({problem})") from None
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: nested deeper than the parser goes
        raise InputError(f"config {path}: {e}") from None


def validation_message(error: pydantic.ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in error.errors())


def describe(error: Exception) -> str:
    return validation_message(error) if isinstance(error, pydantic.ValidationError) else str(error)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gemma_workloads", description="The workloads the operator runs in their pods."
    )
    sub = p.add_subparsers(dest="workload", required=True)
    for name, workload in WORKLOADS.items():
        sub.add_parser(name, help=workload.description, description=workload.description).add_argument(
            "--config", required=True, help=f"{workload.config.__name__} file (JSON or YAML)"
        )
    return p


def main(argv: list[str] | None = None, *, termination_log: str = TERMINATION_LOG) -> int:
    """Run a workload; `termination_log`: where a failure goes until the config names its own."""
    args = parser().parse_args(argv)
    workload = WORKLOADS[args.workload]
    try:
        config = load_config(workload.config, args.config)
        termination_log = config.termination_log
        workload.check(config)
        result, code = workload.run(config)
    except InputError as e:
        return _fail(workload, str(e), EXIT_INVALID_INPUT, termination_log)
    except Failed as e:
        return _fail(workload, str(e), EXIT_FAILED, termination_log)
    except Exception as e:  # any other failure is reported, then the pod fails
        log.exception("%s failed", args.workload)
        return _fail(workload, f"{type(e).__name__}: {e}", EXIT_FAILED, termination_log)
    write_termination_message(result, termination_log)
    return code


def _fail(workload: Workload, message: str, code: int, termination_log: str) -> int:
    """Report a failure where the operator and a person read it; the exit code for it."""
    write_termination_message(workload.result(status="failed", error=message), termination_log)
    print(f"error: {message}", file=sys.stderr, flush=True)
    return code


def _merge_log_to_stdout() -> None:
    merge_log = logging.getLogger("gemma_workloads.merge")
    if not merge_log.handlers:  # absl owns the root logger once orbax is imported
        merge_log.addHandler(logging.StreamHandler(sys.stdout))
    merge_log.setLevel(logging.INFO)
    merge_log.propagate = False


def cli() -> int:
    """The pods' program: the log on stderr, at INFO for ours and WARNING for the libraries'."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    import absl.logging  # noqa: F401 (absl's logger must be of its own class, so absl creates it first)

    for noisy in ("absl", "jax", "orbax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return main()
