"""A stand-in for CuPy on NumPy, for tests/test_gpu_check.py: copied as ``cupy/__init__.py`` into
a folder put on ``PYTHONPATH`` of a child process, it makes that process take the GPU branches of
depsi and of scripts/gpu-check.sh on a machine without a GPU. Arrays are a NumPy subclass whose
module is ``cupy``; the device calls depsi makes (device count, memory, synchronise, the pool)
answer as one device with 8 GiB free. Never imported as ``cupy`` in the test process itself."""
import types

import numpy as _np

__version__ = "0.0.1"


class ndarray(_np.ndarray):
    def get(self):
        return _np.asarray(self)

    @property
    def device(self):
        return _Device(0)


ndarray.__module__ = "cupy"


def _wrap(value):
    if isinstance(value, _np.ndarray) and not isinstance(value, ndarray):
        return value.view(ndarray)
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    return value


def _function(func):
    def wrapped(*args, **kwargs):
        return _wrap(func(*args, **kwargs))
    return wrapped


class _Namespace(types.ModuleType):
    def __init__(self, name, base):
        super().__init__(name)
        self._base = base

    def __getattr__(self, name):
        value = getattr(self._base, name)
        if isinstance(value, types.ModuleType):
            return _Namespace(name, value)
        if callable(value) and not isinstance(value, (type, _np.ufunc)):
            return _function(value)
        return value


linalg = _Namespace("linalg", _np.linalg)
fft = _Namespace("fft", _np.fft)
random = _Namespace("random", _np.random)


def __getattr__(name):
    return getattr(_Namespace("cupy", _np), name)


def asarray(a, dtype=None, order=None):
    return _np.asarray(a, dtype=dtype, order=order).view(ndarray)


def asnumpy(a):
    return _np.asarray(a)


class _Device:
    def __init__(self, index=0):
        self.id = index

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass


class _Pool:
    def free_bytes(self):
        return 0

    def total_bytes(self):
        return 0

    def free_all_blocks(self):
        pass


_pool = _Pool()


def get_default_memory_pool():
    return _pool


cuda = types.SimpleNamespace(Device=_Device, runtime=types.SimpleNamespace(
    getDeviceCount=lambda: 1, memGetInfo=lambda: (8 * 2**30, 16 * 2**30),
    getDeviceProperties=lambda index: {"name": b"NumPy stand-in"}))
