"""The hand-written safetensors reading and shard writing agree with the safetensors library, byte for byte."""

import json
import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from gemma_workloads import safetensors_io as sio
from gemma_workloads.merging import shard_pipeline as sp

rng = np.random.default_rng(0)


def sample() -> dict[str, np.ndarray]:
    return {
        "w.bf16": rng.standard_normal((37, 11)).astype(ml_dtypes.bfloat16),
        "w.f32": rng.standard_normal((5, 3, 2)).astype(np.float32),
        "ids.i64": np.arange(7, dtype=np.int64),
        "scalar.f16": np.array(1.5, dtype=np.float16),
        "flag.bool": np.array([True, False, True]),
    }


@pytest.fixture
def pipeline():
    with ThreadPoolExecutor(2) as pool:
        yield sp.Pipeline.create(pool, 2)


def ready(data: bytes) -> sp.Block:
    return sp.Block(len(data), lambda: (memoryview(data), None))


def write(path, tensors, pipeline):
    """Our writer: header from (name, dtype, shape), then raw bytes."""
    names = {
        np.dtype(np.float32): "F32",
        np.dtype(ml_dtypes.bfloat16): "BF16",
        np.dtype(np.int64): "I64",
        np.dtype(np.float16): "F16",
        np.dtype(bool): "BOOL",
    }
    header = sio.header_bytes([(k, names[v.dtype], v.shape) for k, v in tensors.items()], {"format": "pt"})
    blocks = [ready(v.tobytes()) for v in tensors.values()]
    return sp.write_shard_file(path, header, iter(blocks), sum(v.nbytes for v in tensors.values()), pipeline)


def test_written_shards_read_back_with_safetensors(tmp_path, pipeline):
    tensors = sample()
    digest = write(tmp_path / "ours.safetensors", tensors, pipeline)
    import torch

    torch_dtypes = {
        "w.bf16": torch.bfloat16,
        "w.f32": torch.float32,
        "ids.i64": torch.int64,
        "scalar.f16": torch.float16,
        "flag.bool": torch.bool,
    }
    with safe_open(tmp_path / "ours.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"} and list(f.keys()) == sorted(tensors)
        for name, value in tensors.items():
            got = f.get_tensor(name)
            assert got.dtype == torch_dtypes[name] and tuple(got.shape) == value.shape, name
            assert got.reshape(-1).view(torch.uint8).numpy().tobytes() == value.tobytes(), name
    import hashlib

    assert digest == hashlib.sha256((tmp_path / "ours.safetensors").read_bytes()).hexdigest()


def test_headers_of_library_written_files_are_read(tmp_path):
    tensors = {k: v for k, v in sample().items() if v.dtype != ml_dtypes.bfloat16}
    save_file(tensors, tmp_path / "lib.safetensors")
    infos = sio.read_header(str(tmp_path / "lib.safetensors"))
    raw = (tmp_path / "lib.safetensors").read_bytes()
    assert sorted(i.name for i in infos) == sorted(tensors), "every tensor, once"
    for info in infos:
        value = tensors[info.name]
        assert (info.dtype, info.shape) == (
            {
                np.dtype(np.float32): "F32",
                np.dtype(np.int64): "I64",
                np.dtype(np.float16): "F16",
                np.dtype(bool): "BOOL",
            }[value.dtype],
            value.shape,
        )
        assert raw[info.offset : info.offset + info.nbytes] == value.tobytes()


class Rows:
    def __init__(self, delta):
        self.delta = delta

    def rows(self, start, stop, out):
        out[:] = self.delta[start:stop].reshape(out.shape)


@pytest.mark.parametrize("src,dst", [("BF16", "BF16"), ("F32", "BF16"), ("BF16", "F32"), ("F16", "F16")])
def test_merge_blocks_round_like_numpy(tmp_path, monkeypatch, src, dst):
    monkeypatch.setattr(sp, "BLOCK_BYTES", 2 * 11 * 5)  # 16-bit in: 5 rows a block, 37 rows take 8 blocks
    base = rng.standard_normal((37, 11)).astype(sio.FLOAT_DTYPES[src])
    delta = (0.1 * rng.standard_normal((37, 11))).astype(np.float32)
    save_file({"w": base.view(np.uint16) if src == "BF16" else base}, tmp_path / "in.safetensors")
    info = sio.read_header(str(tmp_path / "in.safetensors"))[0]
    info = sio.TensorInfo(info.name, src, info.shape, info.file, info.offset, info.nbytes)  # U16 on disk for bf16
    stop = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        # One buffer: every block must give it back for the next one to be read.
        pipeline = sp.Pipeline(sio.Reader(), sp.Buffers(1, stop), pool, 1, stop)
        blocks = sp.merge_blocks(pipeline.reader, info, Rows(delta), dst, pipeline.buffers)
        header = sio.header_bytes([("w", dst, (37, 11))], {})
        sp.write_shard_file(tmp_path / "out.safetensors", header, blocks, 37 * 11 * sio.ITEMSIZE[dst], pipeline)
    with safe_open(tmp_path / "out.safetensors", "flax") as f:
        got = np.asarray(f.get_tensor("w"))
    expected = (base.astype(np.float32) + delta).astype(sio.FLOAT_DTYPES[dst])
    assert got.tobytes() == expected.tobytes()


def test_copy_blocks_are_raw_bytes(tmp_path, monkeypatch, pipeline):
    monkeypatch.setattr(sp, "BLOCK_BYTES", 64)
    value = rng.standard_normal((50, 3)).astype(np.float32)
    save_file({"x": value}, tmp_path / "in.safetensors")
    info = sio.read_header(str(tmp_path / "in.safetensors"))[0]
    blocks = sp.copy_blocks(pipeline.reader, info)
    sp.write_shard_file(
        tmp_path / "out.safetensors", sio.header_bytes([("x", "F32", (50, 3))], {}), blocks, value.nbytes, pipeline
    )
    with safe_open(tmp_path / "out.safetensors", "numpy") as f:
        assert f.get_tensor("x").tobytes() == value.tobytes()


def test_ranges_are_the_same_mapped_or_read(tmp_path):
    """gs:// ranges are read, local ones mapped (at any alignment): the same bytes either way."""
    value = rng.standard_normal(5000).astype(np.float32)
    save_file({"x": value}, tmp_path / "in.safetensors")
    info = sio.read_header(str(tmp_path / "in.safetensors"))[0]
    reader = sio.Reader()
    for start, n in [(0, 20000), (4, 7), (4093, 9000)]:
        assert (
            bytes(reader.view(info, start, n))
            == bytes(reader._read(info, start, n))
            == value.tobytes()[start : start + n]
        )
    reader.close()


def test_a_shard_truncated_during_the_merge_is_an_error_not_a_crash(tmp_path):
    save_file({"x": np.zeros(5000, np.float32)}, tmp_path / "in.safetensors")
    info = sio.read_header(str(tmp_path / "in.safetensors"))[0]
    os.truncate(tmp_path / "in.safetensors", 1000)
    with pytest.raises(sio.CheckpointError, match="tensor x: file ended early"):
        sio.Reader().view(info, 0, info.nbytes)


def test_writer_refuses_a_shard_short_of_its_plan(tmp_path, pipeline):
    header = sio.header_bytes([("x", "F32", (4,))], {})
    with pytest.raises(RuntimeError, match="wrote .* bytes, planned"):
        sp.write_shard_file(tmp_path / "x.safetensors", header, iter([ready(b"\0" * 8)]), 16, pipeline)


def test_a_failing_block_stops_the_shard(tmp_path, pipeline):
    def boom():
        raise OSError("disk gone")

    header = sio.header_bytes([("x", "F32", (4,))], {})
    with pytest.raises(OSError, match="disk gone"):
        sp.write_shard_file(
            tmp_path / "x.safetensors", header, iter([ready(b"\0" * 8), sp.Block(8, boom)]), 16, pipeline
        )
    assert pipeline.stop.is_set()


def raw_file(path, header: dict, data: bytes):
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


@pytest.mark.parametrize(
    "header,data,message",
    [
        (
            {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
            b"\0" * 4,
            "tensor a ends at byte .* the shard is truncated",
        ),
        (
            {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
            b"\0" * 8,
            r"tensor a: 8 bytes do not hold F32\[3\]",
        ),
        ({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, "tensor a: unknown dtype Q4"),
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            b"\0" * 12,
            "tensors a and b overlap",
        ),
    ],
)
def test_bad_headers_name_the_tensor(tmp_path, header, data, message):
    raw_file(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(sio.CheckpointError, match=message):
        sio.read_header(str(tmp_path / "bad.safetensors"))


def test_not_safetensors_at_all(tmp_path):
    (tmp_path / "x.safetensors").write_bytes(b"abc")
    with pytest.raises(sio.CheckpointError, match="not a safetensors file"):
        sio.read_header(str(tmp_path / "x.safetensors"))
    (tmp_path / "y.safetensors").write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(sio.CheckpointError, match="header of 1000000000 bytes is longer than the file"):
        sio.read_header(str(tmp_path / "y.safetensors"))


def test_index_must_agree_with_the_shards(tmp_path):
    save_file({"a": np.zeros(2, np.float32)}, tmp_path / "model-00001-of-00001.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00001.safetensors", "b": "model-00001-of-00001.safetensors"}}
    (tmp_path / sio.INDEX).write_text(json.dumps(index))
    with pytest.raises(
        sio.CheckpointError, match="puts tensor b in model-00001-of-00001.safetensors, but that shard does not hold it"
    ):
        sio.open_checkpoint(str(tmp_path))
    with pytest.raises(sio.CheckpointError, match="neither model.safetensors.index.json nor model.safetensors"):
        sio.open_checkpoint(str(tmp_path / "nothing"))
