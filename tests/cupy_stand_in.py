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


# --- cupyx: the sparse matrices and triangular solves of depsi's device network solver --------
# (registered as the modules ``cupyx``, ``cupyx.scipy``, ``cupyx.scipy.linalg``,
# ``cupyx.scipy.sparse`` and ``cupyx.scipy.sparse.linalg`` when this stand-in is imported as
# ``cupy``, which depsi always does before ``cupyx``; SciPy underneath, and only the
# stand-in's arrays taken, so a device path that handed over host arrays would fail)


def _csr_matrix(matrix):
    """A copy of ``matrix`` whose arrays are the stand-in's (CuPy copies a SciPy matrix to
    the device)."""
    import scipy.sparse

    copy = scipy.sparse.csr_matrix(matrix, copy=True)
    copy.data, copy.indices, copy.indptr = (
        asarray(copy.data), asarray(copy.indices), asarray(copy.indptr))
    return copy


def _on_device(*arrays):
    if not all(isinstance(a, ndarray) for a in arrays):
        raise TypeError("cupyx stand-in: expected the stand-in's (device) arrays")


def _spsolve_triangular(A, b, lower=True, overwrite_A=False, overwrite_b=False,
                        unit_diagonal=False):
    import scipy.sparse.linalg

    _on_device(A.data, b)
    return _wrap(scipy.sparse.linalg.spsolve_triangular(
        A, _np.asarray(b), lower=lower, unit_diagonal=unit_diagonal))


def _solve_triangular(a, b, trans=0, lower=False, unit_diagonal=False, overwrite_b=False,
                      check_finite=False):
    import scipy.linalg

    _on_device(a, b)
    return _wrap(scipy.linalg.solve_triangular(_np.asarray(a), _np.asarray(b), trans=trans,
                                               lower=lower, unit_diagonal=unit_diagonal))


def _register_cupyx():
    import sys

    names = ("cupyx", "cupyx.scipy", "cupyx.scipy.linalg", "cupyx.scipy.sparse",
             "cupyx.scipy.sparse.linalg")
    modules = {name: types.ModuleType(name) for name in names}
    for name in names[1:]:
        parent, _, child = name.rpartition(".")
        setattr(modules[parent], child, modules[name])
    modules["cupyx.scipy.linalg"].solve_triangular = _solve_triangular
    modules["cupyx.scipy.sparse"].csr_matrix = _csr_matrix
    modules["cupyx.scipy.sparse.linalg"].spsolve_triangular = _spsolve_triangular
    for name, module in modules.items():
        sys.modules.setdefault(name, module)


_register_cupyx()
