"""How long the pre-flight check takes on inputs of the 31B model's size.

Builds a Gemma-4-31B-shaped folder (60 layers, vocab 262,144, bf16, shards of about 5 GB) whose
shards are sparse files: the headers are real, the weights are holes, so it costs no disk and
the check reads what it would read on a real copy. The tokenizer has the real vocabulary's size
(a word-level one: the real BPE file is larger, with its merges). The dataset is N chat lines.
It prints the time of each part of the check, in process, then the wall time of
`python -m gemma_workloads train` refusing the same folder with one shard a Git LFS pointer
(process start to exit 2), and deletes what it wrote.

    python benchmarks/preflight.py [--lines 50000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from etils import epath

from gemma_devcluster import tiny
from gemma_workloads import model_folder, preflight
from gemma_workloads.config import TrainConfig
from gemma_workloads.safetensors_io import INDEX, header_bytes, open_checkpoint
from merge import config_31b  # benchmarks/merge.py: the 31B model's widths and layer pattern

LAYERS, VOCAB = 60, 262144
SHARD_BYTES = 5 * 10**9


def write_sparse_model(root: Path) -> int:
    """The 31B layout's config, index and shards (real headers, holes for data); its size in bytes."""
    config = config_31b(LAYERS, VOCAB)
    groups, size = [[]], 0
    for name, shape in config.tensor_shapes(prefix="model.language_model.").items():
        nbytes = 2 * int(math.prod(shape))
        if groups[-1] and size + nbytes > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append((name, "BF16", shape))
        size += nbytes
    weight_map, total = {}, 0
    for i, entries in enumerate(groups, start=1):
        name = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        header = header_bytes(entries, {"format": "pt"})
        with (root / name).open("wb") as f:
            f.write(header)
        data = sum(2 * int(math.prod(s)) for _, _, s in entries)
        os.truncate(root / name, len(header) + data)
        weight_map.update({n: name for n, _, _ in entries})
        total += data
    (root / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps({"model_type": "gemma4", "text_config": config.hf_config("bfloat16")}))
    return total


def write_tokenizer(root: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(tiny.SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(vocab), vocab_size)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}))
    (root / "chat_template.jinja").write_text(tiny.CHAT_TEMPLATE)


def timed(label: str, fn, *args) -> None:
    start = time.perf_counter()
    fn(*args)
    print(f"  {label:<34} {time.perf_counter() - start:7.3f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=50_000, help="chat lines in the dataset")
    parser.add_argument("--dir", help="where to build the inputs (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as work:
        root = Path(work)
        model = root / "model"
        model.mkdir()
        size = write_sparse_model(model)
        write_tokenizer(model, VOCAB)
        dataset = tiny.write_dataset(root / "chat.jsonl", "chat", n=args.lines)
        config = TrainConfig(
            model_path=str(model),
            dataset={"path": str(dataset)},
            output_dir=str(root / "out"),
            termination_log=str(root / "termination-log"),
        )
        shards = len(list(model.glob("*.safetensors")))
        print(
            f"31B-shaped folder: {shards} shards, {size / 1e9:.1f} GB of (sparse) weights; "
            f"tokenizer.json {(model / 'tokenizer.json').stat().st_size / 1e6:.1f} MB; "
            f"dataset {args.lines} lines, {dataset.stat().st_size / 1e6:.1f} MB"
        )
        path = epath.Path(model)
        timed("config.json", model_folder.check_config, path)
        timed("every shard's header + the index", open_checkpoint, str(model))
        timed("tokenizer + chat template", lambda: model_folder.check_tokenizer(path, chat=True))
        timed("dataset, line by line", preflight.check_dataset, config.dataset)
        timed("check_train, all of it", preflight.check_train, config)

        sorted(model.glob("*.safetensors"))[shards // 2].write_text("version https://git-lfs.github.com/spec/v1\n")
        (root / "train.json").write_text(config.dumps())
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "gemma_workloads", "train", "--config", str(root / "train.json")],
            capture_output=True,
            text=True,
        )
        print(
            f"python -m gemma_workloads train, a Git LFS pointer: exit {done.returncode} after "
            f"{time.perf_counter() - start:.2f} s: {done.stderr.strip()[:160]}"
        )


if __name__ == "__main__":
    main()
