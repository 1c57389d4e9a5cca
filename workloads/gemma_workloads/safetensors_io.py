"""The safetensors format, read and written in pieces, so memory never holds a whole checkpoint.

A file is an 8-byte little-endian header length, a JSON header (`name -> dtype, shape,
data_offsets`), then the raw tensor bytes. Reading a tensor is mapping a byte range; writing a
shard is its header (every size is known from the plan) and then each tensor's bytes at known
offsets. So tensors without LoRA go through as raw bytes, with no parsing or dtype conversion.
"""

from __future__ import annotations

import itertools
import json
import math
import mmap
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import ml_dtypes
import numpy as np
from etils import epath

from gemma_workloads.input_files import COPY_AGAIN, InputError, read_json

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"

ITEMSIZE = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U16": 2,
    "I16": 2,
    "F16": 2,
    "BF16": 2,
    "U32": 4,
    "I32": 4,
    "F32": 4,
    "U64": 8,
    "I64": 8,
    "F64": 8,
}
# Floating dtypes a LoRA delta can be added to, and merge output dtypes.
FLOAT_DTYPES = {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16)}
DTYPE_NAMES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


# The first line of a Git LFS pointer file (git-lfs, docs/spec.md): what a clone without
# `git lfs` leaves in place of each weight file.
LFS_POINTER = b"version https://git-lfs.github.com/spec/"


class CheckpointError(InputError):
    """A base checkpoint that cannot be read as it claims to be; the message names the file and tensor."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes lie: `offset` is absolute within `file`."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    offset: int
    nbytes: int


def read_header(path: str) -> list[TensorInfo]:
    """A shard's tensors in file order, checked against the file's size (truncation, overlaps)."""
    p = epath.Path(path)
    with p.open("rb") as f:
        size = _size(f)
        raw = f.read(len(LFS_POINTER))
        if raw.startswith(LFS_POINTER):
            raise CheckpointError(
                f"{path}: a Git LFS pointer file ({size} bytes), not the weights: fetch them "
                "(`git lfs pull` in the clone, or `huggingface-cli download`)"
            )
        if len(raw) < 8:
            raise CheckpointError(
                f"{path}: not a safetensors file (shorter than its 8-byte header length); {COPY_AGAIN}"
            )
        (n,) = struct.unpack("<Q", raw[:8])
        if n > size - 8:
            raise CheckpointError(
                f"{path}: header of {n} bytes is longer than the file ({size} bytes): "
                f"truncated or not safetensors; {COPY_AGAIN}"
            )
        f.seek(8)
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: unreadable safetensors header ({e}); {COPY_AGAIN}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header is not a JSON object; {COPY_AGAIN}")
    header.pop("__metadata__", None)
    data_start, tensors = 8 + n, []
    for name, entry in header.items():
        dtype, shape, (start, end) = _entry(path, name, entry)
        if end - start != math.prod(shape) * ITEMSIZE[dtype]:
            raise CheckpointError(f"{path}: tensor {name}: {end - start} bytes do not hold {dtype}{list(shape)}")
        if data_start + end > size:
            raise CheckpointError(
                f"{path}: tensor {name} ends at byte {data_start + end} but the file has {size}: "
                f"the shard is truncated; {COPY_AGAIN}"
            )
        tensors.append(TensorInfo(name, dtype, shape, path, data_start + start, end - start))
    tensors.sort(key=lambda t: t.offset)
    for prev, cur in itertools.pairwise(tensors):
        if cur.offset < prev.offset + prev.nbytes:
            raise CheckpointError(f"{path}: tensors {prev.name} and {cur.name} overlap")
    return tensors


def _entry(path: str, name: str, entry) -> tuple[str, tuple[int, ...], tuple[int, int]]:
    """One header entry's dtype, shape and data offsets, each checked for its type."""
    try:
        dtype, shape, (start, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        if not all(isinstance(x, int) and x >= 0 for x in (*shape, start, end)) or start > end:
            raise ValueError
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(
            f"{path}: tensor {name}: malformed header entry {json.dumps(entry)[:200]}; {COPY_AGAIN}"
        ) from None
    if dtype not in ITEMSIZE:
        raise CheckpointError(f"{path}: tensor {name}: unknown dtype {dtype}")
    return dtype, shape, (start, end)


def _size(f: BinaryIO) -> int:
    here = f.tell()
    size = f.seek(0, os.SEEK_END)
    f.seek(here)
    return size


@dataclass(frozen=True)
class BaseCheckpoint:
    """The weights of an HF model directory: its shard files and every tensor, in storage order."""

    path: str
    tensors: list[TensorInfo]


def open_checkpoint(path: str) -> BaseCheckpoint:
    """Sharded (index + files) or single `model.safetensors`; the index must match the shards."""
    root = epath.Path(path)
    if (root / INDEX).exists():
        weight_map = read_json(root / INDEX, error=CheckpointError)
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{root / INDEX}: no weight_map of tensor name -> shard file; {COPY_AGAIN}")
        files = sorted(set(weight_map.values()))
    elif (root / SINGLE).exists():
        weight_map, files = {}, [SINGLE]
    else:
        raise CheckpointError(f"{path}: neither {INDEX} nor {SINGLE}: not a Hugging Face safetensors checkpoint")
    tensors: list[TensorInfo] = []
    for name in files:
        if not (root / name).exists():
            needed = sorted(k for k, v in weight_map.items() if v == name)
            raise CheckpointError(
                f"{path}: shard {name}, named in {INDEX}, is missing (it holds {needed[0]} and "
                f"{len(needed) - 1} more): copy the whole folder again"
            )
        tensors += read_header(str(root / name))
    where: dict[str, str] = {}
    for t in tensors:
        if t.name in where:
            raise CheckpointError(f"{path}: tensor {t.name} is in both {where[t.name]} and {Path(t.file).name}")
        where[t.name] = Path(t.file).name
    for name, file in weight_map.items():
        if where.get(name) != file:
            raise CheckpointError(f"{path}: {INDEX} puts tensor {name} in {file}, but that shard does not hold it")
    return BaseCheckpoint(path, tensors)


class Reader:
    """Byte ranges of the shards, mapped rather than read where the file is local: the maths reads
    the page cache directly and copied tensors go from the mapping to `write`, one kernel copy
    as in a plain file copy (a read into our memory would double that, and it showed). Each
    mapping lives as long as the views of it; elsewhere (gs://) ranges are read."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def view(self, info: TensorInfo, start: int, nbytes: int) -> memoryview:
        if "://" in info.file:
            return self._read(info, start, nbytes)
        with self._lock:
            if info.file not in self._fds:
                self._fds[info.file] = os.open(info.file, os.O_RDONLY)
            fd = self._fds[info.file]
        offset = info.offset + start
        if os.fstat(fd).st_size < offset + nbytes:  # reading a mapping past the end kills the process
            raise CheckpointError(f"{info.file}: tensor {info.name}: file ended early (truncated while merging?)")
        aligned = offset - offset % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(fd, offset + nbytes - aligned, offset=aligned, access=mmap.ACCESS_READ)
        mapped.madvise(mmap.MADV_WILLNEED)  # start reading now; the maths comes later
        return memoryview(mapped)[offset - aligned :]

    def _read(self, info: TensorInfo, start: int, nbytes: int) -> memoryview:
        buf = memoryview(bytearray(nbytes))
        with epath.Path(info.file).open("rb") as f:
            f.seek(info.offset + start)
            got = 0
            while got < nbytes:
                n = f.readinto(buf[got:])
                if not n:
                    raise CheckpointError(
                        f"{info.file}: tensor {info.name}: file ended early (truncated while merging?)"
                    )
                got += n
        return buf

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def header_bytes(entries: list[tuple[str, str, tuple[int, ...]]], metadata: dict[str, str]) -> bytes:
    """The 8-byte length and JSON header of a shard holding (name, dtype, shape) in this order,
    padded with spaces to 8 bytes as safetensors itself does."""
    header: dict = {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape in entries:
        nbytes = math.prod(shape) * ITEMSIZE[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text
