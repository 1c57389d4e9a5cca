"""Every input of a workload checked before the accelerator is touched.

`python -m gemma_workloads train|merge` runs these checks first, before JAX is even imported
(runner.py), so a broken input costs a second rather than the staging and load of
a 31B model: the config file, the model folder (`model_folder`), each dataset line, the LoRA
checkpoint and the output location. A failure exits 2 with one message, in the termination log
too, naming the file and where it applies the line, field, shard or tensor, and the fix;
nothing is written. A gs:// folder is checked in place, reading only its small files and the
shards' headers; of an `hf://` repository the small files are fetched and checked before the
weights are downloaded, and the rest once they are (`sources.py`).
"""

from __future__ import annotations

from pathlib import Path

from etils import epath

from gemma_workloads import data, model_folder
from gemma_workloads.config import LORA_METADATA, DatasetConfig, MergeConfig, TrainConfig
from gemma_workloads.input_files import InputError
from gemma_workloads.merging import checkpoint_reader as lora_checkpoint
from gemma_workloads.sources import HF_PREFIX, SMALL_FILES, resolve_model
from gemma_workloads.training.evaluation import rows as eval_rows


def check_train(config: TrainConfig) -> None:
    """The base model, every dataset line, and what the output folder already holds."""
    check_model(config.model_path, chat=config.dataset.chat)
    check_dataset(config.dataset)
    if config.evaluation is not None:
        check_evaluation(config)
    if "://" not in config.output_dir and Path(config.output_dir).is_file():
        raise InputError(f"output_dir {config.output_dir} is a file: it must be a folder (or not exist yet)")
    metadata = epath.Path(config.checkpoint_dir) / LORA_METADATA
    if metadata.exists():  # a run to resume: its adapter's settings must be readable
        lora_checkpoint.read_lora_metadata(
            metadata,
            f"delete it only if {config.checkpoint_dir} holds no checkpoint you need, or use another output_dir",
        )


def check_dataset(dataset: DatasetConfig) -> None:
    """Each line decoded, parsed and checked for its format's fields (tokenising comes later)."""
    skipped: list[str] = []
    if not sum(1 for _ in data.rows(dataset, skipped)):
        raise data.no_usable_examples(dataset, skipped)


def check_evaluation(config: TrainConfig) -> None:
    """Where the rows come from, room for the answers, and each row of an eval file (and each
    `expected_regex`, in the eval file or in the dataset whose held-out rows are scored)."""
    ev, dataset = config.evaluation, config.dataset
    if ev is None:  # nothing to check
        return
    if ev.path is None and not dataset.eval_fraction:
        raise InputError(
            "evaluation: no rows to score: set evaluation.path (an eval JSONL in the dataset's format) "
            "or dataset.eval_fraction (a held-out split)"
        )
    if ev.max_new_tokens >= dataset.max_seq_len:
        raise InputError(
            f"evaluation.max_new_tokens {ev.max_new_tokens} leaves no room for a prompt within "
            f"dataset.max_seq_len {dataset.max_seq_len}"
        )
    source = eval_rows.eval_dataset(dataset, ev) if ev.path is not None else dataset
    skipped: list[str] = []
    usable = 0
    for number, row in data.rows(source, skipped):
        try:
            eval_rows.check_regex(row, source.format)
            usable += 1
        except ValueError as e:
            data.invalid(source, skipped, number, str(e))
    if not usable:
        raise data.no_usable_examples(source, skipped)


def check_merge(config: MergeConfig) -> None:
    """The output location, the base model, and the checkpoint step to merge."""
    check_merge_output(config)
    check_model(config.base_model_path)
    check_checkpoint(config)


def check_model(path: str, *, chat: bool = False) -> None:
    """A local or gs:// model folder; of an hf:// repository, what can be checked before its weights
    are downloaded (config, index, tokenizer: fetched into the cache the download then completes)."""
    if path.startswith(HF_PREFIX):
        model_folder.check_model_folder(resolve_model(path, SMALL_FILES), chat=chat, weights=False)
    else:
        model_folder.check_model_folder(path, chat=chat)


def check_merge_output(config: MergeConfig) -> None:
    """Local folders that overlap no input: the merge never writes into what it reads."""
    folders = {"output_dir": config.output_dir, "adapter_dir": config.adapter_folder}
    for field, folder in folders.items():
        if "://" in folder:
            raise InputError(f"{field} {folder}: must be a local path (mount a bucket with Cloud Storage FUSE)")
        output = Path(folder).absolute()
        if output.is_file():
            raise InputError(f"{field} {output} is a file: it must be a folder (or not exist yet)")
        for name in ("base_model_path", "checkpoint_dir"):
            source = getattr(config, name)
            if "://" not in source:
                src = Path(source).absolute()
                if output == src or src in output.parents or output in src.parents:
                    raise InputError(f"{field} {output} overlaps {name} {src}: the merge never writes into its inputs")
    merged, adapter = (Path(f).absolute() for f in folders.values())
    if merged == adapter or merged in adapter.parents or adapter in merged.parents:
        raise InputError(f"adapter_dir {adapter} overlaps output_dir {merged}: they must be separate folders")


def check_checkpoint(config: MergeConfig) -> None:
    """Not a run's folder, the LoRA settings (lora.json unless the config gives them), and the step
    to merge: complete, with its array data."""
    root = epath.Path(config.checkpoint_dir)
    if not root.exists():
        raise InputError(
            f"checkpoint directory {root} does not exist: checkpoint_dir must name the folder "
            "training wrote (<output_dir>/checkpoints)"
        )
    if not root.is_dir():
        raise InputError(f"checkpoint_dir {root} is a file: it must be the folder of lora.json and the step folders")
    lora_checkpoint.refuse_run_folder(config.checkpoint_dir)
    lora_checkpoint.resolve_lora(config.checkpoint_dir, config.lora)
    complete = {
        n: p for n, p in lora_checkpoint.step_folders(config.checkpoint_dir).items() if lora_checkpoint.committed(p)
    }
    step = max(complete, default=None) if config.step is None else config.step  # as the merge picks it
    if step is None or step not in complete:
        raise lora_checkpoint.no_step(config.checkpoint_dir, config.step, list(complete))
    lora_checkpoint.check_array_data(complete[step])
