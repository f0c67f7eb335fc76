"""Safetensors files as numpy arrays, for tests and device scripts (no torch needed)."""
import json
import pathlib
import struct

import numpy as np


def read_safetensors(path):
    """Any safetensors file as numpy arrays, bf16 widened to f32 (numpy has no bf16), F8_E4M3
    as its raw uint8 codes."""
    raw = pathlib.Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        data = raw[8 + n + begin:8 + n + end]
        if meta["dtype"] == "BF16":
            arr = (np.frombuffer(data, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(data, {"F32": np.float32, "I64": np.int64, "F16": np.float16, "F8_E4M3": np.uint8}[meta["dtype"]])
        out[name] = arr.reshape(meta["shape"])
    return out
