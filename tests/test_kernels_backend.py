"""Backend: array namespace choice, devices, batch sizes, host/device moves."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from depsi.kernels import backend
from depsi.kernels.backend import (
    Device,
    array_namespace,
    batch_size,
    configure_devices,
    cupy_available,
    get_devices,
    get_namespace,
    parse_device,
    to_device,
    to_host,
)

no_gpu = pytest.mark.skipif(cupy_available(), reason="needs a machine where CuPy does not work")


@pytest.fixture(autouse=True)
def _reset_devices():
    yield
    backend._configured = None


def test_numpy_solver_gives_numpy():
    assert get_namespace("numpy") is np


def test_unknown_solver_is_a_value_error():
    with pytest.raises(ValueError, match="solver"):
        get_namespace("jax")


@no_gpu
def test_cupy_solver_without_gpu_raises_with_reason():
    with pytest.raises(RuntimeError, match="solver 'cupy'.*cannot be used: .*CuPy"):
        get_namespace("cupy")


@no_gpu
def test_auto_solver_falls_back_to_numpy_and_logs(caplog):
    with caplog.at_level(logging.INFO, logger="depsi.kernels.backend"):
        assert get_namespace("auto") is np
    assert "using NumPy" in caplog.text


def test_array_namespace_of_numpy_arrays_is_numpy():
    assert array_namespace(np.zeros(2), None, np.ones(1)) is np


@pytest.mark.parametrize(("spec", "expected"), [
    ("cpu", Device("cpu", 0)), ("cpu:1", Device("cpu", 1)), ("CUDA:2", Device("cuda", 2)),
    ("gpu", Device("cuda", 0)), (3, Device("cuda", 3)), (Device("cpu", 4), Device("cpu", 4)),
])
def test_parse_device(spec, expected):
    assert parse_device(spec) == expected


@pytest.mark.parametrize("spec", ["tpu:0", "cpu:x", "cpu:-1"])
def test_parse_device_rejects_nonsense(spec):
    with pytest.raises(ValueError, match="device"):
        parse_device(spec)


def test_several_cpu_devices_are_allowed():
    devices = configure_devices(["cpu:0", "cpu:1", "cpu"])
    assert devices == [Device("cpu", 0), Device("cpu", 1), Device("cpu", 0)]
    assert get_devices() == devices


@no_gpu
def test_default_devices_are_the_cpu_without_gpu_and_logged(caplog):
    with caplog.at_level(logging.INFO, logger="depsi.kernels.backend"):
        assert configure_devices() == [Device("cpu", 0)]
    assert "cpu:0" in caplog.text


@no_gpu
def test_num_devices_without_gpu_gives_cpu_devices():
    assert configure_devices(num_devices=2) == [Device("cpu", 0), Device("cpu", 1)]


@no_gpu
def test_cuda_device_without_gpu_raises():
    with pytest.raises(RuntimeError, match="cupy"):
        configure_devices(["cuda:0"])


def test_devices_and_num_devices_together_is_an_error():
    with pytest.raises(ValueError, match="not both"):
        configure_devices(["cpu"], num_devices=1)


def test_batch_size_follows_free_memory(monkeypatch):
    monkeypatch.setattr(backend, "free_memory", lambda device=None: 1000)
    assert batch_size(10, "cpu") == 50  # safety 0.5
    assert batch_size(10, "cpu", safety=1.0, max_items=30) == 30
    assert batch_size(10**6, "cpu") == 1  # never zero


def test_batch_size_fit_cache_bounds_cpu_batches(monkeypatch):
    monkeypatch.setattr(backend, "free_memory", lambda device=None: 10**12)
    monkeypatch.setattr(backend, "cpu_cache_bytes", lambda: 1000)
    assert batch_size(10, "cpu", fit_cache=True) == 50
    assert batch_size(10, "cpu") == 5 * 10**10


def test_batch_size_rejects_bad_arguments():
    with pytest.raises(ValueError, match="bytes_per_item"):
        batch_size(0)
    with pytest.raises(ValueError, match="safety"):
        batch_size(1, safety=2.0)


def test_free_host_memory_is_positive():
    assert backend.free_memory("cpu") > 0


def test_to_device_cpu_and_to_host_round_trip():
    a = np.arange(3.0)
    assert to_device(a, "cpu") is a
    np.testing.assert_array_equal(to_host(to_device([1, 2], Device("cpu"))), [1, 2])


#: BLAS libraries loaded in this process that run one thread whatever they are asked (a
#: single-threaded OpenBLAS build, such as the one CVXOPT ships for CHOLMOD), by path: set by
#: :func:`three_blas_threads` in the main thread.
_SINGLE_THREADED_BUILDS: set[str] = set()


def _blas_threads() -> set[int]:
    """Threads of every BLAS library loaded in this process that can run more than one."""
    from threadpoolctl import threadpool_info

    return {info["num_threads"] for info in threadpool_info()
            if info["user_api"] == "blas" and info["filepath"] not in _SINGLE_THREADED_BUILDS}


@pytest.fixture
def three_blas_threads():
    """BLAS at 3 threads around the test, whatever the machine's cores: a limit of 1 and the
    restore are then told apart."""
    from threadpoolctl import threadpool_info, threadpool_limits

    with threadpool_limits(limits=3, user_api="blas"):
        _SINGLE_THREADED_BUILDS.update(info["filepath"] for info in threadpool_info()
                                       if info["user_api"] == "blas" and info["num_threads"] == 1)
        assert _blas_threads() == {3}
        yield


def test_single_threaded_blas_nests_decorates_and_restores(three_blas_threads):
    @backend.single_threaded_blas()
    def inside() -> set[int]:
        return _blas_threads()

    with backend.single_threaded_blas():
        assert _blas_threads() == {1}
        assert inside() == {1}
        assert _blas_threads() == {1}  # the inner exit did not restore
    assert _blas_threads() == {3}
    assert inside() == {1}
    assert _blas_threads() == {3}


def test_single_threaded_blas_holds_in_other_threads_and_they_leave_it(three_blas_threads):
    """The main thread's limit is what a worker thread's BLAS sees; a block entered and left in
    another thread (a Dask task calling a decorated step) neither sets nor restores it."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        with backend.single_threaded_blas():
            assert pool.submit(_blas_threads).result() == {1}
            inside = backend.single_threaded_blas()(_blas_threads)
            assert pool.submit(inside).result() == {1}
            assert _blas_threads() == {1}  # the other thread's exit did not restore
        assert _blas_threads() == {3}
        assert pool.submit(_blas_threads).result() == {3}



def test_registered_caps_bound_the_available_host_memory(monkeypatch):
    monkeypatch.setattr(backend, "_HOST_MEMORY_CAPS", [])
    backend.register_host_memory_cap(lambda: None)
    uncapped = backend.available_host_memory()
    assert uncapped > 10**6
    cap = lambda: 12345  # noqa: E731
    backend.register_host_memory_cap(cap)
    backend.register_host_memory_cap(cap)  # once
    assert backend._HOST_MEMORY_CAPS.count(cap) == 1
    assert backend.available_host_memory() == 12345
    assert batch_size(1000, "cpu") == 6  # half of 12345 bytes
