"""Writes the E4M3 conversion goldens of tests/test_float8.cpp from ml_dtypes (the float8
types JAX and TensorFlow use; torch.float8_e4m3fn agrees): every value's byte when cast
from f32 with round-to-nearest-even. ml_dtypes turns out-of-range values into NaN where
hsx (and CUDA's SATFINITE conversion) saturate to +-448, so the values stay within range.

  python3 tests/data/fp8/make_e4m3_golden.py tests/data/fp8
"""
import sys

import ml_dtypes
import numpy as np

out = sys.argv[1]
rng = np.random.default_rng(0)
codes = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
finite = np.sort(np.unique(codes.astype(np.float32)[np.isfinite(codes.astype(np.float32))]))
mids = (finite[:-1] + finite[1:]) / 2  # exact ties: round to the even code
values = np.concatenate([
    finite,
    mids,
    np.nextafter(mids, np.float32(np.inf)),
    np.nextafter(mids, np.float32(-np.inf)),
    np.exp2(rng.uniform(-14, np.log2(448), 4000)).astype(np.float32) * rng.choice([-1, 1], 4000),
    rng.normal(0, 1, 2000).astype(np.float32),
    np.float32([0.0, -0.0, 2.0**-10, 2.0**-11, 3 * 2.0**-11, 2.0**-20, 448.0, -448.0]),
]).astype(np.float32)
values = values[np.abs(values) <= 448]
encoded = values.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
values.tofile(f"{out}/e4m3_values.f32")
encoded.tofile(f"{out}/e4m3_encoded.u8")
print(len(values), "values")
