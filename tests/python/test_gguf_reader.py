"""hsx's GGUF reader against the `gguf` package (llama.cpp's own Python reader and writer):
files written by gguf's GGUFWriter, with metadata of every value type and tensors of every
type hsx reads, filled with random blocks; hsx_gguf_dump's metadata must equal GGUFReader's
and its f32 tensors must equal gguf.quants.dequantize bit for bit.
"""
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from safetensors_numpy import read_safetensors  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
HSX = pathlib.Path(os.environ.get("HSX_BINARY", ROOT / "build" / "src" / "hsx"))
DUMP = HSX.parents[1] / "tests" / "hsx_gguf_dump"
Q = gguf.GGMLQuantizationType
TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
# Byte offsets of each block's f16 scales (d, m, dmin): random bytes there are replaced by
# finite halves, as a quantizer writes (the other bytes stay random: every bit pattern is valid).
HALF_OFFSETS = {Q.Q8_0: [0], Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q2_K: [80, 82],
                Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}


def random_blocks(rng, qtype, rows, cols):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype == Q.F32:
        return rng.standard_normal((rows, cols)).astype(np.float32)
    if qtype == Q.F16:  # every finite half, subnormals included
        bits = rng.integers(0, 0x7C00, (rows, cols), dtype=np.uint16) | (rng.integers(0, 2, (rows, cols), dtype=np.uint16) << 15)
        return bits.view(np.float16)
    if qtype == Q.BF16:  # finite values over the whole exponent range
        values = rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-130, 120, (rows, cols)))
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for offset in HALF_OFFSETS[qtype]:
        halves = rng.standard_normal(raw.shape[:-1]).astype(np.float16)
        halves[..., 0] = np.float16(6.1e-5) * np.float16(0.25)  # a subnormal scale too
        raw[..., offset:offset + 2] = halves[..., None].view(np.uint8).reshape(*raw.shape[:-1], 2)
    return raw.reshape(rows, -1)


def write_gguf(path, tensors, metadata=()):
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value, vtype in metadata:
        writer.add_key_value(key, value, vtype)
    for name, (data, qtype) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def dump(path, tmp_path):
    out = tmp_path / "dump.safetensors"
    result = subprocess.run([str(DUMP), str(path), str(out)], capture_output=True, text=True, timeout=120)
    return result, (read_safetensors(out) if result.returncode == 0 else None)


def test_dequantization_equals_gguf_bit_for_bit(tmp_path):
    rng = np.random.default_rng(15)
    tensors = {}
    for qtype in TYPES:
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        for rows, cols in [(3, max(block, 32) * 2), (1, 256 * 4)]:
            tensors[f"{qtype.name}.{rows}x{cols}"] = (random_blocks(rng, qtype, rows, cols), qtype)
    path = tmp_path / "quants.gguf"
    write_gguf(path, tensors)
    result, ours = dump(path, tmp_path)
    assert result.returncode == 0, result.stderr
    reader = gguf.GGUFReader(str(path))
    assert len(reader.tensors) == len(tensors)
    for t in reader.tensors:
        expected = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        expected = expected.reshape([int(d) for d in reversed(t.shape)])
        got = ours[t.name]
        assert got.shape == expected.shape, t.name
        assert np.isfinite(expected).all(), t.name
        differ = np.count_nonzero(got.view(np.uint32) != expected.view(np.uint32))
        assert differ == 0, f"{t.name}: {differ} of {got.size} values differ from gguf.quants.dequantize"


def test_metadata_of_every_type_equals_gguf_reader(tmp_path):
    V = gguf.GGUFValueType
    metadata = [("t.u8", 200, V.UINT8), ("t.i8", -100, V.INT8), ("t.u16", 60000, V.UINT16), ("t.i16", -30000, V.INT16),
                ("t.u32", 4_000_000_000, V.UINT32), ("t.i32", -2_000_000_000, V.INT32), ("t.f32", 0.1, V.FLOAT32),
                ("t.bool", True, V.BOOL), ("t.str", "héllo ✓", V.STRING), ("t.u64", 2**64 - 1, V.UINT64),
                ("t.i64", -2**63, V.INT64), ("t.f64", 1e-300, V.FLOAT64),
                ("t.ints", [1, -2, 3], V.ARRAY), ("t.strs", ["a", "", "ccc"], V.ARRAY),
                ("t.floats", [0.5, -1.25], V.ARRAY), ("t.nested", [[1, 2], [3]], V.ARRAY)]
    path = tmp_path / "meta.gguf"
    write_gguf(path, {"w": (np.ones((2, 32), np.float32), Q.F32)}, metadata)
    result, _ = dump(path, tmp_path)
    assert result.returncode == 0, result.stderr
    ours = json.loads(result.stdout)
    reader = gguf.GGUFReader(str(path))
    assert set(ours) == set(reader.fields) - {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}

    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        got = ours[key]
        assert got["type"] == int(field.types[0]), key
        if field.types[0] == V.ARRAY and len(field.types) > 1 and field.types[1] == V.ARRAY:
            assert got["value"] == [[1, 2], [3]], key  # gguf's reader does not decode nested arrays
            continue
        expected = field.contents()
        if field.types[-1] == V.STRING:
            encode = lambda s: list(s.encode())  # noqa: E731
            expected = [encode(s) for s in expected] if field.types[0] == V.ARRAY else encode(expected)
        if field.types[-1] in (V.FLOAT32,):
            expected = [float(np.float32(x)) for x in expected] if isinstance(expected, list) else float(np.float32(expected))
        assert got["value"] == expected, key
