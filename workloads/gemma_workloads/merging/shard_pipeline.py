"""One output shard written as a pipeline of blocks, with bounded memory.

A shard is its header and then blocks of bytes at offsets known in advance. The shard's own
thread maps each block's input range (and, for a merged tensor, takes an output buffer); a
pool of workers does the maths and writes the block at its offset, so writes run in parallel;
one more thread hashes the blocks in file order and gives their buffers back. A fixed set of
buffers bounds memory, and reusing them matters: fresh memory costs a page fault per 4 KiB,
slower than the disk on a VM.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from queue import Empty, Full, Queue
from typing import Protocol

import numpy as np

from gemma_workloads.safetensors_io import FLOAT_DTYPES, Reader, TensorInfo

BLOCK_BYTES = 8 << 20  # input per block: large enough for full disk speed, small for memory

Chunk = tuple[memoryview, bytearray | None]  # bytes written, and the `Buffers` buffer they lie in


@dataclass(frozen=True)
class Block:
    nbytes: int  # output bytes
    make: Callable[[], Chunk]


class RowDelta(Protocol):
    """Writes rows [start, stop) of a float32 delta, in the tensor's own layout, into `out`."""

    def rows(self, start: int, stop: int, out: np.ndarray) -> None: ...


class Buffers:
    """A fixed set of output buffers, each twice an input block (float32 out of 16-bit in)."""

    def __init__(self, count: int, stop: threading.Event) -> None:
        self._free: Queue[bytearray] = Queue()
        self._stop = stop
        for _ in range(count):
            self._free.put(bytearray(2 * BLOCK_BYTES))

    def take(self) -> bytearray:
        """The next free buffer; gives up once `stop` is set (a failed shard gives none back)."""
        while not self._stop.is_set():
            with contextlib.suppress(Empty):
                return self._free.get(timeout=0.1)
        raise InterruptedError("stopped: another shard failed")

    def give(self, buf: bytearray) -> None:
        self._free.put(buf)


@dataclass(frozen=True)
class Pipeline:
    """What the shards being written share."""

    reader: Reader
    buffers: Buffers
    pool: ThreadPoolExecutor  # the maths and the writes
    ahead: int  # blocks in flight per shard
    stop: threading.Event  # set when a shard fails, so the others stop too

    @classmethod
    def create(cls, pool: ThreadPoolExecutor, workers: int) -> Pipeline:
        stop = threading.Event()
        return cls(Reader(), Buffers(4 * workers + 2, stop), pool, 2 * workers, stop)


def copy_blocks(reader: Reader, info: TensorInfo) -> Iterator[Block]:
    """Raw bytes through: no parsing, no conversion."""
    for start, stop in _ranges(info.nbytes, BLOCK_BYTES):
        view = reader.view(info, start, stop - start)
        yield Block(len(view), lambda view=view: (view, None))  # type: ignore[misc]  # the default binds this block's view


def merge_blocks(
    reader: Reader, info: TensorInfo, delta: RowDelta, out_dtype: str, buffers: Buffers
) -> Iterator[Block]:
    """W + delta in float32 a block of rows at a time, cast to `out_dtype` (round to nearest even)."""
    in_dtype, out_np = FLOAT_DTYPES[info.dtype], FLOAT_DTYPES[out_dtype]
    row_items = math.prod(info.shape[1:])
    for start, stop in _ranges(info.shape[0], max(1, BLOCK_BYTES // (in_dtype.itemsize * row_items))):
        shape = (stop - start, row_items)
        view = reader.view(info, start * row_items * in_dtype.itemsize, math.prod(shape) * in_dtype.itemsize)
        raw, buf = np.frombuffer(view, in_dtype).reshape(shape), buffers.take()

        def make(raw: np.ndarray = raw, buf: bytearray = buf, start: int = start, stop: int = stop) -> Chunk:
            acc = _scratch(raw.shape)
            delta.rows(start, stop, acc)
            acc += raw
            out = np.frombuffer(buf, out_np, acc.size).reshape(acc.shape)
            np.copyto(out, acc, casting="unsafe")
            return memoryview(buf)[: out.nbytes], buf

        yield Block(math.prod(shape) * out_np.itemsize, make)


def write_shard_file(path: Path, header: bytes, blocks: Iterator[Block], data_bytes: int, pipeline: Pipeline) -> str:
    """Write the header and the blocks, sync, and return the file's sha256 (as the Hub names files)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sha = hashlib.sha256(header)
    queue: Queue[Future | None] = Queue(maxsize=pipeline.ahead)

    def hash_in_order() -> None:
        while (future := queue.get()) is not None:
            data, buf = future.result()
            sha.update(data)
            if buf is not None:
                pipeline.buffers.give(buf)

    try:
        _pwrite(fd, header, 0)
        offset = len(header)
        with ThreadPoolExecutor(1) as hasher:
            hashed = hasher.submit(hash_in_order)
            try:
                for block in blocks:
                    _put(queue, pipeline.pool.submit(_write, fd, block, offset), hashed, pipeline.stop)
                    offset += block.nbytes
                _put(queue, None, hashed, pipeline.stop)
                hashed.result()
            except BaseException:
                pipeline.stop.set()
                while not hashed.done():  # unblock the hashing thread, then let it end
                    with contextlib.suppress(Empty):
                        queue.get_nowait()
                    queue.put(None)
                raise
        if offset != len(header) + data_bytes:
            raise RuntimeError(f"{path}: wrote {offset} bytes, planned {len(header) + data_bytes}")
        os.fsync(fd)
    finally:
        os.close(fd)
    return sha.hexdigest()


def _write(fd: int, block: Block, offset: int) -> Chunk:
    data, buf = block.make()
    if len(data) != block.nbytes:
        raise RuntimeError(f"a block made {len(data)} bytes, planned {block.nbytes}")
    _pwrite(fd, data, offset)
    return data, buf


def _pwrite(fd: int, data: memoryview | bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _put(queue: Queue, item: Future | None, hashed: Future, stop: threading.Event) -> None:
    """Queue an item, waking up to notice a failed hashing thread or another shard's failure."""
    while True:
        if hashed.done():
            hashed.result()  # raises its error
            raise RuntimeError("the hashing thread stopped early")
        if stop.is_set():
            raise InterruptedError("stopped: another shard failed")
        with contextlib.suppress(Full):
            return queue.put(item, timeout=0.1)


_local = threading.local()


def _scratch(shape: tuple[int, int]) -> np.ndarray:
    """A float32 buffer of this thread's, reused across blocks like `Buffers`."""
    size = math.prod(shape)
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < size:
        buf = _local.buf = np.empty(max(size, BLOCK_BYTES // 2), np.float32)
    return buf[:size].reshape(shape)


def _ranges(n: int, size: int) -> Iterator[tuple[int, int]]:
    for start in range(0, n, size):
        yield start, min(n, start + size)
