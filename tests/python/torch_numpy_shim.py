"""The few torch calls hs_connectors' Mooncake *reader* makes, on numpy, for machines
without torch (PyPI has no CPU-only torch wheel; the default one needs CUDA's libraries).

hs_connectors imports torch at module level, but MooncakeHiddenStatesStore.get_sample only
allocates a uint8 host buffer, hands its address to Mooncake, slices it and reinterprets
the slices (view(dtype).view(shape).clone()). This shim does exactly that, so the reader's
own code (manifest version check, sizes, offsets, bounds, error marker) runs unchanged
against the real Mooncake client. bfloat16 and float8 views are raw bits (uint16/uint8):
the tests compare bytes. `install()` does nothing when real torch imports.
"""
import sys
import types

import numpy as np


class dtype:  # noqa: N801 - torch's name
    def __init__(self, name, np_dtype, floating):
        self.name, self.np, self.itemsize, self.is_floating_point = name, np.dtype(np_dtype), np.dtype(np_dtype).itemsize, floating

    def __repr__(self):
        return "torch." + self.name


class Size(tuple):
    def numel(self):
        return int(np.prod(self, dtype=np.int64))


class Tensor:
    def __init__(self, array, dt):
        self._a, self.dtype = array, dt

    @property
    def shape(self):
        return Size(self._a.shape)

    def numel(self):
        return int(self._a.size)

    def element_size(self):
        return self.dtype.itemsize

    def data_ptr(self):
        return self._a.ctypes.data

    def __getitem__(self, index):
        return Tensor(self._a[index], self.dtype)

    def view(self, *args):
        if len(args) == 1 and isinstance(args[0], dtype):
            return Tensor(self._a.view(args[0].np), args[0])
        shape = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
        return Tensor(self._a.reshape(tuple(shape)), self.dtype)

    def clone(self):
        return Tensor(self._a.copy(), self.dtype)

    def numpy(self):
        return self._a

    def is_floating_point(self):
        return self.dtype.is_floating_point


def _module():
    torch = types.ModuleType("torch")
    torch.__version__ = "0.0+numpy-shim"
    torch.__hsx_numpy_shim__ = True
    torch.dtype, torch.Size, torch.Tensor = dtype, Size, Tensor
    for name, np_dtype, floating in [
            ("float32", np.float32, True), ("float64", np.float64, True), ("float16", np.float16, True),
            ("bfloat16", np.uint16, True), ("float8_e4m3fn", np.uint8, True), ("complex64", np.complex64, True),
            ("int64", np.int64, False), ("int32", np.int32, False), ("int16", np.int16, False),
            ("int8", np.int8, False), ("uint8", np.uint8, False), ("bool", np.bool_, False)]:
        setattr(torch, name, dtype(name, np_dtype, floating))

    def empty(*size, dtype=None, pin_memory=False):  # noqa: ARG001 - no pinned memory here
        shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
        dt = dtype or torch.float32
        return Tensor(np.empty(tuple(shape), dt.np), dt)

    torch.empty = empty
    torch.device = lambda kind: kind
    torch.nn = types.SimpleNamespace(Module=object)
    torch.accelerator = types.SimpleNamespace(current_accelerator=lambda: None, is_available=lambda: False)
    return torch


def install():
    """Real torch if it imports, else this shim as `torch`. Returns which one."""
    try:
        import torch  # noqa: F401
        return "torch"
    except ImportError:
        sys.modules["torch"] = _module()
        return "numpy shim"


def forget():
    """Take the shim (and what imported it) out of sys.modules once the reader is imported:
    its modules keep the shim as their own `torch`, while the other tests' `import torch`
    (transformers' check, importorskip) see no torch again, as on this machine."""
    if getattr(sys.modules.get("torch"), "__hsx_numpy_shim__", False):
        for name in [n for n in sys.modules if n == "torch" or n.startswith(("torch.", "safetensors.torch", "hs_connectors"))]:
            del sys.modules[name]
