"""Broken inputs of the kinds that reach a real cluster, each through the real entry point
(`python -m gemma_workloads train|merge`): exit 2, a termination message naming the file and the
place in it, no traceback, nothing written, and JAX never imported (so no device touched)."""

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from gemma_devcluster import tiny
from gemma_workloads.config import EXIT_INVALID_INPUT

SHARD = "model-0000{}-of-00003.safetensors"
DATA_PATH = "/1/model_params/ocdbt.process_0/d"
LOCAL = "sliding_attention"


@dataclass
class Inputs:
    """One run's inputs, copied fresh for each case so that each can break them."""

    config: dict
    text: str | None = None  # the config file's text, if not the config above
    missing: bool = False  # no config file at all

    @property
    def model(self) -> Path:
        return Path(self.config.get("model_path") or self.config["base_model_path"])

    @property
    def dataset(self) -> Path:
        return Path(self.config["dataset"]["path"])

    @property
    def checkpoint(self) -> Path:
        return Path(self.config["checkpoint_dir"])


@pytest.fixture(scope="module")
def lora_checkpoint(tiny_sharded, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lora") / "checkpoints"
    tiny.write_lora_checkpoint(path, tiny_sharded.config, rank=2, alpha=2.0)
    return path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return tiny.write_dataset(tmp_path_factory.mktemp("data") / "chat.jsonl", "chat", n=8)


def inputs(workload: str, root: Path, model: Path, dataset: Path, checkpoint: Path) -> Inputs:
    shutil.copytree(model, root / "model")
    common = {"output_dir": str(root / "out"), "termination_log": str(root / "termination-log")}
    if workload == "train":
        shutil.copy(dataset, root / "chat.jsonl")
        config = {
            "model_path": str(root / "model"),
            "dataset": {"path": str(root / "chat.jsonl"), "max_seq_len": 64},
            "steps": 2,
            "batch_size": 2,
            **common,
        }
    else:
        shutil.copytree(checkpoint, root / "checkpoints")
        config = {"base_model_path": str(root / "model"), "checkpoint_dir": str(root / "checkpoints"), **common}
    return Inputs(config)


# ---------------------------------------------------------------------------- ways to break an input


def lfs_pointer(path: Path) -> None:
    """What a clone without git-lfs leaves (the pointer format of git-lfs's docs/spec.md)."""
    path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\nsize 1048576\n")


def truncate(path: Path, keep: float) -> None:
    os.truncate(path, int(path.stat().st_size * keep))


def header_length(path: Path, length: int) -> None:
    with path.open("r+b") as f:
        f.write(struct.pack("<Q", length))


def patch_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def llama(path: Path) -> None:
    path.write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 96,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "vocab_size": 512,
            }
        )
    )


def replace_line(path: Path, number: int, raw: bytes) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    lines[number - 1] = raw
    path.write_bytes(b"".join(lines))


def into_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


def run_folder(i: Inputs) -> None:
    """The checkpoints inside a run's folder, as training writes them (<output_dir>/checkpoints), and
    the run's folder given for them."""
    run = i.checkpoint.with_name("run")
    run.mkdir()
    i.checkpoint.rename(run / "checkpoints")
    i.config["checkpoint_dir"] = str(run)


def config_text(text: str) -> Callable[[Inputs], None]:
    return lambda i: setattr(i, "text", text)


def set_config(**changes) -> Callable[[Inputs], None]:
    def change(i: Inputs) -> None:
        for key, value in changes.items():
            i.config[key] = i.config.get(key, {}) | value if isinstance(value, dict) else value

    return change


Break = Callable[[Inputs], None]
# (workload, how the input is broken, the error expected in the termination message)
CASES: dict[str, tuple[str, Break, str]] = {
    # The table.
    "shards are git-lfs pointer files": (
        "train",
        lambda i: lfs_pointer(i.model / SHARD.format(1)),
        rf"{SHARD.format(1)}: a Git LFS pointer file \(\d+ bytes\), not the weights: fetch them \(`git lfs pull`",
    ),
    "the index names a shard that does not exist": (
        "train",
        lambda i: (i.model / SHARD.format(3)).unlink(),
        rf"shard {SHARD.format(3)}, named in model\.safetensors\.index\.json, is missing \(it holds model\.\S+ and "
        r"\d+ more\): copy the whole folder again",
    ),
    "a shard truncated mid-file": (
        "train",
        lambda i: truncate(i.model / SHARD.format(2), 0.5),
        rf"{SHARD.format(2)}: tensor model\.\S+ ends at byte \d+ but the file has \d+: the shard is truncated; copy",
    ),
    "a header pointing past the end of the file": (
        "train",
        lambda i: header_length(i.model / SHARD.format(1), 10**6),
        rf"{SHARD.format(1)}: header of 1000000 bytes is longer than the file \(\d+ bytes\): truncated",
    ),
    "config.json that is not JSON": (
        "train",
        lambda i: (i.model / "config.json").write_text("{\n  'model_type': gemma4\n"),
        r"model/config\.json: not valid JSON \(line 2 column 3: Expecting property name enclosed in double quotes\)",
    ),
    "a corrupt tokenizer.json": (
        "train",
        lambda i: truncate(i.model / "tokenizer.json", 0.5),
        r"model/tokenizer\.json: not a tokenizer the tokenizers library can load \(EOF while parsing .* at line \d+",
    ),
    "a config.json of another architecture": (
        "train",
        lambda i: llama(i.model / "config.json"),
        r"config\.json: model_type 'llama' \(architectures \['LlamaForCausalLM'\]\) is not Gemma 4",
    ),
    "one byte that is not UTF-8 in the dataset": (
        "train",
        lambda i: replace_line(i.dataset, 3, b'{"messages": [{"role": "user", "content": "caf\xe9"}]}\n'),
        r"chat\.jsonl:3: byte 0xe9 at column 47 is not UTF-8 \(save the file as UTF-8\)",
    ),
    "a merge config that is not valid YAML": (
        "merge",
        config_text("base_model_path: [unclosed\n"),
        r"config \S+: line 2 column 1: neither JSON nor YAML \(expected ',' or ']', but got '<stream end>'\)",
    ),
    "a corrupt lora.json": (
        "merge",
        lambda i: truncate(i.checkpoint / "lora.json", 0.5),
        r"checkpoints/lora\.json: not valid JSON \(line 1 column \d+: .*\): the file is truncated or damaged; set",
    ),
    "a checkpoint copied without its array data": (
        "merge",
        lambda i: shutil.rmtree(str(i.checkpoint) + DATA_PATH),
        rf"{re.escape(DATA_PATH)}: array data missing or empty: copy the whole step folder again",
    ),
    "a checkpoint step folder without its parameters": (
        "merge",
        lambda i: shutil.rmtree(i.checkpoint / "1" / "model_params"),
        r"checkpoints: no complete checkpoint step: step 1 lacks its LoRA parameters, the folder "
        r"\S+/checkpoints/1/model_params: copy the whole step folder again",
    ),
    "the step asked for without its parameters": (
        "merge",
        lambda i: (shutil.rmtree(i.checkpoint / "1" / "model_params"), i.config.update(step=1)),
        r"checkpoints: step 1 is not a complete checkpoint: it lacks its LoRA parameters, the folder "
        r"\S+/checkpoints/1/model_params; copy the whole step folder again, or merge a complete step \(complete: \[\]\)",
    ),
    "a step folder whose save was never committed": (
        "merge",
        lambda i: (i.checkpoint / "1" / "_CHECKPOINT_METADATA").unlink(),
        r"no complete checkpoint step: step 1 lacks the record of a committed save, \S+/checkpoints/1/"
        r"_CHECKPOINT_METADATA \(an aborted save, or a copy in part\)",
    ),
    "a checkpoint folder without a step folder": (
        "merge",
        lambda i: shutil.rmtree(i.checkpoint / "1"),
        r"checkpoints: no checkpoint step: training saves each step in a folder named by its number, such as "
        r"\S+/checkpoints/100, beside lora\.json",
    ),
    "the run's folder given for its checkpoints": (
        "merge",
        run_folder,
        r"checkpoint_dir (\S+/run) looks like a run folder: it holds checkpoints/ and neither lora\.json nor a step "
        r"folder; set checkpoint_dir to its checkpoints/ folder, \1/checkpoints$",
    ),
    "the run's folder given for its checkpoints, with the LoRA settings in the config": (
        "merge",
        lambda i: (run_folder(i), i.config.update(lora={"rank": 2, "alpha": 2.0})),
        r"checkpoint_dir (\S+/run) looks like a run folder: .*set checkpoint_dir to its checkpoints/ folder, "
        r"\1/checkpoints$",
    ),
    "a dataset path that is a folder": (
        "train",
        lambda i: into_folder(i.dataset),
        r"dataset \S+chat\.jsonl is a folder: dataset\.path must name",
    ),
    "a model path that is a file": (
        "train",
        lambda i: i.config.update(model_path=str(i.model / "config.json")),
        r"config\.json is a file: the model path must be the model's folder",
    ),
    "a base model folder without config.json, at merge": (
        "merge",
        lambda i: (i.model / "config.json").unlink(),
        r"model/config\.json is missing",
    ),
    # More of the same kinds.
    "merge: shards are git-lfs pointer files": (
        "merge",
        lambda i: lfs_pointer(i.model / SHARD.format(2)),
        rf"{SHARD.format(2)}: a Git LFS pointer file",
    ),
    "a Gemma 4 config without a field the loader needs": (
        "train",
        lambda i: patch_json(i.model / "config.json", head_dim=None),
        r"config\.json: field head_dim is missing; a Gemma 4 config\.json has it",
    ),
    "shards of another size than config.json": (
        "train",
        lambda i: patch_json(i.model / "config.json", vocab_size=1024),
        r"tensor model\.embed_tokens\.weight is \[512, 96\], but \S+config\.json gives vocab_size x hidden_size "
        r"\[1024, 96\]: the weights and config\.json are of different models",
    ),
    "config.json with more layers than the shards hold": (
        "merge",
        lambda i: patch_json(i.model / "config.json", num_hidden_layers=3, layer_types=[LOCAL] * 3),
        r"no tensors for decoder layer\(s\) \[2\] of the 3 in \S+config\.json: the copy is incomplete",
    ),
    "a truncated generation_config.json": (
        "train",
        lambda i: truncate(i.model / "generation_config.json", 0.5),
        r"generation_config\.json: not valid JSON \(line \d+ column \d+: .*\): the file is truncated or damaged",
    ),
    "a chat template that does not compile": (
        "train",
        lambda i: (i.model / "chat_template.jinja").write_text("{{ bos_token }}\n{% for m in messages %}\n"),
        r"chat_template\.jinja:\d+: chat template syntax error: Unexpected end of template",
    ),
    "a lora.json field of the wrong type": (
        "merge",
        lambda i: patch_json(i.checkpoint / "lora.json", rank="sixty-four"),
        r"lora\.json: field rank: Input should be a valid integer",
    ),
    "a checkpoint_dir that is a file": (
        "merge",
        lambda i: i.config.update(checkpoint_dir=str(i.checkpoint / "lora.json")),
        r"checkpoint_dir \S+lora\.json is a file",
    ),
    # Cases handled before, kept handled.
    "a missing dataset": ("train", lambda i: i.dataset.unlink(), r"dataset \S+chat\.jsonl not found"),
    "a dataset line that is not JSON": (
        "train",
        lambda i: replace_line(i.dataset, 2, b'{"messages": [\n'),
        r"chat\.jsonl:2: invalid JSON",
    ),
    "wrong field names": (
        "train",
        lambda i: replace_line(i.dataset, 1, b'{"conversation": []}\n'),
        r"chat\.jsonl:1: format 'chat' needs field\(s\) \['messages'\]",
    ),
    "an empty dataset": ("train", lambda i: i.dataset.write_text(""), r"chat\.jsonl has no usable examples"),
    "an unknown target module": (
        "train",
        set_config(lora={"target_modules": ["q_proj", "qkv_proj"]}),
        r"config \S+: lora: Value error, unknown LoRA target module\(s\) \['qkv_proj'\]",
    ),
    "rank 0": ("train", set_config(lora={"rank": 0}), r"config \S+: lora\.rank: Input should be greater than or equal"),
    "an unknown field": ("train", set_config(learning_rat=0.1), r"config \S+: learning_rat: Extra inputs are not"),
    "a training config that is not valid YAML": (
        "train",
        config_text("dataset: {path: x\n"),
        r"config \S+: line \d+ column \d+: neither JSON nor YAML",
    ),
    "a missing config file": ("merge", lambda i: setattr(i, "missing", True), r"config \S+: \[Errno 2\] No such file"),
    "an output inside an input": (
        "merge",
        lambda i: i.config.update(output_dir=str(i.model / "out")),
        r"overlaps base_model_path .* never",
    ),
    # The evaluation after training.
    "an evaluation without rows to score": (
        "train",
        set_config(evaluation={}),
        r"evaluation: no rows to score: set evaluation\.path .* or "
        r"dataset\.eval_fraction",
    ),
    "a missing eval file": (
        "train",
        lambda i: i.config.update(evaluation={"path": str(i.dataset.with_name("eval.jsonl")), "max_new_tokens": 8}),
        r"dataset \S+eval\.jsonl not found",
    ),
    "an eval line without an answer": (
        "train",
        lambda i: eval_file(i, b'{"messages": [{"role": "user", "content": "Hi"}]}\n'),
        r"eval\.jsonl:2: no assistant message with content",
    ),
    "an expected_regex that does not compile": (
        "train",
        lambda i: eval_file(
            i,
            b'{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", '
            b'"content": "Hello"}], "expected_regex": "Hel(lo"}\n',
        ),
        r"eval\.jsonl:2: field 'expected_regex': 'Hel\(lo' is not a valid regular expression \(missing \), ",
    ),
    "an expected_regex of the wrong type in the held-out data": (
        "train",
        lambda i: (
            replace_line(
                i.dataset,
                1,
                b'{"messages": [{"role": "user", "content": "Hi"}, '
                b'{"role": "assistant", "content": "Hello"}], '
                b'"expected_regex": 3}\n',
            ),
            i.config.update(evaluation={"max_new_tokens": 8}),
            i.config["dataset"].update(eval_fraction=0.2),
        ),
        r"chat\.jsonl:1: field 'expected_regex' must be a non-empty string, got 3",
    ),
    "more new tokens than the sequence holds": (
        "train",
        lambda i: (i.config["dataset"].update(eval_fraction=0.2), i.config.update(evaluation={"max_new_tokens": 64})),
        r"evaluation\.max_new_tokens 64 leaves no room for a prompt within dataset\.max_seq_len 64",
    ),
}


def eval_file(i: Inputs, line: bytes) -> None:
    """An eval file of the dataset's first line, then `line`."""
    path = i.dataset.with_name("eval.jsonl")
    path.write_bytes(i.dataset.read_bytes().splitlines(keepends=True)[0] + line)
    i.config["evaluation"] = {"path": str(path), "max_new_tokens": 8}


@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_input_exits_2_naming_it_before_jax_is_imported(
    case, tmp_path, tiny_sharded, dataset, lora_checkpoint
):
    workload, breaks, expected = CASES[case]
    i = inputs(workload, tmp_path, tiny_sharded.path, dataset, lora_checkpoint)
    breaks(i)
    path = tmp_path / "config.yaml"
    if not i.missing:
        path.write_text(i.text or json.dumps(i.config))
    command = [sys.executable, "-X", "importtime", "-m", "gemma_workloads", workload, "--config", str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    # Python's own log of every module imported: without jax, no device can have been touched.
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    stderr = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("import time:"))
    assert done.returncode == EXIT_INVALID_INPUT, stderr
    assert "Traceback" not in stderr and re.search(expected, stderr.removeprefix("error: ")), stderr
    assert "jax" not in imported and "gemma_workloads.preflight" in imported
    if not stderr.startswith("error: config "):  # a config that does not load cannot name its termination log
        result = json.loads(Path(i.config["termination_log"]).read_text())
        assert result["status"] == "failed" and re.search(expected, result["error"]), result
    out = Path(i.config["output_dir"])
    assert not out.exists() and not out.with_name(out.name + ".partial").exists(), "nothing is written"
